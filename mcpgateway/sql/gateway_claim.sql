-- gateway_claim: phase 1 of the governed call after authorization, in one statement.
--
-- The caller (mcpgateway.services.claim._phase1) has read the permit, the quote and the
-- policies, verified the signed statements and decided the authorization; what
-- moves money and claims the dispatch is this one call, sent in autocommit: the
-- statement is its own transaction, so nothing is held across a round trip and
-- every lock is released when PostgreSQL commits it. In the lock order of every
-- transaction that moves a wallet's money (docs/decisions.md, "Lock order"):
--
-- 1. the action row, inserted already 'dispatch_claimed' (p_action: the row as
--    JSON, column by column). A concurrent request with the same (wallet,
--    idempotency key) waits on the unique index, then fails with unique_violation
--    (23505): the caller answers it as a replay or "in progress";
-- 2. the quote, when the call has one (permits_quote_consume: once, at the
--    verified price);
-- 3. the debit, when the call has a price (billing_debit: the agent ancestors, the
--    refill parent, the wallet; every spend rule);
-- 3a. the daily caps of the policies that allowed the call (y_: each policy, the wallet whose spend
--    today it caps, the cap; permits.services.authorization.daily_cap_wallet), checked again after
--    the debit: that wallet is the charged wallet or one of its agent ancestors, all locked by
--    billing_debit and all counting the debit in their spend bucket, so concurrent calls cannot
--    pass a cap together (billing_daily_cap_over; 'policy_daily_cap', the policy as subject_id, the
--    spend before this call as figure). Empty or NULL arrays: no cap;
-- 4. the reservation on the permit (permits_reserve, requiring the row to still
--    carry the signed columns and the signature the caller verified);
-- 5. the audit event 'tool_call.dispatch_claimed' (audit_append: the tenant's
--    chain head, last).
--
-- The tool, its list price and the policies of the wallet's line must still be what the call
-- was decided on, whether it was authorized from the process's cache (mcpgateway.services.lookup,
-- "cached") or from rows read for it a moment before: c_tool_version (gateway_tool_version),
-- c_price and c_policies_version (permits_policies_version of c_ancestry) are compared
-- before anything is written, and any difference refuses with 'stale' (the caller reads
-- the rows afresh and decides again). NULLs skip these comparisons.
--
-- When the caller authenticated the API key from its process cache, it deferred the key's
-- rate-limit charge to here (billing.ratelimit, "deferred"): k_key_id names the key,
-- k_secret_hash is the SHA-256 of the secret presented. First of all, the key must still be
-- active with that secret and belong to the action's wallet (else 'stale': the caller charges
-- the request as the rate limiter does, reading the key afresh), and one unit is added to the
-- key's window (k_window_index), both by billing_rate_limit_key_charge, refusing with
-- 'rate_limited' beyond k_limit; rate_count is the window's count after the charge. A refusal rolls the charge back with everything else,
-- and the caller charges the request again on the rate limiter's own path. NULLs skip this.
--
-- Answers billing_debit's columns (code 'ok'; the debit's figures when there was
-- one). A refusal raises SQLSTATE P0T01 with the code as the message's last word
-- and the answer's columns as JSON in DETAIL (codes: 'stale', the debit's refusals,
-- 'quote_unavailable', 'policy_daily_cap', 'permit_refused'), so the statement, and with it everything
-- written before the refusal, is rolled back; the caller maps the code to its
-- exception and records the denial in a transaction of its own.
-- Database functions are called as assignments (``x := f(...)``), not with PERFORM or SELECT INTO:
-- see billing/sql/billing_charge.sql.
CREATE OR REPLACE FUNCTION gateway_claim(
    p_action jsonb,
    q_quote_id text, q_credits numeric, q_signature text,
    p_debit boolean,
    d_wallet_id text, d_amount numeric, d_now timestamptz, d_category text, d_units numeric,
    d_description text, d_request_path text, d_correlation_id text, d_ids text[],
    d_hour_limit numeric, d_day_limit numeric,
    r_permit_id text, r_price numeric, r_now timestamptz, r_signature text, r_tenant_id text, r_wallet_id text,
    r_subject_key_id text, r_allowed_tools jsonb, r_max_credits numeric, r_max_calls integer, r_expires_at timestamptz,
    a_chain text, a_event_id text, a_event text, a_tenant_id text, a_wallet_id text, a_key_id text,
    a_tool text, a_endpoint text, a_policy_decision_id text, a_request_id text, a_ok boolean,
    a_detail jsonb, a_created_at timestamptz, a_prefix bytea, a_suffix bytea,
    c_tool_version text, c_price numeric, c_ancestry text[], c_policies_version text,
    k_key_id text, k_secret_hash text, k_window_index bigint, k_limit integer,
    y_policy_ids text[], y_wallet_ids text[], y_limits numeric[],
    OUT code text, OUT subject_id text, OUT wallet_tenant text, OUT new_balance numeric,
    OUT daily_spent numeric, OUT refilled numeric, OUT refill_parent text, OUT figure numeric,
    OUT figure_limit numeric, OUT spend_window text, OUT refusal_reason text, OUT rate_count integer
)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    appended record;  -- audit_append's answer, unused
    over record;      -- billing_daily_cap_over's answer
BEGIN
    IF k_key_id IS NOT NULL THEN
        rate_count := billing_rate_limit_key_charge(k_key_id, k_secret_hash, k_window_index, p_action->>'wallet_id');
        IF rate_count IS NULL THEN
            code := 'stale';
            RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
                DETAIL = jsonb_build_object('code', code)::text;
        END IF;
        IF rate_count > k_limit THEN
            code := 'rate_limited';
            RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
                DETAIL = jsonb_build_object('code', code)::text;
        END IF;
    END IF;

    IF (c_tool_version IS NOT NULL
        AND (gateway_tool_version(p_action->>'tool') IS DISTINCT FROM c_tool_version
             OR NOT EXISTS (SELECT 1 FROM billing_tool_price pr WHERE pr.tool = p_action->>'tool' AND pr.credits = c_price)))
       OR (c_policies_version IS NOT NULL AND permits_policies_version(c_ancestry) IS DISTINCT FROM c_policies_version) THEN
        code := 'stale';
        RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
            DETAIL = jsonb_build_object('code', code)::text;
    END IF;

    INSERT INTO mcpgateway_action SELECT * FROM jsonb_populate_record(NULL::mcpgateway_action, p_action);

    IF q_quote_id <> '' AND NOT permits_quote_consume(q_quote_id, p_action->>'wallet_id', p_action->>'tool',
                                                      q_credits, q_signature, p_action->>'action_id', r_now) THEN
        code := 'quote_unavailable'; subject_id := q_quote_id;
        RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
            DETAIL = jsonb_build_object('code', code, 'subject_id', subject_id)::text;
    END IF;

    IF p_debit THEN
        d := billing_debit(d_wallet_id, d_amount, d_now, d_category, d_units, d_description,
                           d_request_path, d_correlation_id, d_ids, d_hour_limit, d_day_limit, NULL);
        IF d.code <> 'ok' THEN
            RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || d.code,
                DETAIL = to_jsonb(d)::text;
        END IF;
        code := d.code; subject_id := d.subject_id; wallet_tenant := d.wallet_tenant;
        new_balance := d.new_balance; daily_spent := d.daily_spent; refilled := d.refilled;
        refill_parent := d.refill_parent;
        -- The policies' daily caps, with this debit counted and under the locks it took (3a above).
        IF y_policy_ids IS NOT NULL THEN
            over := billing_daily_cap_over(y_policy_ids, y_wallet_ids, y_limits, d_now);
            IF over.policy_id IS NOT NULL THEN
                code := 'policy_daily_cap'; subject_id := over.policy_id;
                RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
                    DETAIL = jsonb_build_object('code', code, 'subject_id', subject_id, 'figure', over.spent - d_amount,
                                                'figure_limit', over.cap)::text;
            END IF;
        END IF;
    END IF;

    IF NOT permits_reserve(r_permit_id, r_price, r_now, r_signature, r_tenant_id, r_wallet_id, r_subject_key_id,
                           r_allowed_tools, r_max_credits, r_max_calls, r_expires_at) THEN
        code := 'permit_refused'; subject_id := r_permit_id;
        RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
            DETAIL = jsonb_build_object('code', code, 'subject_id', subject_id)::text;
    END IF;

    appended := audit_append(a_chain, a_event_id, a_event, a_tenant_id, a_wallet_id, a_key_id, a_tool, a_endpoint,
                             a_policy_decision_id, a_request_id, a_ok, a_detail, a_created_at, a_prefix, a_suffix);
    code := 'ok';
END;
$$;
