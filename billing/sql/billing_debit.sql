-- billing_debit: the debit, the only copy of the spend rules (the status rule is billing_wallet_may_spend's,
-- the posting billing_post's).
--
-- Every charge (``POST /v1/billing/charge``, governed tool calls, the console) is
-- one call of this function, so a debit is one round trip however many wallets
-- it touches. Python prepares what only Python does (ids, the time, truncated
-- texts) and maps the refusal codes to exceptions (``billing.services.ledger_debit``).
--
-- In one call, inside the caller's transaction:
--
-- 1. Locks, top-down (the lock order of docs/decisions.md, "Lock order"): every
--    agent ancestor of the wallet (their spend windows count the charge), the
--    parent when an auto-refill is likely (a hint read before the locks), then the
--    wallet. Under the wallet's lock the refill is decided again on the wallet as it
--    is; when it is due but the hint did not take the parent's lock (a concurrent
--    charge moved the balance while this one waited, or the refill was just set
--    up), the call raises serialization_failure (SQLSTATE 40001) rather than lock
--    the parent out of order or charge without the refill. Nothing it wrote
--    remains once the caller's transaction rolls back, and a new attempt reads a
--    hint that foresees the refill: the charge endpoint and the governed call run
--    their statement again (config/dbretry.py), else answer 409
--    ``transaction_conflict``.
-- 2. With ``p_idempotency_key``, answers ``replay`` when the charge endpoint's
--    record for (wallet, key) committed while this call waited for the lock.
-- 3. Refuses, in this order, naming the wallet that refuses: the status rule
--    (billing_wallet_may_spend: the wallet's own status, closed, frozen, expired, then the
--    highest ancestor that is not active or has expired; a freeze covers the subtree); funds, counting an
--    auto-refill the parent can pay (due when the balance of the wallet and its
--    children falls under the threshold; ``insufficient_funds``, which freezes
--    nothing); budget and daily limit of the wallet, then of each agent ancestor
--    upwards; velocity (hour, then day) of the same, in the same order
--    (``velocity``: the caller freezes the wallet named).
-- 4. Posts the refill (parent -> wallet) when due, then the charge (wallet ->
--    revenue) as balanced ledger transactions (billing_post, which moves the balances
--    and the wallet's lifetime ``total_spent``), moves the ``total_spent`` of every agent
--    ancestor, and adds the amount to each owner's spend bucket of the hour.
--
-- Touches only p_tenant_id's rows: a wallet of another tenant is 'not_found'.
--
-- Spend windows are read from ``billing_spend_bucket`` (at most 25 rows per
-- owner), as ``billing.selectors.spend_windows`` reads them: last hour = the
-- current and previous clock hours, last day = the current and 24 previous,
-- today = since 00:00 UTC.
CREATE OR REPLACE FUNCTION billing_debit(
    p_tenant_id text,
    p_wallet_id text,
    p_amount numeric,
    p_now timestamptz,
    p_category text,
    p_units numeric,
    p_description text,
    p_request_path text,
    p_correlation_id text,
    p_ids text[],               -- charge transaction, wallet entry, revenue entry, refill transaction, parent entry, wallet entry
    p_hour_limit numeric,
    p_day_limit numeric,
    p_idempotency_key text,
    OUT code text,              -- ok, replay, not_found, wallet_closed, wallet_frozen, wallet_expired,
                                -- insufficient_funds, budget_exceeded, daily_limit_exceeded, velocity
    OUT subject_id text,        -- the wallet that refuses (or the wallet charged)
    OUT wallet_tenant text,
    OUT new_balance numeric,  -- the wallet's balance after the charge (insufficient_funds: its balance)
    OUT daily_spent numeric,    -- the wallet's spend today including this charge
    OUT refilled numeric,  -- the auto-refill posted, if any
    OUT refill_parent text,
    OUT figure numeric,         -- refusals: the figure that would go over (total spent, today's or the window's spend)
    OUT figure_limit numeric,   -- refusals: the limit
    OUT spend_window text,      -- velocity: hour or day
    OUT refusal_reason text
)
LANGUAGE plpgsql
-- Every statement below looks rows up by key (a wallet, a wallet's buckets of the last 25 hours), so one
-- plan serves every call; without this the spend-window query was planned again on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    hint billing_wallet;
    w billing_wallet;
    parent billing_wallet;
    path_ids text[];
    owner_ids text[];
    lock_ids text[];
    status record;    -- billing_wallet_may_spend's answer
    posted record;    -- billing_post's answer
    wallet_id_ text;
    refill_due boolean := false;
    held_below numeric;
    hour_start timestamptz := date_trunc('hour', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    midnight timestamptz := date_trunc('day', p_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    r record;
    ids text[] := '{}';
    hours numeric[] := '{}';
    days numeric[] := '{}';
    i int;
    n int;
BEGIN
    SELECT * INTO hint FROM billing_wallet WHERE wallet_id = p_wallet_id AND tenant_id = p_tenant_id;
    IF NOT FOUND THEN
        code := 'not_found'; subject_id := p_wallet_id; RETURN;
    END IF;
    path_ids := string_to_array(hint.path, '/');
    n := array_length(path_ids, 1);
    owner_ids := COALESCE(path_ids[2:n - 1], '{}');  -- agent ancestors, root first (never the sponsor)
    lock_ids := owner_ids;
    IF hint.parent_id IS NOT NULL AND hint.refill_threshold IS NOT NULL AND hint.refill_amount IS NOT NULL
       AND hint.balance - p_amount < hint.refill_threshold AND NOT hint.parent_id = ANY(lock_ids) THEN
        lock_ids := lock_ids || hint.parent_id;
    END IF;
    FOREACH wallet_id_ IN ARRAY lock_ids LOOP  -- the parent is the last ancestor: top-down order holds
        PERFORM 1 FROM billing_wallet WHERE wallet_id = wallet_id_ AND tenant_id = p_tenant_id FOR NO KEY UPDATE;
    END LOOP;
    SELECT * INTO w FROM billing_wallet WHERE wallet_id = p_wallet_id AND tenant_id = p_tenant_id FOR NO KEY UPDATE;
    wallet_tenant := w.tenant_id;

    -- Two IFs, not one condition: a query that runs only for keyed charges keeps one plan for all of them.
    IF p_idempotency_key IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM billing_charge_idempotency c
                    WHERE c.wallet_id = p_wallet_id AND c.key = p_idempotency_key AND c.tenant_id = p_tenant_id) THEN
            code := 'replay'; subject_id := p_wallet_id; RETURN;
        END IF;
    END IF;

    -- Status: the wallet, then the highest ancestor that stops it (under the wallet's lock).
    status := billing_wallet_may_spend(p_tenant_id, p_wallet_id, p_now);
    IF status.code IS NOT NULL THEN
        code := status.code; subject_id := status.subject_id; refusal_reason := status.refusal_reason; RETURN;
    END IF;
    subject_id := w.wallet_id;

    -- Funds, counting an auto-refill the parent can pay.
    IF w.parent_id IS NOT NULL AND w.refill_threshold IS NOT NULL AND w.refill_amount IS NOT NULL
       AND w.balance - p_amount < w.refill_threshold THEN
        IF NOT w.parent_id = ANY(lock_ids) THEN  -- the hint missed it: the refill needs the parent's lock first
            RAISE EXCEPTION 'billing_debit: wallet % needs an auto-refill its locks did not foresee', p_wallet_id
                  USING ERRCODE = 'serialization_failure';
        END IF;
        -- The threshold is the line's: credit the wallet moved to its children still counts, so moving
        -- credit down and charging a little never draws a refill (it drained the parent into the
        -- children). Every debit and refill of a child, and every funding of one, holds this
        -- wallet's lock, so the children's balances are settled here.
        SELECT COALESCE(sum(c.balance), 0) INTO held_below FROM billing_wallet c
         WHERE c.parent_id = w.wallet_id AND c.tenant_id = p_tenant_id;
        IF w.balance + held_below - p_amount < w.refill_threshold THEN
            -- The parent's status needs no check here: it is an ancestor, which the status rule above found
            -- active and unexpired under its lock (billing_wallet_may_spend).
            SELECT * INTO parent FROM billing_wallet WHERE wallet_id = w.parent_id AND tenant_id = p_tenant_id;
            refill_due := parent.balance >= w.refill_amount;
        END IF;
    END IF;
    IF w.balance + (CASE WHEN refill_due THEN w.refill_amount ELSE 0 END) < p_amount THEN
        code := 'insufficient_funds'; new_balance := w.balance; RETURN;
    END IF;

    -- Budget and daily limit, then velocity: the wallet first, then each agent ancestor upwards.
    FOR r IN
        SELECT o.id, o.ord, bw.budget, bw.total_spent, bw.daily_limit,
               COALESCE(s.last_hour, 0) AS last_hour, COALESCE(s.last_day, 0) AS last_day,
               COALESCE(s.today, 0) AS today
          FROM unnest(owner_ids || w.wallet_id) WITH ORDINALITY AS o(id, ord)
          JOIN billing_wallet bw ON bw.wallet_id = o.id AND bw.tenant_id = p_tenant_id
          LEFT JOIN LATERAL (
              SELECT SUM(b.amount) FILTER (WHERE b.hour >= hour_start - interval '1 hour') AS last_hour,
                     SUM(b.amount) FILTER (WHERE b.hour >= hour_start - interval '24 hours') AS last_day,
                     SUM(b.amount) FILTER (WHERE b.hour >= midnight) AS today
                FROM billing_spend_bucket b
               WHERE b.wallet_id = o.id AND b.tenant_id = p_tenant_id AND b.hour >= LEAST(hour_start - interval '24 hours', midnight)
          ) s ON true
         ORDER BY o.ord DESC
    LOOP
        subject_id := r.id;
        IF r.budget IS NOT NULL AND r.total_spent + p_amount > r.budget THEN
            code := 'budget_exceeded'; figure := r.total_spent; figure_limit := r.budget; RETURN;
        END IF;
        IF r.daily_limit IS NOT NULL AND r.today + p_amount > r.daily_limit THEN
            code := 'daily_limit_exceeded'; figure := r.today; figure_limit := r.daily_limit; RETURN;
        END IF;
        IF r.id = w.wallet_id THEN
            daily_spent := r.today + p_amount;
        END IF;
        ids := ids || r.id;
        hours := hours || r.last_hour;
        days := days || r.last_day;
    END LOOP;
    FOR i IN 1 .. COALESCE(array_length(ids, 1), 0) LOOP
        subject_id := ids[i];
        IF hours[i] + p_amount > p_hour_limit THEN
            code := 'velocity'; spend_window := 'hour'; figure := hours[i]; figure_limit := p_hour_limit; RETURN;
        END IF;
        IF days[i] + p_amount > p_day_limit THEN
            code := 'velocity'; spend_window := 'day'; figure := days[i]; figure_limit := p_day_limit; RETURN;
        END IF;
    END LOOP;
    subject_id := w.wallet_id;

    IF refill_due THEN  -- just before the charge it pays for, in every listing
        refilled := w.refill_amount;
        refill_parent := parent.wallet_id;
        posted := billing_post(p_tenant_id, p_ids[4], 'refill', parent.wallet_id, w.wallet_id, refilled, p_ids[5],
                               p_ids[6], 0, '', NULL, 'auto-refill', '', p_correlation_id, NULL,
                               p_now - interval '1 microsecond');
    END IF;

    posted := billing_post(p_tenant_id, p_ids[1], 'charge', w.wallet_id, 'revenue', p_amount, p_ids[2], p_ids[3],
                           p_amount, p_category, p_units, p_description, p_request_path, p_correlation_id, NULL, p_now);
    new_balance := posted.source_balance;
    IF array_length(owner_ids, 1) > 0 THEN
        UPDATE billing_wallet SET total_spent = total_spent + p_amount
         WHERE wallet_id = ANY(owner_ids) AND tenant_id = p_tenant_id;
    END IF;
    INSERT INTO billing_spend_bucket (wallet_id, tenant_id, hour, amount)
    SELECT o, p_tenant_id, hour_start, p_amount FROM unnest(owner_ids || w.wallet_id) AS o
        ON CONFLICT (wallet_id, hour, tenant_id) DO UPDATE SET amount = billing_spend_bucket.amount + EXCLUDED.amount;
    code := 'ok';
END;
$$;

-- billing_debit_in: billing_debit for a debit passed as one record, billing's debit_in shape.
--
-- p_debit is the JSON object billing.services.ledger.DebitCall.record builds (the one constructor of
-- the shape): wallet_id, amount, now (ISO 8601 with its offset), category, units, description,
-- request_path, correlation_id, ids (billing_debit's six, as a JSON array), hour_limit, day_limit;
-- amounts as decimal strings. Other apps' database functions (gateway_claim) debit with this, never
-- with billing_debit's positional arguments. Answers billing_debit's columns; without an
-- idempotency key (the charge endpoint's own, billing_charge, passes it to billing_debit).
CREATE OR REPLACE FUNCTION billing_debit_in(
    p_tenant_id text,
    p_debit jsonb,
    OUT code text, OUT subject_id text, OUT wallet_tenant text, OUT new_balance numeric, OUT daily_spent numeric,
    OUT refilled numeric, OUT refill_parent text, OUT figure numeric, OUT figure_limit numeric,
    OUT spend_window text, OUT refusal_reason text
)
LANGUAGE plpgsql AS $$
DECLARE
    d record;  -- billing_debit's answer
BEGIN
    d := billing_debit(
        p_tenant_id, p_debit->>'wallet_id', (p_debit->>'amount')::numeric, (p_debit->>'now')::timestamptz,
        p_debit->>'category', (p_debit->>'units')::numeric, p_debit->>'description', p_debit->>'request_path',
        p_debit->>'correlation_id', ARRAY(SELECT jsonb_array_elements_text(p_debit->'ids')),
        (p_debit->>'hour_limit')::numeric, (p_debit->>'day_limit')::numeric, NULL
    );
    code := d.code; subject_id := d.subject_id; wallet_tenant := d.wallet_tenant; new_balance := d.new_balance;
    daily_spent := d.daily_spent; refilled := d.refilled; refill_parent := d.refill_parent; figure := d.figure;
    figure_limit := d.figure_limit; spend_window := d.spend_window; refusal_reason := d.refusal_reason;
END;
$$;
