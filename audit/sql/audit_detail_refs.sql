-- audit_detail_refs: the part of an audit event's detail that the audit search looks up; the expression
-- of the GIN index audit_detail_refs_path_ops (migration audit.0012).
--
-- The API's and the console's filters find events by actor and by the id of an object an event is
-- about (audit.selectors: actor_q, object_id_q; docs/decisions.md, "Audit events are found by actor,
-- event name and object id"). Those are the detail's top-level keys listed below: the actor and
-- audit.selectors.OBJECT_ID_DETAIL_KEYS (tests/test_audit_search_index.py keeps the two lists equal).
-- This function answers the detail narrowed to them, as text, JSON nulls left out, so the index holds
-- one entry for each id an event names and none for its amounts, URLs or outcomes: a governed call's
-- two events add six entries to the index instead of eighteen (docs/decisions.md, "The audit search
-- index holds the ids only"). For each listed key and a string s, detail @> {"key": s} holds exactly
-- when audit_detail_refs(detail) @> {"key": s} does, so the filters ask the narrowed detail.
--
-- One expression of IMMUTABLE functions only, so PostgreSQL inlines it, in the index and in a query
-- alike, and matches the two (a body it cannot inline costs a function call per insert, more than
-- the entries it saves). Never raises: a detail that is not an object answers '{}'. The index holds
-- what the body answered when each row was written: a migration that changes the body rebuilds the
-- index (REINDEX INDEX audit_detail_refs_path_ops) in the same transaction.
CREATE OR REPLACE FUNCTION audit_detail_refs(p_detail jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_strip_nulls(jsonb_object(
        ARRAY['actor', 'policy_id', 'permit_id', 'receipt_id', 'quote_id', 'action_id', 'request_id', 'key_id',
              'new_key_id', 'old_key_id', 'revoked_key_id', 'subject_key_id', 'operator_key_id', 'entry_id',
              'ledger_entry_id', 'refund_entry_id', 'transaction_id', 'parent_wallet_id', 'note_id', 'alert_id'],
        ARRAY[p_detail->>'actor', p_detail->>'policy_id', p_detail->>'permit_id', p_detail->>'receipt_id',
              p_detail->>'quote_id', p_detail->>'action_id', p_detail->>'request_id', p_detail->>'key_id',
              p_detail->>'new_key_id', p_detail->>'old_key_id', p_detail->>'revoked_key_id',
              p_detail->>'subject_key_id', p_detail->>'operator_key_id', p_detail->>'entry_id',
              p_detail->>'ledger_entry_id', p_detail->>'refund_entry_id', p_detail->>'transaction_id',
              p_detail->>'parent_wallet_id', p_detail->>'note_id', p_detail->>'alert_id']
    ))
$$;
