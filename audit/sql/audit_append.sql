-- audit_append: link one audit event into its chain and store it. The one copy of the chain-link rule.
--
-- Python builds the event's canonical bytes (RFC 8785, audit.canonical) around its sequence
-- number, the only part it cannot know before it holds the chain head:
-- p_prefix || <seq in decimal> || p_suffix is exactly the canonical payload. This function
-- locks the chain head (creating it at the genesis hash, 64 zeros, the first time), takes the
-- next sequence number, computes the link as audit.canonical.chain_hash does in Python,
-- sha256(previous hash as 32 raw bytes || payload), with PostgreSQL's sha256(), inserts the
-- event and moves the head. The format is docs/audit-chain.md's: verify-chain, checkpoints and
-- the offline verifiers recompute the same hashes.
--
-- Callers: audit.services (audit_record, audit_append_prepared), billing_charge, gateway_claim
-- and gateway_finish, each inside the transaction of the change the event records.
-- Lock order: the chain head is the last lock a transaction takes (docs/decisions.md, "Lock
-- order"), so it is held from here to the commit only.
--
-- The chain is the tenant's (p_tenant_id; 'system' for events of no tenant): any other chain is refused
-- (SQLSTATE TGTN1), so the rows it touches are the tenant's.
-- Assumes: the server encoding is UTF8 (the sequence number is converted to UTF-8 bytes).
CREATE OR REPLACE FUNCTION audit_append(
    p_chain text,
    p_event_id text,
    p_event text,
    p_tenant_id text,
    p_wallet_id text,
    p_key_id text,
    p_tool text,
    p_endpoint text,
    p_policy_decision_id text,
    p_request_id text,
    p_ok boolean,
    p_detail jsonb,
    p_created_at timestamptz,
    p_prefix bytea,
    p_suffix bytea,
    OUT event_seq bigint,
    OUT event_prev_hash text,
    OUT event_hash text
)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_chain IS DISTINCT FROM COALESCE(p_tenant_id, 'system') THEN  -- a tenant's events go to its own chain only
        RAISE EXCEPTION 'audit_append: chain % is not the chain of tenant %', p_chain, p_tenant_id USING ERRCODE = 'TGTN1';
    END IF;
    SELECT h.seq + 1, h.head_hash INTO event_seq, event_prev_hash
      FROM audit_chain_head h WHERE h.chain = p_chain FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        INSERT INTO audit_chain_head (chain, seq, head_hash, updated_at)
        VALUES (p_chain, 0, repeat('0', 64), p_created_at) ON CONFLICT (chain) DO NOTHING;
        SELECT h.seq + 1, h.head_hash INTO event_seq, event_prev_hash
          FROM audit_chain_head h WHERE h.chain = p_chain FOR NO KEY UPDATE;
    END IF;
    event_hash := encode(
        sha256(decode(event_prev_hash, 'hex') || p_prefix || convert_to(event_seq::text, 'UTF8') || p_suffix), 'hex'
    );
    INSERT INTO audit_event (event_id, chain, seq, event, tenant_id, wallet_id, key_id, tool, endpoint,
                             policy_decision_id, request_id, ok, detail, created_at, prev_hash, hash)
    VALUES (p_event_id, p_chain, event_seq, p_event, p_tenant_id, p_wallet_id, p_key_id, p_tool, p_endpoint,
            p_policy_decision_id, p_request_id, p_ok, p_detail, p_created_at, event_prev_hash, event_hash);
    UPDATE audit_chain_head SET seq = event_seq, head_hash = event_hash, updated_at = p_created_at
     WHERE chain = p_chain;
END;
$$;


-- audit_append_in: audit_append for an event passed as one record, audit's audit_event_in shape.
--
-- p_event is the JSON object audit.services.PreparedEvent.record_in builds (the one constructor of the
-- shape): chain, event_id, event, tenant_id, wallet_id, key_id, tool, endpoint, policy_decision_id,
-- request_id, ok, detail (a JSON object), created_at (ISO 8601 with its offset), prefix and suffix
-- (the canonical bytes around the seq, in hex). Other apps' database functions (gateway_claim,
-- gateway_finish) append an event they were handed with this, never with audit_append's positional
-- arguments. Refuses (SQLSTATE TGTN1), writing nothing, an event of another tenant than p_tenant_id
-- (its tenant_id, or its chain, is not p_tenant_id): a caller appends only to the chain of the tenant
-- it acts for.
CREATE OR REPLACE FUNCTION audit_append_in(
    p_tenant_id text,
    p_event jsonb,
    OUT event_seq bigint,
    OUT event_prev_hash text,
    OUT event_hash text
)
LANGUAGE plpgsql AS $$
DECLARE
    appended record;
BEGIN
    IF p_event->>'tenant_id' IS DISTINCT FROM p_tenant_id OR p_event->>'chain' IS DISTINCT FROM p_tenant_id THEN
        RAISE EXCEPTION 'audit_append_in: the event is not of tenant %', p_tenant_id USING ERRCODE = 'TGTN1';
    END IF;
    appended := audit_append(
        p_event->>'chain', p_event->>'event_id', p_event->>'event', p_tenant_id, p_event->>'wallet_id',
        p_event->>'key_id', p_event->>'tool', p_event->>'endpoint', p_event->>'policy_decision_id',
        p_event->>'request_id', (p_event->>'ok')::boolean, p_event->'detail', (p_event->>'created_at')::timestamptz,
        decode(p_event->>'prefix', 'hex'), decode(p_event->>'suffix', 'hex')
    );
    event_seq := appended.event_seq; event_prev_hash := appended.event_prev_hash; event_hash := appended.event_hash;
END;
$$;
