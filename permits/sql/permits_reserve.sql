-- permits_reserve: take credits and one call from a permit's allowance, or refuse. The one copy of the rule.
--
-- One conditional UPDATE: it succeeds only while the permit is active, unexpired
-- (p_now), and its allowance covers the reservation (spent + amount <= max_credits,
-- calls_used < max_calls when calls are limited), so concurrent reservations can
-- never spend past the allowance: each waits for the row lock, then re-reads the
-- row. Returns whether it reserved.
--
-- The permit it reserves on must be the one that was checked. Authorization verifies
-- the permit's signed statement and compares every column it reads with it (the
-- wallet, the tenant, the subject key, the tools, the allowance, the call limit and
-- the expiry) before the reservation, sometimes on a row it read or cached earlier;
-- the caller passes the columns it verified and the signature, and the UPDATE also
-- requires the row to still carry exactly those, so a column edited after the check
-- refuses instead of widening the permit. NULL p_signature skips that comparison
-- (callers that hold no verified statement).
--
-- p_tenant_id is the permit's tenant: a permit of another tenant is never reserved on (its row
-- is not touched).
--
-- Callers: the governed call's claim (gateway_claim) and permits.services.permits.permit_reserve.
-- Lock order: callers take it after the wallet rows (the debit) and before the chain head.
CREATE OR REPLACE FUNCTION permits_reserve(
    p_tenant_id text,
    p_permit_id text,
    p_amount numeric,
    p_now timestamptz,
    p_signature text DEFAULT NULL,
    p_wallet_id text DEFAULT NULL,
    p_subject_key_id text DEFAULT NULL,
    p_allowed_tools jsonb DEFAULT NULL,
    p_max_credits numeric DEFAULT NULL,
    p_max_calls integer DEFAULT NULL,
    p_expires_at timestamptz DEFAULT NULL
)
RETURNS boolean
LANGUAGE sql AS $$
    WITH reserved AS (
        UPDATE permits_permit SET spent_credits = spent_credits + p_amount, calls_used = calls_used + 1
         WHERE permit_id = p_permit_id AND tenant_id = p_tenant_id AND status = 'active' AND expires_at > p_now
           AND spent_credits <= max_credits - p_amount AND (max_calls IS NULL OR calls_used < max_calls)
           AND (p_signature IS NULL OR (signature = p_signature AND wallet_id = p_wallet_id
                                        AND subject_key_id IS NOT DISTINCT FROM p_subject_key_id
                                        AND allowed_tools = p_allowed_tools AND max_credits = p_max_credits
                                        AND max_calls IS NOT DISTINCT FROM p_max_calls
                                        AND expires_at = p_expires_at))
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM reserved);
$$;

-- permits_reserve_in: permits_reserve for a reservation passed as one record, permits' reservation shape.
--
-- p_reservation is the JSON object permits.services.permits.permit_reservation_record builds (the one
-- constructor of the shape): permit_id, amount, now, and the columns authorization verified against
-- the signed statement (signature, wallet_id, subject_key_id, allowed_tools, max_credits, max_calls,
-- expires_at); amounts as decimal strings, times in ISO 8601. Other apps' database functions
-- (gateway_claim) reserve with this, never with permits_reserve's positional arguments.
CREATE OR REPLACE FUNCTION permits_reserve_in(p_tenant_id text, p_reservation jsonb)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT permits_reserve(
        p_tenant_id, p_reservation->>'permit_id', (p_reservation->>'amount')::numeric,
        (p_reservation->>'now')::timestamptz, p_reservation->>'signature', p_reservation->>'wallet_id',
        p_reservation->>'subject_key_id', p_reservation->'allowed_tools', (p_reservation->>'max_credits')::numeric,
        (p_reservation->>'max_calls')::integer, (p_reservation->>'expires_at')::timestamptz
    );
$$;
