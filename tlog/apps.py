"""The transparency log app: every signed statement of a tenant as a leaf of its Merkle tree (docs/audit-chain.md)."""

from __future__ import annotations

from django.apps import AppConfig


class TlogConfig(AppConfig):
    name = "tlog"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit.chain_verification import checkpoint_recorded_register
        from tlog.services import tlog_chain_checkpoint_append

        checkpoint_recorded_register(tlog_chain_checkpoint_append)
