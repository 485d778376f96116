"""Concurrent appends to one chain on real PostgreSQL: no gap, no duplicate, no fork."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from audit.chain_verification import audit_chain_verify
from audit.models import AuditEvent, ChainHead
from audit.services import audit_record

THREADS = 16
PER_THREAD = 200
CHAIN = "spn_concurrency00000000000"


@pytest.mark.django_db(transaction=True)
def test_parallel_appends_to_one_new_chain(tmp_path, settings):
    settings.SIGNING_KEY_FILE = str(tmp_path / "signing-keys.json")
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            barrier.wait()  # every thread races for the chain head's creation too
            for i in range(PER_THREAD):
                audit_record(
                    event="test.append", ok=True, tenant_id=CHAIN, wallet_id=f"agt_{n}", detail={"t": n, "i": i}
                )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]

    total = THREADS * PER_THREAD
    seqs = list(AuditEvent.objects.filter(chain=CHAIN).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, total + 1))  # no gaps, no duplicates
    head = ChainHead.objects.get(chain=CHAIN)
    assert head.seq == total
    # Every thread's events all landed.
    for n in range(THREADS):
        assert AuditEvent.objects.filter(chain=CHAIN, wallet_id=f"agt_{n}").count() == PER_THREAD
    result = audit_chain_verify(chain=CHAIN)
    assert result.valid, result
    assert result.checked_events == total
    assert result.head_hash == head.head_hash
