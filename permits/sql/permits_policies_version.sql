-- permits_policies_version: a version of every policy bundle on a wallet's line, changed by any change to any of them.
--
-- p_ancestry is the wallet's path (its id and every ancestor's). The answer names each
-- bundle on those wallets (enabled or not) with where its current row version lives and
-- which transaction wrote it (xmin:ctid): creating, editing, enabling, disabling or
-- deleting any of them, however it is done, gives a different answer. The governed call
-- reads it with the policies and caches both per process; its claim (gateway_claim)
-- compares it again in the same statement that charges, so a call is never authorized
-- against policies that changed since they were read.
CREATE OR REPLACE FUNCTION permits_policies_version(p_ancestry text[])
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(b.policy_id || '@' || b.xmin::text || ':' || b.ctid::text, ',' ORDER BY b.policy_id), '')
      FROM permits_policy_bundle b
     WHERE b.wallet_id = ANY(p_ancestry);
$$;
