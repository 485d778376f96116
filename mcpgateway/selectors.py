"""Reads about a wallet's governed calls that apps below the gateway ask for (registered in ``mcpgateway.apps``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection

from billing.models import Wallet
from mcpgateway.models import Action, ActionState
from receipts.models import Outcome, Receipt, ReconciliationResult, ReconciliationStatus, RefundReconciliation

# One statement, so one snapshot: a call that moves on while it runs (claimed -> delivery_uncertain ->
# not executed -> refund owed -> refunded) is counted in exactly one state or has nothing more to refund.
_OPEN_CALLS_SQL = f"""
SELECT
  (SELECT count(*) FROM {Action._meta.db_table} a WHERE a.wallet_id = %(wallet)s AND a.state = %(claimed)s),
  (SELECT count(*) FROM {Receipt._meta.db_table} r
    WHERE r.wallet_id = %(wallet)s AND r.outcome = %(uncertain)s
      AND NOT EXISTS (SELECT 1 FROM {ReconciliationResult._meta.db_table} x WHERE x.receipt_id = r.receipt_id)),
  (SELECT count(*) FROM {RefundReconciliation._meta.db_table} i
    JOIN {Receipt._meta.db_table} r ON r.receipt_id = i.receipt_id
    WHERE r.wallet_id = %(wallet)s AND i.status = %(pending)s)
"""  # noqa: S608  (table names from the models, values bound)


def wallet_open_calls(wallet: Wallet) -> dict[str, int]:
    """The calls of ``wallet`` through which a refund may still come back to it, counted by state.

    ``calls_in_flight``: claimed and not finished (a failure is refunded when it ends, or by the sweeper);
    ``calls_awaiting_reconciliation``: ``delivery_uncertain`` with no reconciliation result yet (a "not
    executed" result owes a refund); ``refunds_owed``: refund items still pending.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _OPEN_CALLS_SQL,
            {
                "wallet": wallet.wallet_id,
                "claimed": ActionState.DISPATCH_CLAIMED,
                "uncertain": Outcome.DELIVERY_UNCERTAIN,
                "pending": ReconciliationStatus.PENDING,
            },
        )
        in_flight, awaiting, owed = cursor.fetchone()
    return {"calls_in_flight": in_flight, "calls_awaiting_reconciliation": awaiting, "refunds_owed": owed}


def console_figures(user: Any, now: datetime) -> dict[str, Any]:
    """The console index's gateway figure: receipted calls whose delivery is uncertain (``view_action``)."""
    if not user.has_perm("mcpgateway.view_action"):
        return {}
    return {"uncertain_actions": Action.objects.filter(state="delivery_uncertain", receipt__isnull=False).count()}
