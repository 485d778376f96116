-- permits_policy_verdict: the one judge of the policy bundles' rules, for a tool call and for a charge.
--
-- A policy bundle binds its wallet and every wallet below it (docs/decisions.md, Authority). Called by
-- the governed call's lookup (mcpgateway.services.lookup, in the round trip that reads the call's rows,
-- with the tool, its category and its price or the quote's) and by billing_charge (POST
-- /v1/billing/charge: no tool, p_tool NULL, so the tool rules do not bind it). Python does not restate
-- these rules: permits.services.authorization turns this answer into the refusal (PolicyDenied) or the
-- daily caps the claim checks; billing.refusals turns billing_charge's 'policy_denied' into
-- ChargePolicyDenied.
--
-- p_tenant_id: the tenant whose bundles are read (only its rows); p_ancestry: the wallet's path (the
-- sponsor first, the wallet last); p_tool: the tool called (NULL for a charge); p_server: the slug of
-- the tool's upstream server (NULL for a charge, or a tool of no server); p_category: the tool's or
-- the charge's service category; p_amount: the call's price or the charge's amount; p_permit: the
-- permit's signed statement (NULL for a charge), which the caller verifies before it acts on the answer.
--
-- Each enabled bundle of the line is judged on its rules in this order, the first broken one naming
-- the refusal (no lock is needed for any of them):
--   'human_approval_required' the bundle requires human approval and the permit was issued by a
--                          wallet's key (its statement names an issuer wallet) without a signed
--                          approval: none can be issued now and the bundle revoked those it found,
--                          so one still here had its row edited; such refusals come before all others;
--   'denied_tools'         the tool matches a pattern of the list;
--   'allowed_tools'        the list is set (not NULL) and the tool matches none of its patterns;
--   'allowed_servers'      a tool call, the list is set and the tool's server is not in it (a tool
--                          of no server, local or the single configured upstream, is in no list);
--   'max_credits_per_call' p_amount is over it (cap: the limit);
--   'allowed_categories'   the list is set and p_category is not in it (a NULL category is not in it).
-- A pattern is '*' (any tool), a tool's exact name, or 'prefix.*' (every tool whose name starts with
-- 'prefix.'). Answers the refusing bundles first, oldest first after those refusing an unapproved
-- permit (the first row is the refusal), then,
-- when none refuses, each bundle's daily cap ('max_daily_credits'), oldest first, with the wallet whose
-- spend today it caps (cap_wallet_id: a bundle on the sponsor caps the agent line the call comes from,
-- p_ancestry[2]; any other its own wallet, whose spend counts its subtree) and the cap. A daily cap is
-- checked by the caller after its debit, under the locks the debit took (billing_daily_cap_over), so
-- concurrent calls cannot pass it together.
CREATE OR REPLACE FUNCTION permits_policy_verdict(
    p_tenant_id text, p_ancestry text[], p_tool text, p_server text, p_category text, p_amount numeric,
    p_permit jsonb
)
RETURNS TABLE (policy_id text, rule text, cap_wallet_id text, cap numeric)
LANGUAGE sql STABLE AS $$
    SELECT r.policy_id, r.rule, r.cap_wallet_id,
           CASE r.rule WHEN 'max_credits_per_call' THEN r.max_credits_per_call
                       WHEN 'max_daily_credits' THEN r.max_daily_credits END
      FROM (
        SELECT b.policy_id, b.created_at, b.max_credits_per_call, b.max_daily_credits,
               CASE WHEN b.human_approval_required AND p_permit->>'issuer_wallet_id' IS NOT NULL
                         AND coalesce(p_permit->'approval', 'null'::jsonb) = 'null'::jsonb
                        THEN 'human_approval_required'
                    WHEN p_tool IS NOT NULL AND EXISTS (
                             SELECT 1 FROM jsonb_array_elements_text(
                                 CASE jsonb_typeof(b.denied_tools) WHEN 'array' THEN b.denied_tools END) AS d(pattern)
                              WHERE d.pattern IN ('*', p_tool)
                                 OR (right(d.pattern, 2) = '.*' AND starts_with(p_tool, left(d.pattern, -1))))
                        THEN 'denied_tools'
                    WHEN p_tool IS NOT NULL AND jsonb_typeof(b.allowed_tools) = 'array' AND NOT EXISTS (
                             SELECT 1 FROM jsonb_array_elements_text(b.allowed_tools) AS a(pattern)
                              WHERE a.pattern IN ('*', p_tool)
                                 OR (right(a.pattern, 2) = '.*' AND starts_with(p_tool, left(a.pattern, -1))))
                        THEN 'allowed_tools'
                    WHEN p_tool IS NOT NULL AND jsonb_typeof(b.allowed_servers) = 'array'
                         AND NOT coalesce(b.allowed_servers ? p_server, false)
                        THEN 'allowed_servers'
                    WHEN b.max_credits_per_call IS NOT NULL AND p_amount > b.max_credits_per_call
                        THEN 'max_credits_per_call'
                    WHEN jsonb_typeof(b.allowed_categories) = 'array'
                         AND NOT coalesce(b.allowed_categories ? p_category, false)
                        THEN 'allowed_categories'
                    ELSE 'max_daily_credits' END AS rule,
               CASE WHEN b.wallet_id = p_ancestry[1] AND cardinality(p_ancestry) > 1 THEN p_ancestry[2]
                    ELSE b.wallet_id END AS cap_wallet_id
          FROM permits_policy_bundle b
         WHERE b.wallet_id = ANY(p_ancestry) AND b.enabled AND b.tenant_id = p_tenant_id
      ) r
     WHERE r.rule <> 'max_daily_credits' OR r.max_daily_credits IS NOT NULL
     ORDER BY r.rule = 'max_daily_credits', r.rule <> 'human_approval_required', r.created_at, r.policy_id;
$$;
