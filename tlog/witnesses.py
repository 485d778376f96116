"""Asking the witnesses to cosign a tenant's new checkpoint (C2SP tlog-witness ``add-checkpoint``).

After the integrator commits a checkpoint it posts ``old <size>``, the consistency proof from that
size and the signed note to each witness of ``TLOG_WITNESSES``; a 409 names the size the witness holds
and the request is made once more from there. A returned ``cosignature/v1`` line is kept only when it
verifies under the witness's configured key and the log still serves that checkpoint; it is then
appended to the served note. A refusal (a fork, a rollback, a bad signature) is logged with its reason
and never retried blindly: it is what a witness is for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import connection

from tlog import selectors
from tlog.lib import note

logger = logging.getLogger("tollgate.tlog")


@dataclass(frozen=True)
class WitnessAnswer:
    """One witness's answer: the HTTP status, the kept cosignature line, or the refusal's body."""

    name: str
    status: int
    line: str | None = None
    refusal: str = ""


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


def tlog_witnesses_cosign(*, tenant_id: str, old_size: int, size: int, checkpoint_note: str) -> list[WitnessAnswer]:
    """Post the tenant's checkpoint of ``size`` to every configured witness; keep the valid cosignatures.

    ``old_size`` is the size the witnesses are believed to hold (the log's previous size). Never raises
    for a witness's failure: each answer is returned (and logged).
    """
    answers = []
    for witness in settings.TLOG_WITNESSES:
        name, url = witness["name"], witness["url"].rstrip("/") + "/add-checkpoint"
        verifier = note.Verifier.parse(witness["key"])
        held, answer = old_size, WitnessAnswer(name, 0, refusal="not asked")
        for _ in range(2):
            try:
                response = httpx.post(
                    url,
                    content=add_checkpoint_body(tenant_id, held, size, checkpoint_note),
                    timeout=settings.TLOG_WITNESS_TIMEOUT,
                )
            except httpx.HTTPError as exc:
                answer = WitnessAnswer(name, 0, refusal=f"unreachable: {exc}")
                break
            if (
                response.status_code == 409
                and response.text.strip().isdigit()
                and int(response.text) <= size
                and held != int(response.text)
            ):
                held = int(response.text)
                answer = WitnessAnswer(name, 409, refusal=response.text)
                continue
            if response.status_code == 200 and _keep(tenant_id, checkpoint_note, verifier, response.text):
                answer = WitnessAnswer(name, 200, line=response.text)
            else:
                answer = WitnessAnswer(name, response.status_code, refusal=response.text[:500])
            break
        if answer.line is None:
            logger.warning("tlog %s: witness %s did not cosign size %s: %s %s", tenant_id, name, size,
                           answer.status, answer.refusal.strip())  # fmt: skip
        answers.append(answer)
    return answers
