-- billing_daily_cap_over: the first policy daily cap that the spend today goes over, after a debit.
--
-- p_policy_ids[i] caps the spend today of p_wallet_ids[i] at p_limits[i] (a policy bundle's
-- max_daily_credits and the wallet whose spend it caps: permits_policy_verdict's cap rows). Called after billing_debit, in its transaction: the
-- spend read includes the debit just posted, and each wallet named is one the debit locked (the
-- charged wallet or an agent ancestor of it), so concurrent debits are counted one after the other
-- and cannot pass a cap together. Answers the first cap gone over (the policy, the spend today with
-- the debit, the cap), or NULLs. Spend today: the wallet's hourly spend buckets since midnight UTC,
-- which count the wallet's subtree (billing_debit). Empty or NULL arrays: NULLs.
--
-- Reads only p_tenant_id's buckets. Used by billing_charge (POST /v1/billing/charge) and gateway_claim (the governed call's phase 1).
CREATE OR REPLACE FUNCTION billing_daily_cap_over(
    p_tenant_id text, p_policy_ids text[], p_wallet_ids text[], p_limits numeric[], p_now timestamptz,
    OUT policy_id text, OUT spent numeric, OUT cap numeric
)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    FOR i IN 1 .. COALESCE(array_length(p_policy_ids, 1), 0) LOOP
        SELECT COALESCE(sum(b.amount), 0) INTO spent FROM billing_spend_bucket b
         WHERE b.wallet_id = p_wallet_ids[i] AND b.tenant_id = p_tenant_id
           AND b.hour >= date_trunc('day', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
        IF spent > p_limits[i] THEN
            policy_id := p_policy_ids[i]; cap := p_limits[i];
            RETURN;
        END IF;
    END LOOP;
    spent := NULL;
END;
$$;
