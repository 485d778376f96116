-- billing_post: the one posting of money. Every ledger transaction is one call of this function.
--
-- Moves p_amount (> 0) from p_source to p_target as one balanced ledger transaction of two entries:
-- p_source_entry_id (-p_amount on the source) and p_target_entry_id (+p_amount on the target), both
-- with p_transaction_id, p_kind and the same texts, created at p_created_at. An account is a wallet of
-- p_tenant_id or one of the two wallet-less system accounts, 'mint' and 'revenue' (no balance: their
-- entries carry no balance_after). A wallet's balance moves in the same statement as its entry, so it
-- always equals the sum of its entries; the transaction sums to zero, as the deferred trigger
-- billing_ledger_transaction_balanced checks at commit.
--
-- p_spend_delta moves the lifetime net spend (total_spent, the budget's counter): a charge (> 0)
-- adds it to the source wallet, a refund (< 0) takes it from the target wallet, never below zero.
-- Spend buckets and the agent ancestors' total_spent are the caller's (billing_debit, billing_refund).
--
-- Refuses, writing nothing: an account that is neither a system account nor a wallet of p_tenant_id
-- (SQLSTATE TGPT1: a caller passed another tenant's wallet), and an amount that would take the
-- target wallet's balance past numeric(20,8)'s largest, 999999999999.99999999 (SQLSTATE TGBO1,
-- billing.refusals maps it to 422 balance_overflow). The source's funds and status are the caller's
-- rules (billing_debit, billing_wallet_may_spend), checked before.
--
-- Assumes: the caller holds the transaction and the row lock of every wallet involved (docs/decisions.md,
-- "Lock order"); the texts are truncated to their columns (Python's constructors do it).
-- Callers: billing_debit (the charge and the auto-refill), billing_refund, billing.services.ledger
-- (provision, fund, return on close).
CREATE OR REPLACE FUNCTION billing_post(
    p_tenant_id text,
    p_transaction_id text,
    p_kind text,
    p_source text,
    p_target text,
    p_amount numeric,
    p_source_entry_id text,
    p_target_entry_id text,
    p_spend_delta numeric,
    p_category text,
    p_units numeric,
    p_description text,
    p_request_path text,
    p_correlation_id text,
    p_refund_of text,
    p_created_at timestamptz,
    OUT source_balance numeric,   -- the source wallet's balance after (NULL for a system account)
    OUT target_balance numeric    -- the target wallet's balance after (NULL for a system account)
)
LANGUAGE plpgsql AS $$
DECLARE
    source_wallet text;
    target_wallet text;
BEGIN
    IF p_target NOT IN ('mint', 'revenue') THEN
        SELECT w.balance + p_amount INTO target_balance FROM billing_wallet w
         WHERE w.wallet_id = p_target AND w.tenant_id = p_tenant_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'billing_post: % is not an account of tenant %', p_target, p_tenant_id USING ERRCODE = 'TGPT1';
        END IF;
        IF target_balance > 999999999999.99999999 THEN
            RAISE EXCEPTION 'billing_post: the amount would take the balance of % past 999999999999.99999999', p_target
                  USING ERRCODE = 'TGBO1', DETAIL = p_target;
        END IF;
        target_wallet := p_target;
    END IF;
    IF p_source NOT IN ('mint', 'revenue') THEN
        UPDATE billing_wallet
           SET balance = balance - p_amount, updated_at = p_created_at,
               total_spent = CASE WHEN p_spend_delta > 0 THEN total_spent + p_spend_delta ELSE total_spent END
         WHERE wallet_id = p_source AND tenant_id = p_tenant_id
        RETURNING balance INTO source_balance;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'billing_post: % is not an account of tenant %', p_source, p_tenant_id USING ERRCODE = 'TGPT1';
        END IF;
        source_wallet := p_source;
    END IF;
    IF target_wallet IS NOT NULL THEN
        UPDATE billing_wallet
           SET balance = balance + p_amount, updated_at = p_created_at,
               total_spent = CASE WHEN p_spend_delta < 0 THEN GREATEST(total_spent + p_spend_delta, 0)
                                  ELSE total_spent END
         WHERE wallet_id = p_target AND tenant_id = p_tenant_id
        RETURNING balance INTO target_balance;
    END IF;
    INSERT INTO billing_ledger_entry
        (entry_id, transaction_id, tenant_id, wallet_id, account, counterparty, kind, amount, balance_after,
         service_category, units, description, request_path, correlation_id, refund_of_id, created_at)
    VALUES
        (p_source_entry_id, p_transaction_id, p_tenant_id, source_wallet, p_source, p_target, p_kind, -p_amount,
         source_balance, p_category, p_units, p_description, p_request_path, p_correlation_id, p_refund_of,
         p_created_at),
        (p_target_entry_id, p_transaction_id, p_tenant_id, target_wallet, p_target, p_source, p_kind, p_amount,
         target_balance, p_category, p_units, p_description, p_request_path, p_correlation_id, p_refund_of,
         p_created_at);
END;
$$;
