-- billing_rate_limit_key_charge: one unit on an API key's rate-limit window, only for the key's holder.
--
-- The only copy of the rule, called by the rate limiter's statement at a request's start
-- (billing.selectors.api_key_authenticate_charging) and by the statements that carry a deferred
-- charge (gateway_claim, billing_charge; billing.ratelimit, "deferred").
--
-- Returns NULL, writing nothing, unless the key p_key_id is active and p_secret_hash is the SHA-256
-- of its secret (and, with p_wallet_id, the key belongs to that wallet): a caller guessing secrets
-- for a known key id never spends that key's allowance. Otherwise adds one to the window
-- p_window_index of the bucket 'key:<key_id>' (billing_rate_limit_window, an UNLOGGED table) and
-- returns its count after the charge. The window row's lock is the first its caller takes
-- (docs/decisions.md, "Lock order").
CREATE OR REPLACE FUNCTION billing_rate_limit_key_charge(
    p_key_id text, p_secret_hash text, p_window_index bigint, p_wallet_id text
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM billing_api_key k
                    WHERE k.key_id = p_key_id AND k.secret_hash = p_secret_hash AND k.status = 'active'
                      AND (p_wallet_id IS NULL OR k.wallet_id = p_wallet_id)) THEN
        RETURN NULL;
    END IF;
    INSERT INTO billing_rate_limit_window (bucket, window_index, count) VALUES ('key:' || p_key_id, p_window_index, 1)
        ON CONFLICT (bucket, window_index) DO UPDATE SET count = billing_rate_limit_window.count + EXCLUDED.count
        RETURNING count INTO n;
    RETURN n;
END;
$$;
