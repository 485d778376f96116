-- permits_reserve: take credits and one call from a permit's allowance, or refuse. The one copy of the rule.
--
-- One conditional UPDATE: it succeeds only while the permit is active, unexpired
-- (p_now), and its allowance covers the reservation (spent + amount <= max_credits,
-- calls_used < max_calls when calls are limited), so concurrent reservations can
-- never spend past the allowance: each waits for the row lock, then re-reads the
-- row. Returns whether it reserved.
--
-- The limits it enforces must be the signed ones. Authorization verifies the
-- permit's signed statement and compares its columns before the reservation; the
-- caller passes what it verified (the allowance, the call limit, the expiry and
-- the signature) and the UPDATE also requires the row to still carry exactly
-- those, so a column edited between the check and the reservation refuses instead
-- of widening the allowance. NULL p_signature skips that comparison (callers
-- that hold no verified statement).
--
-- Callers: the governed call's claim (gateway_claim) and permits.services.permit_reserve.
-- Lock order: callers take it after the wallet rows (the debit) and before the chain head.
CREATE OR REPLACE FUNCTION permits_reserve(
    p_permit_id text,
    p_amount numeric,
    p_now timestamptz,
    p_max_credits numeric DEFAULT NULL,
    p_max_calls integer DEFAULT NULL,
    p_expires_at timestamptz DEFAULT NULL,
    p_signature text DEFAULT NULL
)
RETURNS boolean
LANGUAGE sql AS $$
    WITH reserved AS (
        UPDATE permits_permit SET spent_credits = spent_credits + p_amount, calls_used = calls_used + 1
         WHERE permit_id = p_permit_id AND status = 'active' AND expires_at > p_now
           AND spent_credits <= max_credits - p_amount AND (max_calls IS NULL OR calls_used < max_calls)
           AND (p_signature IS NULL OR (signature = p_signature AND max_credits = p_max_credits
                                        AND max_calls IS NOT DISTINCT FROM p_max_calls
                                        AND expires_at = p_expires_at))
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM reserved);
$$;
