-- billing_refund: a refund from revenue back to a wallet, with the spend it undoes. The only copy of the rule.
--
-- With p_charge_entry_id (a charge's wallet entry), the refund goes to that charge's wallet and never
-- exceeds what is left of the charge (the charge's amount less the refunds posted against it):
-- 'not_refundable' when the entry is not a charge of a wallet of p_tenant_id, 'refund_exceeds_charge'
-- (figure: what is left) when it would. Without it, p_wallet_id is the wallet (an operator's
-- goodwill credit out of revenue). Frozen and expired wallets accept refunds; closed wallets do not
-- ('wallet_closed'); 'not_found' for a wallet that is not p_tenant_id's. A refusal writes nothing.
--
-- Locks the wallet's agent ancestors top down, then the wallet (the debit's lock order,
-- docs/decisions.md "Lock order"): the wallet's lock serializes concurrent refunds of one charge.
-- Then posts the refund (billing_post, revenue -> wallet, lowering the wallet's total_spent) and
-- undoes the spend in the windows the charge counted in: the buckets of the charge's hour (of the
-- refund's hour without a charge) of the wallet and each agent ancestor, and the ancestors'
-- total_spent, each never below zero. Spend is net (billing_debit counts charges, this function
-- takes refunds off), so a refunded call uses up no budget, daily limit or velocity window.
--
-- Answers code 'ok' and the wallet entry's figures. Touches only p_tenant_id's rows. Assumes the
-- caller holds the transaction; p_amount > 0 at 8 places; texts truncated to their columns.
-- Caller: billing.services.ledger.ledger_refund (refunds of failed calls, the API, the console).
CREATE OR REPLACE FUNCTION billing_refund(
    p_tenant_id text,
    p_charge_entry_id text,       -- NULL: a refund to p_wallet_id without a charge
    p_wallet_id text,
    p_amount numeric,
    p_transaction_id text,
    p_revenue_entry_id text,
    p_wallet_entry_id text,
    p_description text,
    p_request_path text,
    p_correlation_id text,        -- '' : the charge's
    p_now timestamptz,
    OUT code text,                -- ok, not_found, not_refundable, wallet_closed, refund_exceeds_charge
    OUT subject_id text,          -- the wallet refunded (the charge's entry for not_refundable)
    OUT figure numeric,           -- refund_exceeds_charge: what is left of the charge
    OUT balance_after numeric,    -- ok: the wallet's balance after the refund
    OUT service_category text,    -- ok: the charge's
    OUT correlation_id text       -- ok: the entries'
)
LANGUAGE plpgsql AS $$
DECLARE
    charge billing_ledger_entry;
    wallet_path text;
    owner_ids text[];
    wallet_id_ text;
    w billing_wallet;
    refunded numeric;
    posted record;  -- billing_post's answer
BEGIN
    service_category := ''; correlation_id := p_correlation_id;
    subject_id := p_wallet_id;
    IF p_charge_entry_id IS NOT NULL THEN
        SELECT * INTO charge FROM billing_ledger_entry e WHERE e.entry_id = p_charge_entry_id AND e.tenant_id = p_tenant_id;
        IF NOT FOUND OR charge.kind <> 'charge' OR charge.wallet_id IS NULL THEN
            code := 'not_refundable'; subject_id := p_charge_entry_id; RETURN;
        END IF;
        subject_id := charge.wallet_id;
        service_category := charge.service_category;
        IF correlation_id = '' THEN
            correlation_id := charge.correlation_id;
        END IF;
    END IF;
    SELECT bw.path INTO wallet_path FROM billing_wallet bw WHERE bw.wallet_id = subject_id AND bw.tenant_id = p_tenant_id;
    IF NOT FOUND THEN
        code := 'not_found'; RETURN;
    END IF;
    owner_ids := string_to_array(wallet_path, '/');
    owner_ids := COALESCE(owner_ids[2:cardinality(owner_ids) - 1], '{}');  -- agent ancestors, root first
    FOREACH wallet_id_ IN ARRAY owner_ids LOOP
        PERFORM 1 FROM billing_wallet WHERE wallet_id = wallet_id_ AND tenant_id = p_tenant_id FOR NO KEY UPDATE;
    END LOOP;
    SELECT * INTO w FROM billing_wallet WHERE wallet_id = subject_id AND tenant_id = p_tenant_id FOR NO KEY UPDATE;
    IF w.status = 'closed' THEN
        code := 'wallet_closed'; RETURN;
    END IF;
    IF p_charge_entry_id IS NOT NULL THEN
        SELECT COALESCE(sum(e.amount), 0) INTO refunded FROM billing_ledger_entry e
         WHERE e.refund_of_id = p_charge_entry_id AND e.account = w.wallet_id AND e.tenant_id = p_tenant_id;
        IF p_amount > -charge.amount - refunded THEN
            code := 'refund_exceeds_charge'; figure := -charge.amount - refunded; RETURN;
        END IF;
    END IF;
    posted := billing_post(p_tenant_id, p_transaction_id, 'refund', 'revenue', w.wallet_id, p_amount,
                           p_revenue_entry_id, p_wallet_entry_id, -p_amount, service_category, NULL, p_description,
                           p_request_path, correlation_id, p_charge_entry_id, p_now);
    balance_after := posted.target_balance;
    UPDATE billing_spend_bucket SET amount = GREATEST(amount - p_amount, 0)
     WHERE wallet_id = ANY(owner_ids || w.wallet_id) AND tenant_id = p_tenant_id
       AND hour = date_trunc('hour', COALESCE(charge.created_at, p_now) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    IF cardinality(owner_ids) > 0 THEN
        UPDATE billing_wallet SET total_spent = GREATEST(total_spent - p_amount, 0)
         WHERE wallet_id = ANY(owner_ids) AND tenant_id = p_tenant_id;
    END IF;
    code := 'ok';
END;
$$;
