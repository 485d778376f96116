"""The integrator under concurrency, and the witnesses (docs/audit-chain.md, "The transparency log").

Integrators race on one tenant's log while statements keep arriving: never two leaves at one index,
never a gap, every statement once, and the tree head equal to the RFC 9162 root of the leaves. The
integrator posts each checkpoint to a real ``tollgate-witness`` and serves its cosignature; the
witness refuses a rewritten log and a rolled-back one, and the verifier names every attack.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone
from tollgate_client.tlog import TlogProof
from tollgate_client.tlog.policy import Policy, TransparencyVerdict, verify_checkpoint_note, verify_transparency
from tollgate_client.witness import Witness, load_config, make_server

from common.cache import clear_all
from common.canonical import b64url_encode
from tests.factories import make_sponsor
from tests.test_tlog_log import rfc_root
from tlog import witnesses as witnesses_module
from tlog.keys import log_signer, log_verifiers, origin_of
from tlog.lib import checkpoint, merkle, note
from tlog.management.commands.tlog_integrate import integrate_pass
from tlog.models import Leaf, Log, PendingLeaf, WitnessState
from tlog.selectors import stored_hash_reader
from tlog.services import tlog_integrate
from tlog.witnesses import WitnessRounds, tlog_witnesses_cosign, witness_backing_off, witness_standing_record


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


# --- Witnesses and attacks through the gateway's own data -------------------------------------------


@pytest.fixture
def witness(tmp_path: Path, settings: Any) -> Iterator[tuple[Witness, str]]:
    """A real ``tollgate-witness`` (the client package's server) on a free port, following the tenant's log,
    configured as the gateway's one witness; yields it and the tenant it follows."""
    tenant_id = make_sponsor("witnessed").tenant_id
    (tmp_path / "witness.json").write_text(
        json.dumps({"name": "witness.test/w1", "logs": [str(log_signer(tenant_id).verifier)]})
    )
    server_witness = load_config(tmp_path / "witness.json")
    server = make_server(server_witness, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.TLOG_WITNESSES = [
        {
            "name": "witness.test/w1",
            "key": server_witness.verifier_key,
            "url": f"http://127.0.0.1:{server.server_address[1]}",
        }
    ]
    try:
        yield server_witness, tenant_id
    finally:
        server.shutdown()
        server.server_close()


def _policy(tenant_id: str, witness: Witness, quorum: int = 1) -> Policy:
    return Policy.from_json(
        {
            "format": "tollgate.tlog-policy/v1",
            "logs": [str(v) for v in log_verifiers(tenant_id)],
            "witnesses": [witness.verifier_key],
            "quorum": quorum,
        }
    )


def _rebuild(tenant_id: str, leaves: list[bytes]) -> None:
    """The operator rewrites history: the tenant's log emptied and rebuilt from ``leaves`` (signed with the log key)."""
    with connection.cursor() as cursor:
        for table in ("tlog_leaf", "tlog_tree_hash", "tlog_log", "tlog_pending_leaf"):
            cursor.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [tenant_id])
    PendingLeaf.objects.bulk_create(
        PendingLeaf(
            tenant_id=tenant_id, kind="audit_checkpoint", statement_id=f"r_{i}", leaf=leaf, created_at=timezone.now()
        )
        for i, leaf in enumerate(leaves)
    )


def _stored_leaves(tenant_id: str) -> list[bytes]:
    return [bytes(b) for b in Leaf.objects.filter(tenant_id=tenant_id).order_by("idx").values_list("leaf", flat=True)]


@pytest.mark.django_db
def test_the_witness_cosigns_each_checkpoint_and_the_cosignature_is_served(witness, anon_client) -> None:
    server_witness, tenant_id = witness
    _pending(tenant_id, "a", 5)
    assert integrate_pass() >= 5
    first = anon_client.get(f"/tlog/{tenant_id}/checkpoint").content.decode()
    checked = verify_checkpoint_note(first, _policy(tenant_id, server_witness))
    assert not isinstance(checked, TransparencyVerdict), checked
    assert checked[1] == ("witness.test/w1",)
    _pending(tenant_id, "b", 9)
    integrate_pass()  # old size and a consistency proof: the witness accepts the extension
    latest = anon_client.get(f"/tlog/{tenant_id}/checkpoint").content.decode()
    checked = verify_checkpoint_note(latest, _policy(tenant_id, server_witness))
    assert not isinstance(checked, TransparencyVerdict), checked
    assert server_witness.latest(origin_of(tenant_id)) == (checked[0].size, checked[0].root_hash)
    # A proof served now carries the witness's cosignature: a quorum-1 verifier accepts it.
    proof = anon_client.get(f"/tlog/{tenant_id}/proof/b_3").content.decode()
    transparency = {"leaf_index": TlogProof.parse(proof).index, "proof": proof}
    verdict = verify_transparency(transparency, b"b:3", _policy(tenant_id, server_witness), tenant=tenant_id)
    assert verdict.status == "verified", verdict


@pytest.mark.django_db
@pytest.mark.parametrize("attack", ["rewritten_leaf", "deleted_leaf", "rollback", "fork_at_same_size"])
def test_the_witness_refuses_a_rewritten_log_and_the_verifier_names_the_failure(witness, attack) -> None:
    server_witness, tenant_id = witness
    _pending(tenant_id, "a", 12)
    integrate_pass()
    honest = Log.objects.get(tenant_id=tenant_id)
    leaves = _stored_leaves(tenant_id)
    held = server_witness.latest(origin_of(tenant_id))
    assert held == (honest.size, bytes(honest.root_hash))
    honest_path = tuple(merkle.inclusion_proof(3, honest.size, stored_hash_reader(tenant_id)))

    forged = list(leaves)
    if attack == "rewritten_leaf":
        forged[3] = b"a rewritten statement"
        forged += [b"later 1", b"later 2"]
    elif attack == "deleted_leaf":
        del forged[3]
        forged += [b"later 1", b"later 2", b"later 3"]
    elif attack == "rollback":
        forged = forged[:-4]
    else:
        forged[-1] = b"another last statement"
    _rebuild(tenant_id, forged)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    (answer,) = tlog_witnesses_cosign(tenant_id=tenant_id, old_size=0, size=done.size, checkpoint_note=done.checkpoint)
    expected = {"rewritten_leaf": (422, "inconsistent"), "deleted_leaf": (422, "inconsistent"),
                "rollback": (409, ""), "fork_at_same_size": (422, "fork")}[attack]  # fmt: skip
    assert answer.line is None
    assert answer.status == expected[0], answer
    assert answer.refusal.startswith(expected[1]), answer
    # The witness still holds the honest head, and the forged checkpoint carries no cosignature.
    assert server_witness.latest(origin_of(tenant_id)) == held
    assert Log.objects.get(tenant_id=tenant_id).cosignatures == ""
    forged_note = Log.objects.get(tenant_id=tenant_id).checkpoint
    verdict = verify_checkpoint_note(forged_note, _policy(tenant_id, server_witness))
    assert isinstance(verdict, TransparencyVerdict)
    assert verdict.reason == "tlog_cosignature_quorum"
    # A receipt holder's old proof does not lead to the forged root either (a verifier without witnesses).
    if attack in ("rewritten_leaf", "deleted_leaf"):
        stale = TlogProof(3, honest_path, forged_note)
        verdict = verify_transparency({"leaf_index": 3, "proof": stale.text()}, leaves[3],
                                      _policy(tenant_id, server_witness, quorum=0), tenant=tenant_id)  # fmt: skip
        assert verdict.reason == "tlog_inclusion_failed", verdict


@pytest.mark.django_db
def test_a_checkpoint_signed_by_another_key_is_refused_by_witness_and_verifier(witness, settings) -> None:
    server_witness, tenant_id = witness
    _pending(tenant_id, "a", 4)
    integrate_pass()
    trusted = _policy(tenant_id, server_witness, quorum=0)
    held = server_witness.latest(origin_of(tenant_id))
    settings.TLOG_KEY_PRIVATE = b64url_encode(b"\x07" * 32)  # an attacker's (or a stale) key
    clear_all()
    _pending(tenant_id, "b", 2)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    (answer,) = tlog_witnesses_cosign(
        tenant_id=tenant_id, old_size=done.old_size, size=done.size, checkpoint_note=done.checkpoint
    )
    assert (answer.status, answer.refusal.split(":")[0]) == (403, "not_signed_by_log")
    assert server_witness.latest(origin_of(tenant_id)) == held
    verdict = verify_checkpoint_note(done.checkpoint, trusted)
    assert isinstance(verdict, TransparencyVerdict)
    assert verdict.reason == "tlog_checkpoint_not_signed_by_log"


@pytest.mark.django_db
def test_a_proof_from_another_tenants_log_is_refused(anon_client, tenant, other_tenant) -> None:
    mine, theirs = tenant.sponsor.tenant_id, other_tenant.sponsor.tenant_id
    _pending(mine, "m", 3)
    _pending(theirs, "m", 3)  # the same bytes and ids in the other tenant's log
    tlog_integrate(tenant_id=mine)
    tlog_integrate(tenant_id=theirs)
    policy = Policy.from_json(
        {"format": "tollgate.tlog-policy/v1", "logs": [str(log_verifiers(mine)[0]), str(log_verifiers(theirs)[0])]}
    )
    proof = anon_client.get(f"/tlog/{theirs}/proof/m_1").content.decode()
    transparency = {"leaf_index": TlogProof.parse(proof).index, "proof": proof}
    assert verify_transparency(transparency, b"m:1", policy, tenant=theirs).status == "verified"
    verdict = verify_transparency(transparency, b"m:1", policy, tenant=mine)
    assert verdict.reason == "tlog_other_tenant_log", verdict


# --- A dead witness does not slow the log -----------------------------------------------------------


class HangingWitness:
    """A socket that accepts and never answers: each connection is held open until :meth:`release`."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.accepted = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            self.accepted.set()

    def release(self) -> None:
        """Close every held connection: the gateway's post fails (as a timeout would end it)."""
        for conn in self.held:
            conn.close()

    def close(self) -> None:
        self.release()
        self.sock.close()


@pytest.mark.django_db(transaction=True)
def test_a_hanging_witness_neither_delays_the_checkpoints_nor_the_good_witness(witness, settings, anon_client):
    """One witness accepts and never answers, the other is a real tollgate-witness. The integrator's pass
    commits its checkpoint and returns while the hanging witness still holds the request; the next pass
    integrates new leaves all the same; the good witness cosigns each checkpoint. Once the hanging one
    fails it is backed off: the next pass does not ask it, and readiness shows its state."""
    server_witness, tenant_id = witness
    good = settings.TLOG_WITNESSES[0]
    hanging = HangingWitness()
    # The hanging post ends when the test releases it, never by a timeout; the back-off outlasts the test.
    settings.TLOG_WITNESS_TIMEOUT = 600
    settings.TLOG_CHECKPOINT_INTERVAL = 600
    settings.TLOG_WITNESSES = [{"name": "witness.test/dead", "key": good["key"], "url": hanging.url}, good]
    rounds = WitnessRounds()
    policy = _policy(tenant_id, server_witness)
    try:
        _pending(tenant_id, "a", 3)
        assert integrate_pass(rounds) >= 3
        first_size = Log.objects.get(tenant_id=tenant_id).size
        assert hanging.accepted.wait(60)  # a guard, not a measure: the request is open
        # The checkpoint is committed while the hanging witness holds the request unanswered ...
        assert hanging.held[0].fileno() != -1
        rounds.wait(["witness.test/w1"])
        # ... and the good witness's cosignature is stored.
        checked = verify_checkpoint_note(anon_client.get(f"/tlog/{tenant_id}/checkpoint").content.decode(), policy)
        assert not isinstance(checked, TransparencyVerdict), checked
        assert checked[0].size == first_size

        # A new leaf is integrated while the hanging witness still hangs, and the good one cosigns it.
        _pending(tenant_id, "b", 4)
        assert integrate_pass(rounds) == 4
        assert Log.objects.get(tenant_id=tenant_id).size == first_size + 4
        assert len(hanging.held) == 1
        rounds.wait(["witness.test/w1"])
        checked = verify_checkpoint_note(anon_client.get(f"/tlog/{tenant_id}/checkpoint").content.decode(), policy)
        assert not isinstance(checked, TransparencyVerdict), checked
        assert checked[0].size == first_size + 4
        assert server_witness.latest(origin_of(tenant_id))[0] == first_size + 4

        # The hanging witness is abandoned: backed off, shown as such, and not asked by the next pass.
        hanging.release()
        rounds.wait()
        state = WitnessState.objects.get(name="witness.test/dead")
        assert (state.status, state.failures) == ("backing_off", 1)
        assert state.retry_at is not None
        assert state.retry_at > state.updated_at
        shown = anon_client.get("/health/ready").json()["tlog_witnesses"]
        assert [(w["name"], w["status"], w["failures"]) for w in shown] == [
            ("witness.test/dead", "backing_off", 1),
            ("witness.test/w1", "ok", 0),
        ]
        _pending(tenant_id, "c", 2)
        assert integrate_pass(rounds) == 2
        rounds.wait()
        assert len(hanging.held) == 1
        assert server_witness.latest(origin_of(tenant_id))[0] == first_size + 6
    finally:
        rounds.shutdown()
        hanging.close()


@pytest.mark.django_db
def test_a_failing_witness_is_backed_off_longer_each_time_and_forgiven_when_it_answers(settings):
    settings.TLOG_CHECKPOINT_INTERVAL = 2
    settings.TLOG_WITNESS_BACKOFF_MAX = 5
    intervals = []
    for _ in range(3):
        witness_standing_record(name="w", answered=False)
        state = WitnessState.objects.get(name="w")
        assert state.retry_at is not None
        intervals.append((state.retry_at - state.updated_at).total_seconds())
    assert intervals == [2, 4, 5]
    assert witness_backing_off("w")
    assert state.failures == 3
    witness_standing_record(name="w", answered=True)
    state = WitnessState.objects.get(name="w")
    assert (state.status, state.failures, state.retry_at) == ("ok", 0, None)
    assert not witness_backing_off("w")


@pytest.mark.django_db
def test_a_backed_off_witness_is_not_asked(witness, settings):
    """``tlog_witnesses_cosign`` skips a witness backing off (no connection is made) and answers so."""
    _, tenant_id = witness
    hanging = HangingWitness()
    try:
        settings.TLOG_WITNESSES = [{**settings.TLOG_WITNESSES[0], "name": "witness.test/dead", "url": hanging.url}]
        witness_standing_record(name="witness.test/dead", answered=False)
        _pending(tenant_id, "a", 1)
        done = tlog_integrate(tenant_id=tenant_id)
        assert done is not None
        (answer,) = tlog_witnesses_cosign(
            tenant_id=tenant_id, old_size=0, size=done.size, checkpoint_note=done.checkpoint
        )
        assert (answer.skipped, answer.failed, answer.refusal) == (True, False, "backing_off")
        assert hanging.held == []
    finally:
        hanging.close()


class ScriptedWitness:
    """An HTTP server answering every ``add-checkpoint`` with ``status`` and ``body``, sent in ``chunks``
    pieces with ``pause`` seconds between them (a witness that misreads, floods or drips)."""

    def __init__(self, status: int, body: bytes, *, chunks: int = 1, pause: float = 0.0) -> None:
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(scripted.status)
                self.send_header("Content-Length", str(len(scripted.body)))
                self.end_headers()
                step = max(1, len(scripted.body) // scripted.chunks)
                try:
                    for start in range(0, len(scripted.body), step):
                        self.wfile.write(scripted.body[start : start + step])
                        self.wfile.flush()
                        if scripted.pause:
                            scripted.stop.wait(scripted.pause)
                except OSError:
                    pass  # the gateway gave up reading: what is being tested

            def log_message(self, *args: Any) -> None:
                pass

        self.status, self.body, self.chunks, self.pause = status, body, chunks, pause
        self.stop = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted(settings: Any) -> Iterator[Any]:
    made: list[ScriptedWitness] = []

    def make(status: int, body: bytes, **kwargs: Any) -> ScriptedWitness:
        made.append(ScriptedWitness(status, body, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.parametrize("body", ["²", "٣", "1" * 30, "-1", " 12x"])
@pytest.mark.django_db
def test_a_409_naming_no_ascii_size_is_a_refusal_and_the_other_witness_still_cosigns(witness, scripted, body, settings):
    """``"²".isdigit()`` is true and ``int("²")`` raises: a witness answering so must neither crash the
    round nor keep the good witness from cosigning; it is a refusal, not asked again."""
    tenant_id = witness[1]
    good = settings_witness = dict(settings.TLOG_WITNESSES[0])
    bad = scripted(409, body.encode())
    settings.TLOG_WITNESSES = [{**settings_witness, "name": "witness.test/odd", "url": bad.url}, good]
    _pending(tenant_id, "a", 2)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    odd, cosigned = tlog_witnesses_cosign(
        tenant_id=tenant_id, old_size=0, size=done.size, checkpoint_note=done.checkpoint
    )
    assert (odd.status, odd.line, odd.refusal, odd.failed) == (409, None, body, False)
    assert cosigned.line is not None
    assert Log.objects.get(tenant_id=tenant_id).cosignatures == cosigned.line


@pytest.mark.django_db
def test_an_exception_while_asking_one_witness_backs_it_off_and_spares_the_others(
    witness, scripted, monkeypatch, settings
):
    """Whatever goes wrong with one witness (here its answer's handling raises) is logged by class, backs
    that witness off, and the other witness is asked and cosigns all the same."""
    _, tenant_id = witness
    good = dict(settings.TLOG_WITNESSES[0])
    twin = scripted(200, b"twin's line\n")
    settings.TLOG_WITNESSES = [{**good, "name": "witness.test/twin", "url": twin.url}, good]
    real_keep = witnesses_module._keep

    def keep(tenant: str, note_text: str, verifier: Any, line: str) -> bool:
        if line == "twin's line\n":
            raise RuntimeError("boom")
        return real_keep(tenant, note_text, verifier, line)

    monkeypatch.setattr(witnesses_module, "_keep", keep)
    _pending(tenant_id, "a", 2)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    twin, cosigned = tlog_witnesses_cosign(
        tenant_id=tenant_id, old_size=0, size=done.size, checkpoint_note=done.checkpoint
    )
    assert (twin.failed, twin.refusal) == (True, "error: RuntimeError")
    assert WitnessState.objects.get(name="witness.test/twin").status == "backing_off"
    assert cosigned.line is not None


@pytest.mark.django_db(transaction=True)
def test_a_round_that_raises_keeps_the_rest_owed(witness, monkeypatch):
    """An exception in a witness's round backs the witness off and drops nothing: the checkpoint stays
    owed and is given at the first round after."""
    server_witness, tenant_id = witness
    asked: list[str] = []
    real = witnesses_module.tlog_witnesses_cosign

    def cosign(**kwargs: Any) -> Any:
        asked.append(kwargs["tenant_id"])
        if len(asked) == 1:
            raise RuntimeError("boom")
        return real(**kwargs)

    monkeypatch.setattr(witnesses_module, "tlog_witnesses_cosign", cosign)
    _pending(tenant_id, "a", 2)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    rounds = WitnessRounds()
    try:
        rounds.submit([done])
        rounds.wait()
        assert asked == [tenant_id]
        assert WitnessState.objects.get(name="witness.test/w1").status == "backing_off"
        rounds.submit([])  # backing off: nothing is asked, the checkpoint stays owed
        rounds.wait()
        assert asked == [tenant_id]
        witness_standing_record(name="witness.test/w1", answered=True)
        rounds.submit([])  # the next pass: what was owed is given
        rounds.wait()
        assert asked == [tenant_id, tenant_id]
        assert server_witness.latest(origin_of(tenant_id))[0] == done.size
    finally:
        rounds.shutdown()


@pytest.mark.parametrize(
    ("body", "pieces", "pause", "timeout", "refusal"),
    [
        # A flood: read up to the bound and given up (a generous deadline: the bound ends it).
        (b"x" * (4 * 64 * 1024), 16, 0.0, 60.0, "answer over 65536 bytes"),
        # A drip: each piece before the read timeout, the whole after TLOG_WITNESS_TIMEOUT.
        (b"y" * 100, 100, 0.02, 0.5, "no answer within 0.5 s"),
    ],
    ids=["oversized", "dripping"],
)
@pytest.mark.django_db
def test_an_answer_is_read_within_its_size_bound_and_overall_deadline(
    witness, scripted, settings, body, pieces, pause, timeout, refusal
):
    _, tenant_id = witness
    settings.TLOG_WITNESS_TIMEOUT = timeout
    answering = scripted(200, body, chunks=pieces, pause=pause)
    settings.TLOG_WITNESSES = [{**settings.TLOG_WITNESSES[0], "url": answering.url}]
    _pending(tenant_id, "a", 1)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    (answer,) = tlog_witnesses_cosign(tenant_id=tenant_id, old_size=0, size=done.size, checkpoint_note=done.checkpoint)
    assert (answer.failed, answer.refusal) == (True, refusal)


@pytest.mark.django_db
def test_a_cosignature_line_is_stored_once(witness, settings):
    _, tenant_id = witness
    _pending(tenant_id, "a", 1)
    done = tlog_integrate(tenant_id=tenant_id)
    assert done is not None
    (answer,) = tlog_witnesses_cosign(tenant_id=tenant_id, old_size=0, size=done.size, checkpoint_note=done.checkpoint)
    assert answer.line is not None
    verifier = note.Verifier.parse(settings.TLOG_WITNESSES[0]["key"])
    assert not witnesses_module._keep(tenant_id, done.checkpoint, verifier, answer.line)
    assert Log.objects.get(tenant_id=tenant_id).cosignatures == answer.line
