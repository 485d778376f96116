-- billing_wallet_may_spend: the wallet-status rule, its only copy.
--
-- A wallet spends (is charged, funds a child, has a child created under it) only while it is active
-- and unexpired and so is every ancestor: a freeze, an expiry or a close covers the subtree.
-- Answers code NULL when p_wallet_id may spend at p_now, else the refusal, naming the wallet that
-- refuses: the wallet's own status first (wallet_closed, wallet_frozen with its frozen_reason as
-- refusal_reason, wallet_expired), then the highest ancestor that is not active or has expired;
-- 'not_found' when p_wallet_id is not a wallet of p_tenant_id. Reads only p_tenant_id's rows.
--
-- Callers: billing_debit (under the wallet's lock: the row it reads is the locked one) and
-- billing.services.ledger (free tool calls, funding, creating a wallet), which map the code to the
-- exception (billing.refusals).
CREATE OR REPLACE FUNCTION billing_wallet_may_spend(
    p_tenant_id text,
    p_wallet_id text,
    p_now timestamptz,
    OUT code text,            -- NULL, not_found, wallet_closed, wallet_frozen, wallet_expired
    OUT subject_id text,      -- the wallet that refuses
    OUT refusal_reason text   -- wallet_frozen: the frozen_reason
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    w billing_wallet;
    path_ids text[];
BEGIN
    SELECT * INTO w FROM billing_wallet WHERE wallet_id = p_wallet_id AND tenant_id = p_tenant_id;
    IF NOT FOUND THEN
        code := 'not_found'; subject_id := p_wallet_id; RETURN;
    END IF;
    path_ids := string_to_array(w.path, '/');
    IF w.status = 'active' AND (w.expires_at IS NULL OR w.expires_at > p_now) THEN
        SELECT * INTO w FROM billing_wallet
         WHERE wallet_id = ANY(path_ids[1:cardinality(path_ids) - 1]) AND tenant_id = p_tenant_id
           AND (status <> 'active' OR expires_at <= p_now)
         ORDER BY path LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    subject_id := w.wallet_id;
    IF w.status = 'closed' THEN code := 'wallet_closed';
    ELSIF w.status = 'frozen' THEN code := 'wallet_frozen'; refusal_reason := w.frozen_reason;
    ELSE code := 'wallet_expired';
    END IF;
END;
$$;
