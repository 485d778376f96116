-- gateway_claim: phase 1 of the governed call after authorization, in one statement.
--
-- The caller (mcpgateway.services.claim._phase1) has read the permit, the quote and the
-- policies' verdict (permits_policy_verdict), verified the signed statements and decided the authorization; what
-- moves money and claims the dispatch is this one call, sent in autocommit: the
-- statement is its own transaction, so nothing is held across a round trip and
-- every lock is released when PostgreSQL commits it. In the lock order of every
-- transaction that moves a wallet's money (docs/decisions.md, "Lock order"):
--
-- 1. the action row, inserted already 'dispatch_claimed' (p_action: the row as
--    JSON, column by column). A concurrent request with the same (wallet,
--    idempotency key) waits on the unique index, then fails with unique_violation
--    (23505): the caller answers it as a replay or "in progress";
-- 2. the quote, when the call has one (permits_quote_consume_in: once, at the
--    verified price);
-- 3. the debit, when the call has a price (billing_debit_in: the agent ancestors, the
--    refill parent, the wallet; every spend rule);
-- 3a. the daily caps of the policies that allowed the call (p_caps: each policy, the wallet whose spend
--    today it caps, the cap; permits_policy_verdict's cap rows), checked once, after
--    the debit: that wallet is the charged wallet or one of its agent ancestors, all locked by
--    billing_debit and all counting the debit in their spend bucket, so concurrent calls cannot
--    pass a cap together (billing_daily_cap_over; 'policy_daily_cap', the policy as subject_id, the
--    spend before this call as figure). NULL: no cap;
-- 4. the reservation on the permit (permits_reserve_in, requiring the row to still
--    carry the signed columns and the signature the caller verified);
-- 5. the audit event 'tool_call.dispatch_claimed' (audit_append_in: the tenant's
--    chain head, last).
--
-- Each app passes what it owns as one named record (jsonb), built by that app's one constructor and
-- read by that app's function (docs/decisions.md, "Records between apps"): billing's debit
-- (billing.services.ledger.DebitCall.record), audit's event (audit.services.PreparedEvent.record_in),
-- permits' reservation and quote consumption (permits.services). p_tenant_id is the action's
-- tenant: every function called gets it and touches only its rows; an action of another tenant
-- is refused (SQLSTATE TGTN1).
--
-- The tool, its list price and the policies of the wallet's line must still be what the call
-- was decided on, whether it was authorized from the process's cache (mcpgateway.services.lookup,
-- "cached") or from rows read for it a moment before: p_cached's tool_version (gateway_tool_version),
-- price and policies_version (permits_policies_version of its ancestry) are compared
-- before anything is written, and any difference refuses with 'stale' (the caller reads
-- the rows afresh and decides again). NULLs skip these comparisons.
--
-- When the caller authenticated the API key from its process cache, it deferred the key's
-- rate-limit charge to here (billing.ratelimit, "deferred"): p_rate's key_id names the key,
-- secret_hash is the SHA-256 of the secret presented. First of all, the key must still be
-- active with that secret and belong to the action's wallet (else 'stale': the caller charges
-- the request as the rate limiter does, reading the key afresh), and one unit is added to the
-- key's window (window_index), both by billing_rate_limit_key_charge, refusing with
-- 'rate_limited' beyond limit; rate_count is the window's count after the charge. A refusal rolls the charge back with everything else,
-- and the caller charges the request again on the rate limiter's own path. NULLs skip this.
--
-- Answers billing_debit's columns (code 'ok'; the debit's figures when there was
-- one). A refusal raises SQLSTATE P0T01 with the code as the message's last word
-- and the answer's columns as JSON in DETAIL (codes: 'stale', the debit's refusals,
-- 'quote_unavailable', 'policy_daily_cap', 'permit_refused'), so the statement, and with it everything
-- written before the refusal, is rolled back; the caller maps the code to its
-- exception (common.refusals, the one map of refusal codes, into which billing and permits register
-- theirs; 'stale' and 'rate_limited' are not refusals: the caller decides again on fresh rows) and
-- records the denial in a transaction of its own.
-- Database functions are called as assignments (``x := f(...)``), not with PERFORM or SELECT INTO:
-- see billing/sql/billing_charge.sql.
CREATE OR REPLACE FUNCTION gateway_claim(
    p_tenant_id text,
    p_action jsonb,
    p_quote jsonb,        -- permits' quote consumption (permits_quote_consume_in); NULL: no quote
    p_debit jsonb,        -- billing's debit_in (billing_debit_in); NULL: a free call
    p_reservation jsonb,  -- permits' reservation (permits_reserve_in)
    p_event jsonb,        -- audit's audit_event_in (audit_append_in)
    p_cached jsonb,       -- what the call was decided on: tool, tool_version, price, ancestry, policies_version
    p_rate jsonb,         -- the deferred rate-limit charge: key_id, secret_hash, window_index, limit; NULL: none
    p_caps jsonb,         -- the policies' daily caps (permits' DailyCap): [{policy_id, wallet_id, limit}]; NULL: none
    OUT code text, OUT subject_id text, OUT wallet_tenant text, OUT new_balance numeric,
    OUT daily_spent numeric, OUT refilled numeric, OUT refill_parent text, OUT figure numeric,
    OUT figure_limit numeric, OUT spend_window text, OUT refusal_reason text, OUT rate_count integer
)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    appended record;  -- audit_append_in's answer, unused
    over record;      -- billing_daily_cap_over's answer
    wallet_id_ text := p_action->>'wallet_id';
BEGIN
    IF p_action->>'tenant_id' IS DISTINCT FROM p_tenant_id THEN
        RAISE EXCEPTION 'gateway_claim: the action is not of tenant %', p_tenant_id USING ERRCODE = 'TGTN1';
    END IF;
    IF p_rate IS NOT NULL THEN
        rate_count := billing_rate_limit_key_charge(p_rate->>'key_id', p_rate->>'secret_hash',
                                                    (p_rate->>'window_index')::bigint, wallet_id_);
        IF rate_count IS NULL THEN
            code := 'stale';
            RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
                DETAIL = jsonb_build_object('code', code)::text;
        END IF;
        IF rate_count > (p_rate->>'limit')::integer THEN
            code := 'rate_limited';
            RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
                DETAIL = jsonb_build_object('code', code)::text;
        END IF;
    END IF;

    IF (p_cached->>'tool_version' IS NOT NULL
        AND (gateway_tool_version(p_action->>'tool') IS DISTINCT FROM p_cached->>'tool_version'
             OR NOT EXISTS (SELECT 1 FROM billing_tool_price pr
                             WHERE pr.tool = p_action->>'tool' AND pr.credits = (p_cached->>'price')::numeric)))
       OR (p_cached->>'policies_version' IS NOT NULL
           AND permits_policies_version(ARRAY(SELECT jsonb_array_elements_text(p_cached->'ancestry')))
               IS DISTINCT FROM p_cached->>'policies_version') THEN
        code := 'stale';
        RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
            DETAIL = jsonb_build_object('code', code)::text;
    END IF;

    INSERT INTO mcpgateway_action SELECT * FROM jsonb_populate_record(NULL::mcpgateway_action, p_action);

    IF p_quote IS NOT NULL AND NOT permits_quote_consume_in(p_tenant_id, p_quote) THEN
        code := 'quote_unavailable'; subject_id := p_quote->>'quote_id';
        RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
            DETAIL = jsonb_build_object('code', code, 'subject_id', subject_id)::text;
    END IF;

    IF p_debit IS NOT NULL THEN
        d := billing_debit_in(p_tenant_id, p_debit);
        IF d.code <> 'ok' THEN
            RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || d.code,
                DETAIL = to_jsonb(d)::text;
        END IF;
        code := d.code; subject_id := d.subject_id; wallet_tenant := d.wallet_tenant;
        new_balance := d.new_balance; daily_spent := d.daily_spent; refilled := d.refilled;
        refill_parent := d.refill_parent;
        -- The policies' daily caps, with this debit counted and under the locks it took (3a above).
        IF p_caps IS NOT NULL THEN
            over := billing_daily_cap_over(
                p_tenant_id,
                ARRAY(SELECT c->>'policy_id' FROM jsonb_array_elements(p_caps) c),
                ARRAY(SELECT c->>'wallet_id' FROM jsonb_array_elements(p_caps) c),
                ARRAY(SELECT (c->>'limit')::numeric FROM jsonb_array_elements(p_caps) c),
                (p_debit->>'now')::timestamptz
            );
            IF over.policy_id IS NOT NULL THEN
                code := 'policy_daily_cap'; subject_id := over.policy_id;
                RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
                    DETAIL = jsonb_build_object('code', code, 'subject_id', subject_id,
                                                'figure', over.spent - (p_debit->>'amount')::numeric,
                                                'figure_limit', over.cap)::text;
            END IF;
        END IF;
    END IF;

    IF NOT permits_reserve_in(p_tenant_id, p_reservation) THEN
        code := 'permit_refused'; subject_id := p_reservation->>'permit_id';
        RAISE EXCEPTION USING ERRCODE = 'P0T01', MESSAGE = 'gateway_claim refused: ' || code,
            DETAIL = jsonb_build_object('code', code, 'subject_id', subject_id)::text;
    END IF;

    appended := audit_append_in(p_tenant_id, p_event);
    code := 'ok';
END;
$$;
