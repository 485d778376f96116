-- permits_charge_policies: the policy bundles' rules for a charge (POST /v1/billing/charge, billing_charge).
--
-- A policy bundle binds its wallet and every wallet below it (docs/decisions.md, Authority). A
-- charge has a service category and an amount, no tool, so of a bundle's rules it meets
-- allowed_categories, max_credits_per_call (the charge's amount) and max_daily_credits; the tool
-- rules bind tool calls and human_approval_required binds permit issuance. The governed call's
-- authorization (permits.services.authorization.authorize) reads the same rules in Python, on rows
-- read before its claim; tests/test_charge_policies.py checks the two agree.
--
-- p_ancestry is the charged wallet's path (the sponsor first, the wallet last), p_amount the
-- charge's amount. Answers the enabled bundles of the line that matter, oldest first:
--   * a bundle the charge breaks without any lock ('allowed_categories': the category is not in
--     its list; 'max_credits_per_call': the amount is over it), with its limit (NULL for
--     categories). The first such row is the refusal; rows come before every cap row.
--   * otherwise each bundle's daily cap ('max_daily_credits'), with the wallet whose spend today it
--     caps (permits.services.authorization.daily_cap_wallet: a bundle on an agent caps that agent's
--     spend, which counts its subtree; one on the sponsor the agent line the charge comes from) and
--     the cap. The caller checks them after its debit, under the locks the debit took
--     (billing_daily_cap_over), so concurrent charges cannot pass a cap together.
CREATE OR REPLACE FUNCTION permits_charge_policies(p_ancestry text[], p_category text, p_amount numeric)
RETURNS TABLE (policy_id text, rule text, cap_wallet_id text, cap numeric)
LANGUAGE sql STABLE AS $$
    SELECT r.policy_id, r.rule, r.cap_wallet_id,
           CASE r.rule WHEN 'max_credits_per_call' THEN r.max_credits_per_call
                       WHEN 'max_daily_credits' THEN r.max_daily_credits END
      FROM (
        SELECT b.policy_id, b.created_at, b.max_credits_per_call, b.max_daily_credits,
               CASE WHEN b.max_credits_per_call IS NOT NULL AND p_amount > b.max_credits_per_call
                        THEN 'max_credits_per_call'
                    WHEN b.allowed_categories IS NOT NULL AND NOT (b.allowed_categories ? p_category)
                        THEN 'allowed_categories'
                    ELSE 'max_daily_credits' END AS rule,
               CASE WHEN b.wallet_id = p_ancestry[1] AND cardinality(p_ancestry) > 1 THEN p_ancestry[2]
                    ELSE b.wallet_id END AS cap_wallet_id
          FROM permits_policy_bundle b
         WHERE b.wallet_id = ANY(p_ancestry) AND b.enabled
      ) r
     WHERE r.rule <> 'max_daily_credits' OR r.max_daily_credits IS NOT NULL
     ORDER BY r.rule = 'max_daily_credits', r.created_at;
$$;
