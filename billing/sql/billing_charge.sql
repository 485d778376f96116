-- billing_charge: POST /v1/billing/charge as one statement (billing.services.wallet_charge).
--
-- Guarantees, in one call, which in autocommit is one transaction:
--
-- 1. Reach. The wallet is a wallet of p_tenant_id (else code 'not_found': this function and
--    those it calls read and write only p_tenant_id's rows) and, when p_reach_wallet_id is given
--    (a wallet key), has p_reach_wallet_id on its path, i.e. it is the key's wallet or below it
--    (else 'access_denied'; billing.selectors.wallet_in_reach). Without p_reach_wallet_id the
--    caller has checked access.
-- 2. Idempotency, as billing.services did it in Python: with p_idempotency_key, a stored record
--    of (wallet, key) answers before any lock: 'idempotency_key_reused' when its request hash
--    differs from p_request_hash, 'idempotency_key_in_progress' when it holds no response yet,
--    else 'replay' with the stored status and body (billing_charge_replay, below). A record that
--    commits while this call waits for the wallet's lock is found by billing_debit ('replay') and
--    answered the same way, by the same function.
-- 3. Price. Credits per unit from billing_service_price, else p_default_price (the built-in
--    price; NULL: 'unknown_category'); amount = round(price * units, 8), the half-up rounding of
--    billing.services.to_money ('amount_too_small' when it is zero). Prices are read in the
--    statement that uses them, so a price change applies from the next charge on.
-- 4. Policies. The enabled policy bundles of the wallet's line, judged by permits_policy_verdict (the
--    one judge of their rules, the governed call's too; a charge has no tool, so neither the tool rules
--    nor allowed_servers bind it) refuse a charge whose category is not in their allowed_categories
--    or whose amount is over their max_credits_per_call before anything is locked: code
--    'policy_denied', the bundle as subject_id, the rule as spend_window, the limit as
--    figure_limit. Their max_daily_credits are checked after the debit, under its locks
--    (billing_daily_cap_over): a charge that takes a capped spend today over its cap is undone
--    (the debit then runs in a block with its own savepoint, entered only when a cap applies) and
--    refused the same way, with the spend today before it as figure and the wallet whose spend
--    the cap counts as refusal_reason.
-- 5. The debit: billing_debit (billing/sql/billing_debit.sql), the only copy of the spend rules. Its
--    refusals come back as its codes with nothing written, so a refused charge leaves no
--    idempotency record (the key is not burnt) and no event. The velocity freeze is the
--    caller's second transaction.
-- 6. On success, the rows Python wrote before, with the same contents: the idempotency record
--    (request hash, status 200, the response body) and the audit events ledger.refill (when a
--    refill was posted) and ledger.charge, appended by audit_append in that order.
--
-- 0. The deferred rate-limit charge (billing.ratelimit, "deferred"): when the caller took the API key
--    from its process cache, k_key_id names it and k_secret_hash is the SHA-256 of the secret
--    presented. First of all the key must still be active with that secret (else 'key_stale',
--    nothing written: the caller charges the request on the rate limiter's path, reading the key
--    afresh, and charges again without this); then one unit is added to the key's window
--    (k_window_index), both by billing_rate_limit_key_charge, and past k_limit the answer is
--    'rate_limited' with the unit kept (a refused request counts, as at a request's start). Every other answer keeps the unit too: each request
--    is counted once, whatever it is answered. rate_count is the window's count after the charge.
--    The window row is the first lock this function takes; a batch (below) has the charges of one
--    key in one window only (billing.services.charge._batch_group), so a later charge of it locks
--    no new window row. NULLs skip this.
--
-- Figures known only after the debit. Python prepares everything else (ids, time, request hash,
-- the events' canonical bytes, the body's other fields); this function adds the figures in forms
-- that are canonical by construction, so no second JSON encoder exists here:
--   * decimals as JSON strings round(x, 8)::text: digits, an optional '-' and exactly 8 places,
--     the text billing.exceptions.money() writes for the same value;
--   * the refill's parent wallet id as to_json(id)::text: an id is [A-Za-z0-9_], which JSON
--     writes as itself between quotes.
-- An event's canonical bytes come split: p_*_parts = the bytes before the seq, cut at each late
-- value in key order, then the bytes after the seq (audit_append's p_suffix). Late values:
--   ledger.charge: detail.amount (-amount), detail.balance_after
--   ledger.refill: detail.amount, detail.balance_after, detail.counterparty (the parent)
-- and the stored detail is p_*_detail plus the same keys with the same values, so verify-chain
-- recomputes the hash the append computed. tests/test_billing_charge_fn.py proves the bytes equal
-- Python's canonical encoding of the stored event across values.
--
-- The refill event is optional: preparing it costs Python CPU on every charge and refills are
-- rare. A refill posted without p_refill_parts raises SQLSTATE 'TGRF1', so the statement rolls
-- back whole and the caller repeats it with the event prepared (inside a transaction the caller
-- holds, it prepares the event from the start instead).
--
-- Lock order (docs/decisions.md, "Lock order"): none before billing_debit, which locks the agent
-- ancestors and the refill parent top down, then the wallet; then the idempotency record's unique
-- index entry; the audit chain head last (audit_append). In autocommit every lock is released
-- when this statement's transaction commits on the server.
--
-- Batches (billing.services group commit: several charges of one wallet in one statement, so in
-- one transaction; every charge after the first is called with p_batch_later). A charge after the
-- first runs with the chain head held, so it may take no lock the order puts before the head: it
-- locks nothing new (the same wallet and agent ancestors), except the parent of a wallet with an
-- auto-refill, which billing_debit may lock. Such a charge raises SQLSTATE 'TGBT1' instead, and
-- the batch rolls back whole; its charges then run one statement each.
--
-- The events go to audit_append_in as audit's audit_event_in record (audit/sql/audit_append.sql), the
-- one reader of that shape; the canonical bytes around the seq travel in hex.
-- billing_debit and audit_append_in are called as assignments (``d := billing_debit(...)``), not as
-- ``SELECT ... INTO`` or ``PERFORM``: PL/pgSQL evaluates such a call as an expression, without a
-- query's executor and portal around it (about 1.3 % of PostgreSQL's instructions per charge).
--
-- Assumes: the caller passes billing_debit's arguments as billing.services.charge_call prepares
-- them (ids, now, truncated texts), units > 0 at 8 places, p_tenant_id = the wallet's tenant as
-- the caller knows it, and the server encoding is UTF8 (as audit_append does).
CREATE OR REPLACE FUNCTION billing_charge(
    p_wallet_id text,
    p_tenant_id text,
    p_reach_wallet_id text,       -- a wallet key's wallet; NULL: the caller has checked access
    p_category text,
    p_default_price numeric,      -- the category's built-in price; NULL: unknown category
    p_units numeric,
    p_description text,
    p_request_path text,
    p_correlation_id text,
    p_now timestamptz,
    p_ids text[],                 -- billing_debit's: charge tx, wallet entry, revenue entry, refill tx, parent, wallet
    p_hour_limit numeric,
    p_day_limit numeric,
    p_idempotency_key text,
    p_request_hash text,
    p_body jsonb,                 -- the response body's fields known before the debit
    p_key_id text,                -- the events' key, endpoint and request id
    p_endpoint text,
    p_request_id text,
    p_charge_event_id text,
    p_charge_created_at timestamptz,
    p_charge_detail jsonb,        -- without amount and balance_after
    p_charge_parts bytea[],       -- 3 cuts of the bytes before the seq, then the bytes after it
    p_refill_event_id text,
    p_refill_created_at timestamptz,
    p_refill_detail jsonb,        -- without amount, balance_after and counterparty
    p_refill_parts bytea[],       -- 4 cuts, then the bytes after the seq; NULL: not prepared
    k_key_id text,                -- the deferred rate-limit charge (0. above); NULL: none
    k_secret_hash text,
    k_window_index bigint,
    k_limit integer,
    p_batch_later boolean DEFAULT false,  -- a charge after the first of a batch (Batches, above)
    OUT code text,                -- billing_debit's codes, and not_found, access_denied, replay,
                                  -- idempotency_key_reused, idempotency_key_in_progress,
                                  -- unknown_category, amount_too_small, key_stale, rate_limited,
                                  -- policy_denied
    OUT subject_id text,
    OUT wallet_tenant text,
    OUT new_balance numeric,
    OUT daily_spent numeric,
    OUT refilled numeric,
    OUT refill_parent text,
    OUT figure numeric,
    OUT figure_limit numeric,
    OUT spend_window text,
    OUT refusal_reason text,
    OUT unit_price numeric,
    OUT charged numeric,          -- the amount debited (or that would have been)
    OUT response_status integer,  -- 200, or a replay's stored status
    OUT body text,                -- the response body (stored for replay), or a replay's
    OUT rate_count integer        -- the key's window after the deferred charge (0. above)
)
LANGUAGE plpgsql AS $$
DECLARE
    wallet_path text;
    refills boolean;
    stored billing_charge_idempotency;
    answer record;    -- billing_charge_replay's answer
    d record;
    money_amount text;
    money_balance text;
    money_refill text;
    money_refilled_balance text;
    response jsonb;
    payload bytea;
    appended record;  -- audit_append's answer, unused
    bound record;     -- a row of permits_policy_verdict
    cap_policies text[];
    cap_wallets text[];
    cap_limits numeric[];
    over record;      -- billing_daily_cap_over's answer
BEGIN
    IF k_key_id IS NOT NULL THEN
        rate_count := billing_rate_limit_key_charge(k_key_id, k_secret_hash, k_window_index, NULL);
        IF rate_count IS NULL THEN
            code := 'key_stale'; RETURN;
        END IF;
        IF rate_count > k_limit THEN
            code := 'rate_limited'; RETURN;
        END IF;
    END IF;
    SELECT w.tenant_id, w.path, w.refill_threshold IS NOT NULL AND w.refill_amount IS NOT NULL
      INTO wallet_tenant, wallet_path, refills
      FROM billing_wallet w WHERE w.wallet_id = p_wallet_id AND w.tenant_id = p_tenant_id;
    IF p_batch_later AND refills THEN
        RAISE EXCEPTION 'billing_charge: a charge of a wallet with an auto-refill cannot follow another in a batch'
              USING ERRCODE = 'TGBT1';
    END IF;
    IF wallet_tenant IS NULL THEN
        code := 'not_found'; subject_id := p_wallet_id; RETURN;
    END IF;
    IF p_reach_wallet_id IS NOT NULL AND NOT p_reach_wallet_id = ANY(string_to_array(wallet_path, '/')) THEN
        code := 'access_denied'; subject_id := p_wallet_id; RETURN;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN  -- a replay needs no lock
        SELECT * INTO stored FROM billing_charge_idempotency c
         WHERE c.wallet_id = p_wallet_id AND c.key = p_idempotency_key AND c.tenant_id = p_tenant_id;
        IF FOUND THEN
            answer := billing_charge_replay(stored, p_request_hash);
            code := answer.code; response_status := answer.response_status; body := answer.body;
            RETURN;
        END IF;
    END IF;

    SELECT sp.credits_per_unit INTO unit_price FROM billing_service_price sp WHERE sp.category = p_category;
    IF NOT FOUND THEN
        unit_price := p_default_price;
    END IF;
    IF unit_price IS NULL THEN
        code := 'unknown_category'; RETURN;
    END IF;
    charged := round(unit_price * p_units, 8);
    IF charged <= 0 THEN
        code := 'amount_too_small'; RETURN;
    END IF;

    FOR bound IN SELECT * FROM permits_policy_verdict(
        p_tenant_id, string_to_array(wallet_path, '/'), NULL, NULL, p_category, charged, NULL
    ) LOOP
        IF bound.rule <> 'max_daily_credits' THEN  -- the rows that refuse come first
            code := 'policy_denied'; subject_id := bound.policy_id; spend_window := bound.rule;
            figure_limit := bound.cap;
            RETURN;
        END IF;
        cap_policies := cap_policies || bound.policy_id;
        cap_wallets := cap_wallets || bound.cap_wallet_id;
        cap_limits := cap_limits || bound.cap;
    END LOOP;

    IF cap_policies IS NULL THEN
        d := billing_debit(
            p_tenant_id, p_wallet_id, charged, p_now, p_category, p_units, p_description, p_request_path,
            p_correlation_id, p_ids, p_hour_limit, p_day_limit, p_idempotency_key
        );
    ELSE
        BEGIN  -- a savepoint: a charge over a cap is undone, locks included, and refused
            d := billing_debit(
                p_tenant_id, p_wallet_id, charged, p_now, p_category, p_units, p_description, p_request_path, p_correlation_id,
                p_ids, p_hour_limit, p_day_limit, p_idempotency_key
            );
            IF d.code = 'ok' THEN
                over := billing_daily_cap_over(p_tenant_id, cap_policies, cap_wallets, cap_limits, p_now);
                IF over.policy_id IS NOT NULL THEN
                    RAISE EXCEPTION USING ERRCODE = 'TGPC1';
                END IF;
            END IF;
        EXCEPTION WHEN SQLSTATE 'TGPC1' THEN
            code := 'policy_denied'; subject_id := over.policy_id; spend_window := 'max_daily_credits';
            figure := over.spent - charged; figure_limit := over.cap;
            refusal_reason := cap_wallets[array_position(cap_policies, over.policy_id)];
            RETURN;
        END;
    END IF;
    code := d.code; subject_id := d.subject_id; new_balance := d.new_balance; daily_spent := d.daily_spent;
    refilled := d.refilled; refill_parent := d.refill_parent; figure := d.figure; figure_limit := d.figure_limit;
    spend_window := d.spend_window; refusal_reason := d.refusal_reason;
    IF code = 'replay' THEN  -- a duplicate committed while this call waited for the wallet's lock
        SELECT * INTO stored FROM billing_charge_idempotency c
         WHERE c.wallet_id = p_wallet_id AND c.key = p_idempotency_key AND c.tenant_id = p_tenant_id;
        answer := billing_charge_replay(stored, p_request_hash);
        code := answer.code; response_status := answer.response_status; body := answer.body;
        RETURN;
    END IF;
    IF code <> 'ok' THEN
        RETURN;  -- refused: billing_debit wrote nothing
    END IF;
    IF refilled IS NOT NULL AND p_refill_parts IS NULL THEN
        RAISE EXCEPTION 'billing_charge: a refill was posted but its audit event was not prepared'
              USING ERRCODE = 'TGRF1';
    END IF;

    money_amount := round(charged, 8)::text;
    money_balance := round(new_balance, 8)::text;
    response_status := 200;
    response := p_body || jsonb_build_object(
        'unit_price', round(unit_price, 8)::text,
        'amount', money_amount,
        'balance', money_balance,
        'daily_spent', round(daily_spent, 8)::text,
        'refill', CASE WHEN refilled IS NULL THEN NULL ELSE jsonb_build_object(
            'entry_id', p_ids[6], 'amount', round(refilled, 8)::text, 'parent_wallet_id', refill_parent
        ) END
    );
    body := response::text;
    IF p_idempotency_key IS NOT NULL THEN
        INSERT INTO billing_charge_idempotency
            (wallet_id, tenant_id, key, request_hash, status, response_status, response_body, entry_id,
             created_at, updated_at)
        VALUES (p_wallet_id, wallet_tenant, p_idempotency_key, p_request_hash, 'done', 200, response, p_ids[2],
                p_now, p_now);
    END IF;

    IF refilled IS NOT NULL THEN  -- the refill entry's balance_after: before the charge it pays for
        money_refill := round(refilled, 8)::text;
        money_refilled_balance := round(new_balance + charged, 8)::text;
        payload := p_refill_parts[1] || convert_to('"' || money_refill || '"', 'UTF8')
                || p_refill_parts[2] || convert_to('"' || money_refilled_balance || '"', 'UTF8')
                || p_refill_parts[3] || convert_to(to_json(refill_parent)::text, 'UTF8')
                || p_refill_parts[4];
        appended := audit_append_in(wallet_tenant, jsonb_build_object(
            'chain', wallet_tenant, 'event_id', p_refill_event_id, 'event', 'ledger.refill', 'tenant_id', wallet_tenant,
            'wallet_id', p_wallet_id, 'key_id', p_key_id, 'tool', NULL, 'endpoint', p_endpoint,
            'policy_decision_id', NULL, 'request_id', p_request_id, 'ok', true,
            'detail', p_refill_detail || jsonb_build_object(
                'amount', money_refill,
                'balance_after', money_refilled_balance,
                'counterparty', refill_parent
            ),
            'created_at', p_refill_created_at, 'prefix', encode(payload, 'hex'), 'suffix', encode(p_refill_parts[5], 'hex')
        ));
    END IF;
    payload := p_charge_parts[1] || convert_to('"' || round(-charged, 8)::text || '"', 'UTF8')
            || p_charge_parts[2] || convert_to('"' || money_balance || '"', 'UTF8')
            || p_charge_parts[3];
    appended := audit_append_in(wallet_tenant, jsonb_build_object(
        'chain', wallet_tenant, 'event_id', p_charge_event_id, 'event', 'ledger.charge', 'tenant_id', wallet_tenant,
        'wallet_id', p_wallet_id, 'key_id', p_key_id, 'tool', NULL, 'endpoint', p_endpoint,
        'policy_decision_id', NULL, 'request_id', p_request_id, 'ok', true,
        'detail', p_charge_detail || jsonb_build_object('amount', round(-charged, 8)::text, 'balance_after', money_balance),
        'created_at', p_charge_created_at, 'prefix', encode(payload, 'hex'), 'suffix', encode(p_charge_parts[4], 'hex')
    ));
END;
$$;

-- billing_charge_replay: what a charge's stored idempotency record answers (billing_charge, 2.), written once.
--
-- 'idempotency_key_reused' when the record's request hash differs from p_request_hash,
-- 'idempotency_key_in_progress' when it holds no response yet, else 'replay'; with the record's
-- response status and body. billing_charge calls it only when a record of its (wallet, key)
-- exists: found before any lock, or committed while the charge waited for the wallet's lock
-- (billing_debit's 'replay'). A charge without a record never calls it. Reads no table.
CREATE OR REPLACE FUNCTION billing_charge_replay(
    p_stored billing_charge_idempotency,
    p_request_hash text,
    OUT code text,
    OUT response_status integer,
    OUT body text
)
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_stored.request_hash <> p_request_hash THEN 'idempotency_key_reused'
                WHEN p_stored.status <> 'done' OR p_stored.response_status IS NULL
                     THEN 'idempotency_key_in_progress'
                ELSE 'replay' END,
           p_stored.response_status,
           p_stored.response_body::text
$$;
