-- billing_rate_limit_key_charge: one unit on an API key's rate-limit window and on its wallet line's window,
-- only for the key's holder.
--
-- The only copy of the rule, called by the rate limiter's statement at a request's start
-- (billing.selectors.api_key_authenticate_charging) and by the statements that carry a deferred
-- charge (gateway_claim, billing_charge; billing.ratelimit, "deferred").
--
-- Returns NULL, writing nothing, unless the key p_key_id is active and p_secret_hash is the SHA-256
-- of its secret (and, with p_wallet_id, the key belongs to that wallet): a caller guessing secrets
-- for a known key id never spends that key's allowance. Otherwise adds one to the window
-- p_window_index of the bucket 'key:<key_id>' (billing_rate_limit_window, an UNLOGGED table) and,
-- for a wallet key, one to the same window of the bucket 'wallet:<line>', where the line is the
-- key's wallet, or for a child wallet its agent parent (docs/decisions.md, "Rate limits count per
-- wallet line"): an agent minting keys, or child wallets with keys, shares one allowance. Returns
-- the larger count after the charge, so a caller comparing it with the limit refuses when either
-- bucket is over. The key's window row is the first lock its caller takes, the line's the second
-- (docs/decisions.md, "Lock order"); a line's keys all take them in that order.
CREATE OR REPLACE FUNCTION billing_rate_limit_key_charge(
    p_key_id text, p_secret_hash text, p_window_index bigint, p_wallet_id text
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    m integer;
    line text;
BEGIN
    SELECT CASE WHEN w.wallet_type = 'child' THEN w.parent_id ELSE w.wallet_id END INTO line
      FROM billing_api_key k LEFT JOIN billing_wallet w ON w.wallet_id = k.wallet_id
     WHERE k.key_id = p_key_id AND k.secret_hash = p_secret_hash AND k.status = 'active'
       AND (p_wallet_id IS NULL OR k.wallet_id = p_wallet_id);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO billing_rate_limit_window (bucket, window_index, count) VALUES ('key:' || p_key_id, p_window_index, 1)
        ON CONFLICT (bucket, window_index) DO UPDATE SET count = billing_rate_limit_window.count + EXCLUDED.count
        RETURNING count INTO n;
    IF line IS NOT NULL THEN
        INSERT INTO billing_rate_limit_window (bucket, window_index, count) VALUES ('wallet:' || line, p_window_index, 1)
            ON CONFLICT (bucket, window_index) DO UPDATE SET count = billing_rate_limit_window.count + EXCLUDED.count
            RETURNING count INTO m;
        n := GREATEST(n, m);
    END IF;
    RETURN n;
END;
$$;
