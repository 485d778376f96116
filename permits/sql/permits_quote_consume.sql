-- permits_quote_consume: spend an active quote exactly once, at the price that was verified.
--
-- One conditional UPDATE from 'active' to 'consumed': of two concurrent calls with
-- one quote, one succeeds and the other is refused (the second waits for the row
-- lock, then sees 'consumed'). The quote must be the caller's wallet's, for the
-- tool being called, unexpired (p_now), and still carry the price and signature
-- the caller verified against the signed statement (p_credits, p_signature), so a
-- price edited in the table after signing is never charged, and be p_tenant_id's (a quote
-- of another tenant is not touched). Returns whether it
-- consumed the quote.
--
-- Callers: the governed call's claim (gateway_claim) and permits.services.quotes.quote_consume.
-- Lock order: after the action row, before the wallet rows.
CREATE OR REPLACE FUNCTION permits_quote_consume(
    p_tenant_id text,
    p_quote_id text,
    p_wallet_id text,
    p_tool text,
    p_credits numeric,
    p_signature text,
    p_action_id text,
    p_now timestamptz
)
RETURNS boolean
LANGUAGE sql AS $$
    WITH consumed AS (
        UPDATE permits_quote SET status = 'consumed', consumed_at = p_now, consumed_by = p_action_id
         WHERE quote_id = p_quote_id AND tenant_id = p_tenant_id AND wallet_id = p_wallet_id AND tool = p_tool AND status = 'active'
           AND expires_at > p_now AND quoted_credits = p_credits AND signature = p_signature
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM consumed);
$$;

-- permits_quote_consume_in: permits_quote_consume for a consumption passed as one record, permits' shape.
--
-- p_quote is the JSON object permits.services.quotes.quote_consumption_record builds (the one
-- constructor of the shape): quote_id, wallet_id, tool, credits (a decimal string), signature,
-- action_id, now (ISO 8601). Other apps' database functions (gateway_claim) consume with this.
CREATE OR REPLACE FUNCTION permits_quote_consume_in(p_tenant_id text, p_quote jsonb)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT permits_quote_consume(
        p_tenant_id, p_quote->>'quote_id', p_quote->>'wallet_id', p_quote->>'tool', (p_quote->>'credits')::numeric,
        p_quote->>'signature', p_quote->>'action_id', (p_quote->>'now')::timestamptz
    );
$$;
