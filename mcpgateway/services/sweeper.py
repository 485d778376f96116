"""The sweeper: claims a worker never finished become ``delivery_uncertain`` with their receipt; nothing is re-sent.

A claim of a local tool is the exception: the tool runs inside the transaction that finishes its
action (``finish._phase3_local``), so a claim still open did not run, and it is refunded."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from mcpgateway.models import Action, ActionState, McpSession, Tool, ToolSource
from mcpgateway.services.finish import _alert_uncertain, _finish, _refund_and_finish
from receipts.models import Outcome


def sweep_threshold() -> timedelta:
    """Claims older than this are lost: the dispatch timeout (connect + twice the read timeout) plus a margin.

    The settings' timeouts: a call claimed on an upstream server waits that server's instead
    (``action_sweep``).

    Phase 2 sends no call later than connect + half the margin after its claim
    (``dispatch.send_deadline``), so a call sent is answered, or timed out, before the sweep.
    """
    seconds = settings.UPSTREAM_CONNECT_TIMEOUT + 2 * settings.UPSTREAM_READ_TIMEOUT + settings.SWEEP_MARGIN_SECONDS
    return timedelta(seconds=seconds)


def action_sweep(*, older_than: timedelta | None = None, limit: int = 500) -> list[str]:
    """Turn stale ``dispatch_claimed`` actions into ``delivery_uncertain`` with receipt, audit and alert.

    Stale: claimed longer ago than ``older_than``, or by default than the timeouts of the server
    the action was claimed on (connect + 2 x read) plus ``SWEEP_MARGIN_SECONDS``.

    Nothing is re-sent. Each action is settled in its own transaction under its
    row lock (``SKIP LOCKED``: a worker finishing it right now wins).
    """
    now = timezone.now()
    claimed = Action.objects.filter(state=ActionState.DISPATCH_CLAIMED)
    if older_than is not None:
        claimed = claimed.filter(claimed_at__lt=now - older_than)
    else:
        # Each claim waits its own server's timeouts as claimed (connect + 2 x read, the settings' for a
        # tool without a server) plus the margin; every threshold is above the margin alone.
        claimed = claimed.filter(claimed_at__lt=now - timedelta(seconds=settings.SWEEP_MARGIN_SECONDS)).filter(
            claimed_at__lt=now
            - ExpressionWrapper(
                Coalesce(F("upstream_connect_timeout"), Value(float(settings.UPSTREAM_CONNECT_TIMEOUT)))
                * Value(timedelta(seconds=1))
                + 2
                * Coalesce(F("upstream_read_timeout"), Value(float(settings.UPSTREAM_READ_TIMEOUT)))
                * Value(timedelta(seconds=1))
                + Value(timedelta(seconds=settings.SWEEP_MARGIN_SECONDS)),
                output_field=DurationField(),
            )
        )
    swept: list[str] = []
    candidates = list(claimed.order_by("claimed_at").values_list("action_id", flat=True)[:limit])
    for action_id in candidates:
        with transaction.atomic(durable=True):
            locked = (
                Action.objects.select_for_update(no_key=True, of=("self",), skip_locked=True)
                .select_related("permit", "ledger_entry", "wallet")
                .filter(action_id=action_id, state=ActionState.DISPATCH_CLAIMED)
                .first()
            )
            if locked is None:
                continue
            price = locked.price or Decimal(0)
            if Tool.objects.filter(service_id=locked.tool, source=ToolSource.LOCAL).exists():
                _refund_and_finish(
                    locked,
                    price=price,
                    reason_code="dispatch_lost",
                    message=(
                        "The worker stopped after claiming this call and before the local tool ran (it runs in "
                        "the transaction that records its outcome): it did not run, and the charge is refunded."
                    ),
                    extra={},
                    response_hash="",
                    audit_detail={"swept": True, "local_tool": True},
                )
                swept.append(action_id)
                continue
            _finish(
                locked,
                state=ActionState.DELIVERY_UNCERTAIN,
                outcome=Outcome.DELIVERY_UNCERTAIN,
                reason_code="dispatch_lost",
                message=(
                    "The gateway lost track of this dispatch (the worker stopped after claiming it). It was "
                    "not re-sent; the charge is kept pending external reconciliation."
                ),
                credits_authorized=price,
                credits_charged=price,
                endpoint="sweeper",
                audit_detail={"swept": True},
            )
            _alert_uncertain(locked, "dispatch lost: the worker stopped after claiming it")
            swept.append(action_id)
    return swept


def session_cutoff() -> datetime:
    """MCP handshake sessions created before this have expired (``MCP_SESSION_TTL_SECONDS``)."""
    return timezone.now() - timedelta(seconds=settings.MCP_SESSION_TTL_SECONDS)


def mcp_sessions_purge() -> int:
    """Delete ended and expired MCP sessions (a session is one row per initialize); how many went."""
    deleted, _ = McpSession.objects.filter(Q(ended_at__isnull=False) | Q(created_at__lte=session_cutoff())).delete()
    return deleted
