"""The transparency log's tables: pending leaves, leaves, stored subtree hashes, each tenant's log head, the log key.

One log per tenant (docs/audit-chain.md, "The transparency log"). A governed call only appends a
``PendingLeaf`` (a trigger on the statement's table, in the statement's own INSERT); the integrator
(``tlog.services.tlog_integrate``) gives pending leaves their index, stores the hashes of the complete
subtrees they close and signs the tenant's checkpoint, all in one transaction.
"""

from __future__ import annotations

from django.db import models


class PendingLeaf(models.Model):
    """A statement waiting for its index in its tenant's log (written by ``tlog_leaf_pending``, tlog/sql).

    ``leaf`` is empty for a statement the integrator reads back from its own table (``tlog.kinds``),
    and holds the bytes for a statement no table keeps (an audit-chain checkpoint).
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=40)
    kind = models.CharField(max_length=32)
    statement_id = models.CharField(max_length=64)
    leaf = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "tlog_pending_leaf"
        # One index besides the key, the integrator's (a tenant's oldest first): every statement's INSERT
        # pays for it. A pending proof's lookup by statement id walks the same index: a tenant holds only
        # a few seconds' worth of pending leaves.
        indexes = [models.Index(fields=["tenant_id", "id"], name="tlog_pending_tenant")]

    def __str__(self) -> str:
        return f"{self.kind} {self.statement_id} (pending)"


class Leaf(models.Model):
    """Leaf ``idx`` of a tenant's log: the statement's kind and id and the leaf bytes (its signed canonical bytes)."""

    pk = models.CompositePrimaryKey("tenant_id", "idx")
    tenant_id = models.CharField(max_length=40)
    idx = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    statement_id = models.CharField(max_length=64)
    leaf = models.BinaryField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "tlog_leaf"
        constraints = [
            models.UniqueConstraint(fields=["statement_id", "tenant_id"], name="tlog_leaf_statement_unique"),
            models.CheckConstraint(condition=models.Q(idx__gte=0), name="tlog_leaf_idx_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}#{self.idx} {self.kind} {self.statement_id}"


class TreeHash(models.Model):
    """The hash of the complete subtree of ``2**level`` leaves starting at leaf ``idx * 2**level``.

    Written once when the subtree is complete, never changed: what ``merkle.HashReader`` reads, so a
    proof is O(log n) rows, and what a tile is made of.
    """

    pk = models.CompositePrimaryKey("tenant_id", "level", "idx")
    tenant_id = models.CharField(max_length=40)
    level = models.SmallIntegerField()
    idx = models.BigIntegerField()
    hash = models.BinaryField()

    class Meta:
        db_table = "tlog_tree_hash"

    def __str__(self) -> str:
        return f"{self.tenant_id} ({self.level}, {self.idx})"


class Log(models.Model):
    """A tenant's log head: its size, root hash, latest signed checkpoint and the witnesses' cosignature lines."""

    tenant_id = models.CharField(max_length=40, primary_key=True)
    size = models.BigIntegerField(default=0)
    root_hash = models.BinaryField()
    checkpoint = models.TextField()
    cosignatures = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "tlog_log"

    def __str__(self) -> str:
        return f"{self.tenant_id}@{self.size}"


class LogKey(models.Model):
    """The public half of the Ed25519 note key that signs every tenant's checkpoints (under each log's origin)."""

    public_key = models.CharField(max_length=64, primary_key=True, help_text="Raw 32-byte Ed25519 key, base64.")
    created_at = models.DateTimeField()

    class Meta:
        db_table = "tlog_log_key"

    def __str__(self) -> str:
        return self.public_key


class WitnessStatus(models.TextChoices):
    OK = "ok"
    BACKING_OFF = "backing_off"


class WitnessState(models.Model):
    """One configured witness's standing with the integrator: answering, or skipped until ``retry_at``
    after ``failures`` consecutive failures to answer (tlog.witnesses; docs/audit-chain.md)."""

    name = models.CharField(max_length=200, primary_key=True, help_text="The witness's name in TLOG_WITNESSES.")
    status = models.CharField(max_length=16, choices=WitnessStatus.choices)
    failures = models.IntegerField(default=0, help_text="Consecutive failures to answer (0 once it answers).")
    retry_at = models.DateTimeField(null=True, blank=True, help_text="Skipped until then while backing off.")
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "tlog_witness_state"

    def __str__(self) -> str:
        return f"{self.name} {self.status}"
