"""Asking the witnesses to cosign a tenant's new checkpoint (C2SP tlog-witness ``add-checkpoint``).

After the integrator commits a checkpoint it posts ``old <size>``, the consistency proof from that
size and the signed note to each witness of ``TLOG_WITNESSES``; a 409 names the size the witness holds
and the request is made once more from there. A returned ``cosignature/v1`` line is kept only when it
verifies under the witness's configured key and the log still serves that checkpoint; it is then
appended to the served note. A refusal (a fork, a rollback, a bad signature) is logged with its reason
and never retried blindly: it is what a witness is for.

A dead witness does not slow the log: the witnesses are asked concurrently (one thread each), outside
the integration transaction, and the integrator's loop does not wait for them (:class:`WitnessRounds`:
each witness has its own worker and is owed the latest checkpoint of each tenant it has not been
given yet). A witness that does not answer (unreachable, a timeout, a 5xx) is skipped for a growing
interval, ``TLOG_CHECKPOINT_INTERVAL`` doubled per consecutive failure up to
``TLOG_WITNESS_BACKOFF_MAX``, logged, and shown by ``/health/ready`` (``tlog.models.WitnessState``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import httpx
from django.conf import settings
from django.db import connection
from django.utils import timezone

from tlog import selectors
from tlog.lib import note
from tlog.models import WitnessState, WitnessStatus
from tlog.services import Integrated

logger = logging.getLogger("tollgate.tlog")


@dataclass(frozen=True)
class WitnessAnswer:
    """One witness's answer: the HTTP status, the kept cosignature line, or the refusal's body.

    ``failed``: the witness did not answer (unreachable, a timeout, a 5xx), which backs it off;
    ``skipped``: it was not asked, being backed off. A refusal is an answer, neither."""

    name: str
    status: int
    line: str | None = None
    refusal: str = ""
    failed: bool = False
    skipped: bool = False


def add_checkpoint_body(tenant_id: str, old_size: int, size: int, checkpoint_note: str) -> bytes:
    proof = selectors.consistency(tenant_id, old_size, size) if 0 < old_size < size else []
    lines = [f"old {old_size}", *(note.b64encode(h) for h in proof)]
    return ("\n".join(lines) + "\n\n" + checkpoint_note).encode("utf-8")


def _keep(tenant_id: str, checkpoint_note: str, verifier: note.Verifier, line: str) -> bool:
    """Append ``line`` to the stored checkpoint's cosignatures if it is one valid cosignature of ``verifier``."""
    text, _ = note.parse_note(checkpoint_note)
    try:
        _, signatures = note.parse_note(text + "\n" + line)
    except note.NoteError:
        return False
    if len(signatures) != 1 or not verifier.matches(signatures[0]) or verifier.alg != note.ALG_COSIGNATURE_V1:
        return False
    if not verifier.verify(text.encode("utf-8"), signatures[0]):
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tlog_log SET cosignatures = cosignatures || %s WHERE tenant_id = %s AND checkpoint = %s",
            [line, tenant_id, checkpoint_note],
        )
        return cursor.rowcount == 1


def _post(name: str, url: str, body: bytes) -> tuple[int, str] | WitnessAnswer:
    """One ``add-checkpoint`` (HTTP only: it runs in a witness's own thread and touches no database)."""
    try:
        response = httpx.post(url, content=body, timeout=settings.TLOG_WITNESS_TIMEOUT)
    except httpx.HTTPError as exc:
        return WitnessAnswer(name, 0, refusal=f"unreachable: {exc!r}", failed=True)
    return response.status_code, response.text


def witness_backing_off(name: str) -> bool:
    """True while the witness ``name`` is skipped after failing to answer."""
    return WitnessState.objects.filter(
        name=name, status=WitnessStatus.BACKING_OFF, retry_at__gt=timezone.now()
    ).exists()


def witness_standing_record(*, name: str, answered: bool) -> None:
    """Record that the witness answered (its failures forgotten) or failed to (one more consecutive
    failure; skipped for ``TLOG_CHECKPOINT_INTERVAL`` doubled per failure, at most
    ``TLOG_WITNESS_BACKOFF_MAX`` seconds). One upsert: two writers count both failures. Operational state
    of the integrator, not a domain change: not audited (as the checkpoint is not)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        if answered:
            cursor.execute(
                "INSERT INTO tlog_witness_state (name, status, failures, retry_at, updated_at) "
                "VALUES (%s, %s, 0, NULL, %s) ON CONFLICT (name) DO UPDATE "
                "SET status = EXCLUDED.status, failures = 0, retry_at = NULL, updated_at = EXCLUDED.updated_at "
                # Already standing: no new row version for each answer of each tenant's checkpoint.
                "WHERE tlog_witness_state.status <> EXCLUDED.status OR tlog_witness_state.failures <> 0",
                [name, WitnessStatus.OK, now],
            )
            return
        cursor.execute(
            "INSERT INTO tlog_witness_state AS w (name, status, failures, retry_at, updated_at) "
            "VALUES (%(name)s, %(status)s, 1, %(now)s + make_interval(secs => LEAST(%(cap)s, %(base)s)), %(now)s) "
            "ON CONFLICT (name) DO UPDATE SET status = EXCLUDED.status, failures = w.failures + 1, "
            "retry_at = EXCLUDED.updated_at + make_interval(secs => LEAST(%(cap)s, %(base)s * power(2, w.failures))), "
            "updated_at = EXCLUDED.updated_at RETURNING failures, retry_at",
            {
                "name": name,
                "status": WitnessStatus.BACKING_OFF,
                "now": now,
                "cap": float(settings.TLOG_WITNESS_BACKOFF_MAX),
                "base": float(settings.TLOG_CHECKPOINT_INTERVAL),
            },
        )
        failures, retry_at = cursor.fetchone()
    logger.warning("tlog: witness %s failed to answer %s time(s) in a row; skipped until %s", name, failures,
                   retry_at.isoformat())  # fmt: skip


def tlog_witnesses_cosign(
    *, tenant_id: str, old_size: int, size: int, checkpoint_note: str, witnesses: Iterable[dict[str, Any]] | None = None
) -> list[WitnessAnswer]:
    """Post the tenant's checkpoint of ``size`` to every configured witness (or to ``witnesses``), all at
    once; keep the valid cosignatures and record each witness's standing.

    ``old_size`` is the size the witnesses are believed to hold (the log's previous size). A witness
    backing off is not asked (``skipped``). The posts run in one thread per witness and read nothing
    from the database; the bodies, the cosignatures kept and the standings are this thread's (so this
    runs in the caller's connection and transaction, if any). Never raises for a witness's failure:
    each answer is returned (and logged). Takes at most about twice ``TLOG_WITNESS_TIMEOUT``.
    """
    chosen = list(settings.TLOG_WITNESSES if witnesses is None else witnesses)
    answers: dict[str, WitnessAnswer] = {}
    asked = []
    for witness in chosen:
        if witness_backing_off(witness["name"]):
            answers[witness["name"]] = WitnessAnswer(witness["name"], 0, refusal="backing_off", skipped=True)
        else:
            asked.append(witness)
    bodies: dict[int, bytes] = {}

    def body(held: int) -> bytes:
        if held not in bodies:
            bodies[held] = add_checkpoint_body(tenant_id, held, size, checkpoint_note)
        return bodies[held]

    held = {witness["name"]: old_size for witness in asked}
    todo = asked
    if asked:
        with ThreadPoolExecutor(max_workers=len(asked), thread_name_prefix="tlog-witness") as pool:
            for attempt in range(2):
                posts = {
                    witness["name"]: pool.submit(
                        _post,
                        witness["name"],
                        witness["url"].rstrip("/") + "/add-checkpoint",
                        body(held[witness["name"]]),
                    )
                    for witness in todo
                }
                again = []
                for witness in todo:
                    name, verifier = witness["name"], note.Verifier.parse(witness["key"])
                    result = posts[name].result()
                    if isinstance(result, WitnessAnswer):
                        answers[name] = result
                        continue
                    status, text = result
                    if (
                        attempt == 0
                        and status == 409
                        and text.strip().isdigit()
                        and int(text) <= size
                        and held[name] != int(text)
                    ):
                        held[name] = int(text)
                        again.append(witness)
                        continue
                    if status == 200 and _keep(tenant_id, checkpoint_note, verifier, text):
                        answers[name] = WitnessAnswer(name, 200, line=text)
                    else:
                        answers[name] = WitnessAnswer(name, status, refusal=text[:500], failed=status >= 500)
                todo = again
                if not todo:
                    break
    out = []
    for witness in chosen:
        answer = answers[witness["name"]]
        if not answer.skipped:
            witness_standing_record(name=answer.name, answered=not answer.failed)
        if answer.line is None:
            logger.warning("tlog %s: witness %s did not cosign size %s: %s %s", tenant_id, answer.name, size,
                           answer.status, answer.refusal.strip())  # fmt: skip
        out.append(answer)
    return out


class WitnessRounds:
    """The integrator loop's witnesses, in the background: one worker thread per witness, so the loop never
    waits for one and a hanging witness holds up only its own worker.

    :meth:`submit` hands each witness the checkpoints just committed; a witness whose worker is busy or
    which is backing off is owed them instead (per tenant the latest, from the earliest size it was not
    given), and gets them at the first pass it is free. A worker that meets a failure stops its round:
    the rest stays owed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[str, dict[str, Integrated]] = {}
        self._busy: dict[str, Future[None]] = {}
        self._pools: dict[str, ThreadPoolExecutor] = {}

    @staticmethod
    def _merge(owed: dict[str, Integrated], done: Integrated) -> None:
        earlier = owed.get(done.tenant_id)
        owed[done.tenant_id] = done if earlier is None else replace(done, old_size=min(earlier.old_size, done.old_size))

    def submit(self, done: list[Integrated]) -> None:
        """Owe ``done`` to every witness and start the round of each witness that is free and not backing off."""
        for witness in settings.TLOG_WITNESSES:
            name = witness["name"]
            with self._lock:
                owed = self._owed.setdefault(name, {})
                for checkpoint_done in done:
                    self._merge(owed, checkpoint_done)
                running = self._busy.get(name)
                if not owed or (running is not None and not running.done()) or witness_backing_off(name):
                    continue
                self._owed[name] = {}
                pool = self._pools.get(name)
                if pool is None:
                    pool = self._pools[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tlog-witness")
                self._busy[name] = pool.submit(self._round, witness, owed)

    def _round(self, witness: dict[str, Any], jobs: dict[str, Integrated]) -> None:
        try:
            pending = sorted(jobs.values(), key=lambda d: d.tenant_id)
            while pending:
                done = pending.pop(0)
                (answer,) = tlog_witnesses_cosign(
                    tenant_id=done.tenant_id,
                    old_size=done.old_size,
                    size=done.size,
                    checkpoint_note=done.checkpoint,
                    witnesses=[witness],
                )
                if answer.failed or answer.skipped:
                    with self._lock:
                        owed = self._owed.setdefault(witness["name"], {})
                        for left in [done, *pending]:
                            newer = owed.pop(left.tenant_id, None)
                            self._merge(owed, left)
                            if newer is not None:
                                self._merge(owed, newer)
                    return
        except Exception:
            logger.exception("tlog: the round of witness %s failed", witness["name"])
        finally:
            connection.close()

    def wait(self, names: Iterable[str] | None = None) -> None:
        """Wait for the rounds under way (of the witnesses ``names``, or of all)."""
        with self._lock:
            running = [f for name, f in self._busy.items() if names is None or name in set(names)]
        for future in running:
            future.result()

    def shutdown(self) -> None:
        """Stop taking rounds; the ones under way end within ``TLOG_WITNESS_TIMEOUT``."""
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
