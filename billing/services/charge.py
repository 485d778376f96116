"""POST /v1/billing/charge: ``wallet_charge``.

Charge idempotency. ``wallet_charge`` takes an optional key, scoped by wallet.
The key row (request hash and the stored response) is written in the debit's
transaction, so it exists exactly when the debit committed. The same key and
parameters replay the stored response; other parameters are the idempotency
conflict (422), with nothing written. A concurrent duplicate waits on the
wallet row lock, then finds the committed row and replays. A refused charge
(402, 403) writes nothing, so it does not burn the key: the client may retry
the same key once the wallet can pay. The velocity freeze is the one write that
survives a refusal; it commits in its own transaction after the refused debit
rolled back. The charge endpoint is one statement, the database function
``billing_charge`` (billing/sql/billing_charge.sql); charges of one wallet that
meet in a gateway process share one commit (group commit, ``_charge_row_grouped``;
those that carry a key's rate-limit charge, with the same key's charges of the
same window, ``_batch_group``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Unpack

from django.db import DatabaseError, connection
from django.utils import timezone

from access.ratelimit import DeferredCharge, DeferredRefused
from access.selectors import Principal
from audit.models import AuditEvent
from audit.services import EventFields, audit_event_prepare
from billing.exceptions import VelocityLimitExceeded, money
from billing.models import DEFAULT_CATEGORY_PRICES, LedgerKind, ServiceCategory, SystemAccount, Wallet
from billing.refusals import DEBIT_REFUSALS
from billing.serializers import charge_response_in_order, charge_response_template
from billing.services.ledger import (
    DEBIT_COLUMNS,
    VELOCITY_DAY_LIMIT,
    VELOCITY_HOUR_LIMIT,
    ledger_event_detail,
    refusal_for_viewer,
    to_money,
)
from billing.services.wallets import wallet_freeze_for_velocity
from common import dbretry, fastsql
from common.cache import BoundedCache
from common.canonical import canonical_bytes_fast
from common.errors import (
    NotFound,
    WalletAccessDenied,
    is_retryable,
)
from common.idempotency import request_hash
from common.ids import new_id
from common.refusals import RefusedCall, refusal_exception
from config.middleware import get_request_id


@dataclass(frozen=True)
class ChargeOutcome:
    """The HTTP status and body of a charge, and whether they are a replay of a stored response."""

    status: int
    body: dict[str, Any]
    replayed: bool


def charge_request_hash(
    *, wallet_id: str, service_category: str, units: Decimal, request_path: str, description: str
) -> str:
    """SHA-256 of the canonical JSON of the charge's parameters (what an idempotency key binds)."""
    return request_hash(
        {
            "operation": "billing.charge",
            "wallet_id": wallet_id,
            "service_category": service_category,
            "units": money(units),
            "request_path": request_path,
            "description": description,
        }
    )


CHARGE_ENDPOINT = "/v1/billing/charge"
# billing_charge's last arguments: the deferred rate-limit charge (access.ratelimit), NULLs without one.
_RATE_ARGUMENTS = ("k_key_id", "k_secret_hash", "k_window_index", "k_limit")
# The arguments of billing_charge (billing/sql/billing_charge.sql) in order, with the casts they need.
CHARGE_ARGUMENTS = (
    "p_wallet_id",
    "p_tenant_id",
    "p_reach_wallet_id",
    "p_category",
    "p_default_price",
    "p_units",
    "p_description",
    "p_request_path",
    "p_correlation_id",
    "p_now",
    "p_ids",
    "p_hour_limit",
    "p_day_limit",
    "p_idempotency_key",
    "p_request_hash",
    "p_body",
    "p_key_id",
    "p_endpoint",
    "p_request_id",
    "p_charge_event_id",
    "p_charge_created_at",
    "p_charge_detail",
    "p_charge_parts",
    "p_refill_event_id",
    "p_refill_created_at",
    "p_refill_detail",
    "p_refill_parts",
    *_RATE_ARGUMENTS,
)
_CASTS = {
    "p_ids": "::text[]",
    "p_body": "::jsonb",
    "p_charge_detail": "::jsonb",
    "p_charge_parts": "::bytea[]",
    "p_refill_created_at": "::timestamptz",
    "p_refill_detail": "::jsonb",
    "p_refill_parts": "::bytea[]",
}
# Its answer (OUT parameters): billing_debit's columns, then its own.
CHARGE_COLUMNS = (*DEBIT_COLUMNS, "unit_price", "charged", "response_status", "body", "rate_count")
CHARGE_SQL = (
    f"SELECT {', '.join(CHARGE_COLUMNS)} FROM billing_charge("  # noqa: S608
    + ", ".join(f"%s{_CASTS.get(name, '')}" for name in CHARGE_ARGUMENTS)
    + ")"
)
# billing_charge raises it when the debit posted a refill whose audit event was not prepared.
_REFILL_EVENT_NEEDED = "TGRF1"
# A figure the database writes into an audit event, and its canonical JSON (RFC 8785 escapes the NULs,
# and the key before it anchors it: a quote inside a string is always escaped, so '"key":' followed
# by these bytes occurs only where the detail holds the placeholder).
_LATE = "\x00late\x00"
_LATE_JSON = canonical_bytes_fast(_LATE)


@dataclass(frozen=True)
class LateEvent:
    """An audit event ready for ``billing_charge``, whose ``late`` detail figures the database writes.

    ``parts`` are the event's canonical bytes before its seq, cut where each late value goes
    (in key order, each cut ending with ``"key":``), then the bytes after the seq: the database
    joins them with the values it writes and hands the two halves to ``audit_append``.
    """

    record: AuditEvent
    detail: dict[str, Any]
    parts: list[bytes]


def late_event_prepare(*, late: tuple[str, ...], **fields: Unpack[EventFields]) -> LateEvent:
    """Prepare an event (``audit_event_prepare``) with placeholders for the ``late`` keys of its detail.

    ``detail`` must hold the placeholder ``_LATE`` at each late key, at its top level. The
    canonical bytes are Python's (the one encoder); the database only splices values that are
    canonical by construction (billing/sql/billing_charge.sql).
    """
    prepared = audit_event_prepare(**fields)
    parts: list[bytes] = []
    rest = prepared.prefix
    for key in sorted(late):
        marker = b'"' + key.encode() + b'":'
        head, found, rest = rest.partition(marker + _LATE_JSON)
        if not found or marker + _LATE_JSON in rest:
            raise AssertionError(f"the event's canonical bytes do not hold the placeholder of {key!r} once")
        parts.append(head + marker)
    parts.extend((rest, prepared.suffix))
    detail = {key: value for key, value in prepared.record.detail.items() if key not in late}
    return LateEvent(prepared.record, detail, parts)


def _charge_events(
    *,
    ids: tuple[str, ...],
    wallet_id: str,
    tenant_id: str,
    service_category: str,
    request_path: str,
    actor_key_id: str,
    correlation_id: str,
    refill: bool,
) -> tuple[LateEvent, LateEvent | None]:
    """The ledger.charge event (and ledger.refill with ``refill``), as ``ledger_audit`` writes them."""

    def event(kind: str, *, late: tuple[str, ...], entry_id: str, transaction_id: str, **detail: Any) -> LateEvent:
        """The ``ledger.<kind>`` event of one entry: ``billing_charge`` fills in its amount and balance after,
        and each key of ``late``."""
        return late_event_prepare(
            late=("amount", "balance_after", *late),
            event=f"ledger.{kind}",
            ok=True,
            tenant_id=tenant_id,
            wallet_id=wallet_id,
            key_id=actor_key_id or None,
            endpoint=CHARGE_ENDPOINT,
            request_id=correlation_id or None,
            detail=ledger_event_detail(
                entry_id=entry_id,
                transaction_id=transaction_id,
                kind=kind,
                amount=_LATE,
                balance_after=_LATE,
                **detail,
            ),
        )

    refill_event = None
    if refill:  # prepared first: it is appended first
        refill_event = event(
            LedgerKind.REFILL.value, late=("counterparty",), entry_id=ids[5], transaction_id=ids[3], counterparty=_LATE
        )
    charge_event = event(
        LedgerKind.CHARGE.value,
        late=(),
        entry_id=ids[1],
        transaction_id=ids[0],
        counterparty=SystemAccount.REVENUE.value,
        service_category=service_category,
        request_path=request_path,
    )
    return charge_event, refill_event


def wallet_charge(
    *,
    wallet: Wallet | str,
    service_category: str = ServiceCategory.OTHER,
    units: Decimal | int = 1,
    request_path: str = "",
    description: str = "",
    idempotency_key: str | None = None,
    actor_key_id: str = "",
    correlation_id: str = "",
    caller: Principal | None = None,
    deferred: DeferredCharge | None = None,
) -> ChargeOutcome:
    """Charge ``price(service_category) * units`` from ``wallet`` to revenue (POST /v1/billing/charge).

    One statement, ``billing_charge`` (billing/sql/billing_charge.sql), which in autocommit is its
    own transaction: the wallet's reach, the idempotency record, the price, the debit
    (``billing_debit``), the record's insert and the audit events. Idempotent per (wallet,
    ``idempotency_key``) as the module docstring describes; a refused charge writes nothing. On a
    velocity refusal, commits the freeze in a second transaction before the refusal propagates.

    With ``caller`` (the API), a wallet key must reach the wallet (403 ``wallet_access_denied``,
    also for an unknown wallet) and an operator gets 404 for an unknown wallet, as
    ``selectors.wallet_for_caller`` answers; without it the caller has checked access.
    Owns its transaction: refuses to run inside another one (tests' transactions excepted).

    With ``deferred`` (the API, for a key the process authenticated before), the statement also
    checks the key and charges its rate-limit window (``access.ratelimit``); past the limit it
    raises ``DeferredRefused`` with nothing charged, and a key that no longer checks out is charged
    on the rate limiter's path (which may refuse it) before the charge runs without it.
    """
    _require_own_transaction("wallet_charge")
    wallet_id = wallet.wallet_id if isinstance(wallet, Wallet) else wallet
    reach = caller.wallet_id if caller is not None and not caller.is_operator else None
    if reach is not None:
        tenant_id = caller.tenant_id if caller is not None else None  # the wallet must be in the key's tenant
    elif isinstance(wallet, Wallet):
        tenant_id = wallet.tenant_id
    else:  # an operator: the tenant (the events' chain) comes from the wallet
        tenant_id = Wallet.objects.filter(wallet_id=wallet_id).values_list("tenant_id", flat=True).first()
        if tenant_id is None:
            raise NotFound("No such wallet.", wallet_id=wallet_id)
    if tenant_id is None:
        raise WalletAccessDenied(wallet_id=wallet_id)
    call = charge_call(
        wallet_id=wallet_id,
        tenant_id=tenant_id,
        reach_wallet_id=reach,
        service_category=service_category,
        units=to_money(Decimal(units)),
        request_path=request_path,
        description=description,
        idempotency_key=idempotency_key,
        actor_key_id=actor_key_id,
        correlation_id=correlation_id,
    )
    if deferred is not None and not deferred.settled:
        key_id, digest, window_index, limit = deferred.claim_params()
        call = dataclasses.replace(call, rate=(key_id, digest, window_index, limit))
    try:
        try:
            return _charge(call, deferred)
        except _KeyStale:
            assert deferred is not None
            deferred.fresh_key()  # charged as at the request's start (DeferredRefused when refused)
            return _charge(dataclasses.replace(call, rate=None))
    except VelocityLimitExceeded as exc:
        wallet_freeze_for_velocity(exc=exc, actor_key_id=actor_key_id)
        raise


def _require_own_transaction(name: str) -> None:
    """What ``transaction.atomic(durable=True)`` checks, for a service that is one statement in autocommit."""
    blocks = connection.atomic_blocks
    if blocks and not getattr(blocks[-1], "_from_testcase", False):
        raise RuntimeError(f"{name} owns its transaction; it cannot run inside another one")


def _bytea_array(parts: list[bytes]) -> str:
    """``parts`` as a PostgreSQL ``bytea[]`` literal (quoted hex elements).

    psycopg adapts a Python list element by element in Python, which cost more CPU than the rest
    of the charge's arguments together; the literal is one string, parsed by the server.
    """
    return "{" + ",".join('"\\\\x' + part.hex() + '"' for part in parts) + "}"


@dataclass(frozen=True)
class ChargeCall:
    """One prepared call of ``billing_charge``: what only Python does (ids, time, hash, body, events).

    ``arguments`` gives the function's arguments by name (``CHARGE_ARGUMENTS`` order), preparing
    the audit events' canonical bytes; the ledger.refill event only with ``refill_event``.
    """

    wallet_id: str
    tenant_id: str
    reach_wallet_id: str | None
    service_category: str
    units: Decimal
    description: str
    request_path: str
    correlation_id: str
    idempotency_key: str | None
    request_hash: str
    actor_key_id: str
    now: datetime
    ids: tuple[str, str, str, str, str, str]
    body: dict[str, Any]
    # The deferred rate-limit charge's key, secret digest, window and limit (access.ratelimit), or None.
    rate: tuple[str, str, int, int] | None = None

    def arguments(self, *, refill_event: bool) -> dict[str, Any]:
        """``billing_charge``'s arguments by name; each call prepares the events anew (new event ids)."""
        charge, refill = _charge_events(
            ids=self.ids,
            wallet_id=self.wallet_id,
            tenant_id=self.tenant_id,
            service_category=self.service_category,
            request_path=self.request_path,
            actor_key_id=self.actor_key_id,
            correlation_id=self.correlation_id,
            refill=refill_event,
        )
        event = charge.record
        return {
            "p_wallet_id": self.wallet_id,
            "p_tenant_id": self.tenant_id,
            "p_reach_wallet_id": self.reach_wallet_id,
            "p_category": self.service_category,
            "p_default_price": DEFAULT_CATEGORY_PRICES.get(self.service_category),
            "p_units": self.units,
            "p_description": self.description,
            "p_request_path": self.request_path,
            "p_correlation_id": self.correlation_id,
            "p_now": self.now,
            "p_ids": "{" + ",".join(self.ids) + "}",  # ids are [A-Za-z0-9_]: an array literal needs no quoting
            "p_hour_limit": VELOCITY_HOUR_LIMIT,
            "p_day_limit": VELOCITY_DAY_LIMIT,
            "p_idempotency_key": self.idempotency_key,
            "p_request_hash": self.request_hash,
            "p_body": json.dumps(self.body),
            "p_key_id": event.key_id,
            "p_endpoint": event.endpoint,
            "p_request_id": event.request_id,
            "p_charge_event_id": event.event_id,
            "p_charge_created_at": event.created_at,
            "p_charge_detail": json.dumps(charge.detail),
            "p_charge_parts": _bytea_array(charge.parts),
            "p_refill_event_id": None if refill is None else refill.record.event_id,
            "p_refill_created_at": None if refill is None else refill.record.created_at,
            "p_refill_detail": None if refill is None else json.dumps(refill.detail),
            "p_refill_parts": None if refill is None else _bytea_array(refill.parts),
            **dict(zip(_RATE_ARGUMENTS, self.rate or (None,) * 4, strict=True)),
        }


def charge_call(
    *,
    wallet_id: str,
    tenant_id: str,
    reach_wallet_id: str | None,
    service_category: str,
    units: Decimal,
    request_path: str,
    description: str,
    idempotency_key: str | None,
    actor_key_id: str = "",
    correlation_id: str = "",
) -> ChargeCall:
    """Prepare a charge of ``units`` (positive, at 8 places) of ``service_category`` from ``wallet_id``.

    ``tenant_id`` is the wallet's tenant (the chain its events go to); ``reach_wallet_id`` a
    wallet key's own wallet, which the charged wallet must be or descend from (None: not checked).
    """
    request_hash_ = charge_request_hash(
        wallet_id=wallet_id,
        service_category=service_category,
        units=units,
        request_path=request_path,
        description=description,
    )
    now = timezone.now()
    ids = (new_id("ltx"), new_id("led"), new_id("led"), new_id("ltx"), new_id("led"), new_id("led"))
    description, request_path = description[:500], request_path[:300]
    correlation_id = (correlation_id or get_request_id() or "")[:128]
    return ChargeCall(
        wallet_id=wallet_id,
        tenant_id=tenant_id,
        reach_wallet_id=reach_wallet_id,
        service_category=service_category,
        units=units,
        description=description,
        request_path=request_path,
        correlation_id=correlation_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash_,
        actor_key_id=actor_key_id,
        now=now,
        ids=ids,
        body=charge_response_template(
            entry_id=ids[1],
            transaction_id=ids[0],
            wallet_id=wallet_id,
            service_category=service_category,
            units=units,
            description=description,
            request_path=request_path,
            correlation_id=correlation_id,
            idempotency_key=idempotency_key,
            created_at=now,
        ),
    )


class _KeyStale(Exception):  # an internal signal, never answered
    """The deferred rate-limit charge's key no longer checks out: nothing was written."""


def _charge(call: ChargeCall, deferred: DeferredCharge | None = None) -> ChargeOutcome:
    """``call`` in one round trip, and its answer as an outcome or as today's exception.

    With ``call.rate``, reports the window's count to ``deferred`` (``DeferredRefused`` past the
    limit, ``_KeyStale`` when the key no longer checks out).

    The ledger.refill event is prepared only when the database asks for it (SQLSTATE TGRF1: the
    statement rolled back whole) or inside a caller's transaction, where a failed statement
    would abort the transaction. A serialization failure or deadlock (billing_debit raises 40001
    for a refill its locks did not foresee) rolled the statement back whole too: it runs again a
    few times (``common.dbretry``), then ``TransactionConflict`` (409). Inside a caller's
    transaction both are the caller's to handle.
    """
    refill_event = connection.in_atomic_block
    conflicts = 0
    while True:
        params = list(call.arguments(refill_event=refill_event).values())
        try:
            if connection.in_atomic_block:
                row = _charge_row(params)
            else:
                row = _charge_row_grouped(call.wallet_id, _batch_group(call), params)
        except DatabaseError as exc:
            if is_retryable(exc) and not connection.in_atomic_block:
                conflicts += 1
                dbretry.pause_after_conflict(exc, conflicts)
                continue
            if refill_event or getattr(exc.__cause__, "sqlstate", None) != _REFILL_EVENT_NEEDED:
                raise
            refill_event = True
            continue
        if call.rate is not None:
            assert deferred is not None
            if row["code"] == "key_stale":
                raise _KeyStale()
            deferred.claimed(int(row["rate_count"]))
            if row["code"] == "rate_limited":
                raise DeferredRefused()
        return _charge_outcome(row, call)


def _batch_group(call: ChargeCall) -> str:
    """The charges ``call`` may share a batch with: the same wallet and, with a deferred rate-limit charge,
    the same key's same window.

    billing_charge locks the key's window row first, and a charge after the first of a batch may lock
    nothing new (its "Batches"). A batch that crossed into the next window would lock that window's row
    after the chain head, out of order: another process's charge that took it first, then waits for the
    wallet, would deadlock with the batch.
    """
    if call.rate is None:
        return call.wallet_id
    key_id, _digest, window_index, _limit = call.rate
    return f"{call.wallet_id} {key_id} {window_index}"


def _charge_row(params: list[Any]) -> dict[str, Any]:
    """``billing_charge``'s answer to ``params``: one statement (its own transaction in autocommit)."""
    row = fastsql.fetch_row(CHARGE_SQL, params)
    assert row is not None
    return dict(zip(CHARGE_COLUMNS, row, strict=True))


# Group commit. A durable commit waits for the WAL flush, and the wallet's row lock (and the
# tenant's chain head) are held until it ends, so one wallet's charges serialize on the flush:
# with a flush of 1-2 ms, a few hundred charges per second whatever the CPU. Charges of one wallet
# that arrive while another charge of it is in flight in this process wait and then go together:
# one statement that calls billing_charge once per charge (so one transaction, one round trip, one
# flush, and no lock held while this process gets its next message ready). Each charge is still
# its own billing_charge call, in arrival order, seeing the ones before it. The lock order holds:
# a charge after the first of a batch runs with the chain head held and locks nothing new (the
# same wallet and agent ancestors), and billing_charge refuses one that might lock an
# auto-refill's parent (TGBT1), so such a wallet's charges run alone.
CHARGE_BATCH_MAX = 16
# A wallet with an auto-refill cannot have a second charge in a batch (billing_charge refuses it,
# SQLSTATE TGBT1: its parent's lock would come after the chain head); after such a refusal its
# charges go one statement at a time in this process for this long.
UNBATCHED_SECONDS = 300.0
_BATCH_REFUSED = "TGBT1"


@dataclass(eq=False)
class _QueuedCharge:
    """A charge waiting for the statement that carries it: its arguments, then its answer."""

    params: list[Any]
    ready: threading.Event = field(default_factory=threading.Event)
    row: dict[str, Any] | None = None
    error: BaseException | None = None
    batch: list[_QueuedCharge] | None = None  # set when this charge's thread is to run the next batch


_charge_queues: dict[str, list[_QueuedCharge]] = {}  # batch group -> charges waiting while a batch of it runs
_charge_queues_lock = threading.Lock()
# Wallets whose charges run alone (for UNBATCHED_SECONDS after a refusal); bounded: a wallet dropped
# early batches again and, if refused again, is put back.
_unbatched: BoundedCache[str, bool] = BoundedCache("billing.unbatched", max_entries=10_000, ttl=UNBATCHED_SECONDS)


def _charge_row_grouped(wallet_id: str, group: str, params: list[Any]) -> dict[str, Any]:
    """``billing_charge``'s answer to ``params`` (a charge of ``wallet_id``), committed with the other
    charges of its batch ``group`` (``_batch_group``) waiting here.

    The first charge of an idle group runs at once (alone: no wait, no batching cost). Charges
    arriving while it runs queue; when it ends, the first of them runs the queue (at most
    ``CHARGE_BATCH_MAX``) as one batch in its own thread and connection, and hands the rest on.
    Answers and errors reach each charge's own thread. Assumes autocommit (no atomic block).
    """
    if _unbatched.get(wallet_id):
        return _charge_row(params)
    mine = _QueuedCharge(params)
    with _charge_queues_lock:
        waiting = _charge_queues.get(group)
        if waiting is None:
            _charge_queues[group] = []
        else:
            waiting.append(mine)
    if waiting is None:
        _charge_batch(wallet_id, group, [mine])
    else:
        mine.ready.wait()
        if mine.batch is not None:
            _charge_batch(wallet_id, group, mine.batch)
    if mine.error is not None:
        raise mine.error
    assert mine.row is not None
    return mine.row


def _charge_batch(wallet_id: str, group: str, batch: list[_QueuedCharge]) -> None:
    """Run ``batch`` (charges of ``wallet_id``, this thread's first), answer every charge in it, hand the
    queue of ``group`` on."""
    try:
        for queued, answer in zip(batch, _charge_rows(wallet_id, [queued.params for queued in batch]), strict=True):
            if isinstance(answer, BaseException):
                queued.error = answer
            else:
                queued.row = answer
    except BaseException as exc:  # handed to every charge of the batch, raised in each one's thread
        for queued in batch:
            queued.error = exc
    finally:
        with _charge_queues_lock:
            waiting = _charge_queues[group]
            following = waiting[:CHARGE_BATCH_MAX]
            del waiting[:CHARGE_BATCH_MAX]
            if not following:
                del _charge_queues[group]
        for queued in batch[1:]:
            queued.ready.set()
        if following:
            following[0].batch = following
            following[0].ready.set()


def _charge_rows(wallet_id: str, calls: list[list[Any]]) -> Sequence[dict[str, Any] | Exception]:
    """The answers to ``calls`` (charges of ``wallet_id``), in order: together in one statement, else
    (it failed) one by one.

    A batch that fails wrote nothing (its statement rolled back whole: a deadlock, a refill event
    to prepare, a second charge of a wallet with an auto-refill, any error of one charge), so each
    charge then runs on its own and gets its own answer or error.
    """
    if len(calls) > 1:
        try:
            return _charge_rows_together(calls)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == _BATCH_REFUSED:
                _unbatched.set(wallet_id, True)
    answers: list[dict[str, Any] | Exception] = []
    for params in calls:
        try:
            answers.append(_charge_row(params))
        except Exception as exc:  # this charge's own: the others keep their answers (committed ones too)
            answers.append(exc)
    return answers


@functools.cache
def _batch_sql(size: int) -> str:
    """One statement of ``size`` ``billing_charge`` calls, run in order (the branches of a UNION ALL), each
    after the first with ``p_batch_later``; its rows answer them in the same order. Its placeholders are
    numbered (``fastsql.fetch_all_numbered``): a batch has more parameters than psycopg's parse cache takes."""
    width = len(CHARGE_ARGUMENTS)
    columns = ", ".join(f"c.{column}" for column in CHARGE_COLUMNS)
    calls = " UNION ALL ".join(
        f"SELECT {n} AS n, {columns} FROM billing_charge("  # noqa: S608
        + ", ".join(f"${n * width + i + 1}{_CASTS.get(name, '')}" for i, name in enumerate(CHARGE_ARGUMENTS))
        + f", p_batch_later => {'true' if n else 'false'}) c"
        for n in range(size)
    )
    return f"SELECT {', '.join(CHARGE_COLUMNS)} FROM ({calls}) batch ORDER BY n"  # noqa: S608


def _charge_rows_together(calls: list[list[Any]]) -> list[dict[str, Any]]:
    """Several ``billing_charge`` calls in one statement: one transaction, one round trip."""
    rows = fastsql.fetch_all_numbered(_batch_sql(len(calls)), [value for params in calls for value in params])
    assert len(rows) == len(calls)
    return [dict(zip(CHARGE_COLUMNS, row, strict=True)) for row in rows]


def _charge_outcome(row: dict[str, Any], call: ChargeCall) -> ChargeOutcome:
    """The outcome ``billing_charge`` answered, or its refusal raised as its exception (``billing.refusals``)."""
    code = row["code"]
    if code in ("ok", "replay"):
        body = charge_response_in_order(json.loads(row["body"]))
        return ChargeOutcome(status=row["response_status"], body=body, replayed=code == "replay")
    if code == "not_found" and call.reach_wallet_id is not None:  # a key learns nothing of wallets out of reach
        code = "access_denied"
    answer = {**row, "code": code, "category": call.service_category, "units": call.units}
    if code == "policy_denied" and answer["spend_window"] == "max_daily_credits":
        answer["figure_visible"] = _within_reach(row["refusal_reason"], call)
    refusal = refusal_exception(answer, RefusedCall(amount=row["charged"]))
    assert refusal is not None
    if code in DEBIT_REFUSALS:  # the wallet that refuses may be an agent ancestor out of the caller's reach
        raise refusal_for_viewer(refusal, visible=_within_reach(row["subject_id"], call))
    raise refusal


def _within_reach(wallet_id: str, call: ChargeCall) -> bool:
    """Whether the caller may read ``wallet_id`` (the charged wallet, or an agent ancestor of it that refused)."""
    if wallet_id == call.wallet_id or call.reach_wallet_id is None:
        return True
    path = Wallet.objects.filter(wallet_id=wallet_id).values_list("path", flat=True).first()
    return path is not None and call.reach_wallet_id in path.split("/")
