"""The integrator under concurrency, and the witnesses (docs/audit-chain.md, "The transparency log").

Integrators race on one tenant's log while statements keep arriving: never two leaves at one index,
never a gap, every statement once, and the tree head equal to the RFC 9162 root of the leaves. The
integrator posts each checkpoint to a real ``tollgate-witness`` and serves its cosignature; the
witness refuses a rewritten log and a rolled-back one, and the verifier names every attack.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.utils import timezone

from tests.factories import make_sponsor
from tests.test_tlog_log import rfc_root
from tlog.lib import checkpoint, merkle
from tlog.models import Leaf, Log, PendingLeaf
from tlog.services import tlog_integrate


def _pending(tenant_id: str, prefix: str, count: int) -> None:
    PendingLeaf.objects.bulk_create(
        PendingLeaf(
            tenant_id=tenant_id,
            kind="audit_checkpoint",
            statement_id=f"{prefix}_{i}",
            leaf=f"{prefix}:{i}".encode(),
            created_at=timezone.now(),
        )
        for i in range(count)
    )


@pytest.mark.django_db(transaction=True)
def test_racing_integrators_never_share_an_index_nor_skip_one() -> None:
    tenant_id = make_sponsor("race").tenant_id
    writers, integrators, per_writer = 3, 3, 40
    stop = threading.Event()
    errors: list[BaseException] = []
    sizes: list[int] = []

    def write(n: int) -> None:
        try:
            for batch in range(per_writer // 10):
                _pending(tenant_id, f"w{n}b{batch}", 10)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def integrate() -> None:
        try:
            while not stop.is_set():
                done = tlog_integrate(tenant_id=tenant_id, limit=7)
                if done is not None:
                    sizes.append(done.size)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=integrate) for _ in range(integrators)]
    feeders = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads + feeders:
        thread.start()
    for thread in feeders:
        thread.join()
    while PendingLeaf.objects.filter(tenant_id=tenant_id).exists() and not errors:
        threading.Event().wait(0.05)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = list(Leaf.objects.filter(tenant_id=tenant_id).order_by("idx").values_list("idx", "statement_id", "leaf"))
    # The sponsor's creation was audited: its event is a leaf too, beside the 120 written here.
    assert [idx for idx, _, _ in rows] == list(range(len(rows)))
    written = {f"w{n}b{b}_{i}" for n in range(writers) for b in range(per_writer // 10) for i in range(10)}
    assert written <= {sid for _, sid, _ in rows}
    assert (
        len(rows)
        == len({sid for _, sid, _ in rows})
        == len(written) + Leaf.objects.filter(tenant_id=tenant_id, kind="audit_event").count()
    )
    assert len(sizes) == len(set(sizes))  # each checkpoint size signed once
    log = Log.objects.get(tenant_id=tenant_id)
    assert log.size == len(rows)
    assert bytes(log.root_hash) == rfc_root([merkle.leaf_hash(bytes(leaf)) for _, _, leaf in rows])
    assert checkpoint.Checkpoint.from_note(log.checkpoint).size == log.size
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT (level, idx)) FROM tlog_tree_hash WHERE tenant_id = %s", [tenant_id]
        )
        total, distinct = cursor.fetchone()
    assert total == distinct
