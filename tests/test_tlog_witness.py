"""tollgate-witness, the real HTTP server on 127.0.0.1 (a free port, in a thread), attacked as a log would.

Each refusal is checked by its HTTP status (C2SP tlog-witness) and the reason named in its body: a
rewritten leaf, a deleted leaf, a fork re-signed and shown to a second witness, a rolled-back
checkpoint, a checkpoint signed by the wrong key, a log the witness does not follow. No database.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from tollgate_client import witness as witness_module
from tollgate_client.tlog import (
    Checkpoint,
    NoteSignature,
    Verifier,
    format_note,
    generate_signer,
    parse_note,
    verified_signatures,
)
from tollgate_client.witness import Witness, add_checkpoint_body, load_config, make_server

from tests.tlog_helpers import MemoryLog

ROOT = Path(__file__).resolve().parent.parent


class Running:
    """A witness served over HTTP: its object, its URL and a POST helper."""

    def __init__(self, witness: Witness, url: str) -> None:
        self.witness = witness
        self.url = url

    def add(self, log: MemoryLog, old: int, note: str, proof: list[bytes] | None = None) -> httpx.Response:
        body = add_checkpoint_body(old, log.consistency(old) if proof is None else proof, note)
        return httpx.post(self.url + "/add-checkpoint", content=body, timeout=10)

    @property
    def verifier(self) -> Verifier:
        return Verifier.parse(self.witness.verifier_key)


def _config(directory: Path, name: str, logs: list[MemoryLog]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "witness.json"
    entries: list[object] = []
    for log in logs:
        key = str(log.signer.verifier)
        entries.append(key if log.signer.name == log.origin else {"origin": log.origin, "key": key})
    path.write_text(json.dumps({"name": name, "logs": entries}))
    return path


@pytest.fixture
def serve() -> Iterator:
    servers = []

    def start(config: Path) -> Running:
        witness = load_config(config)
        server = make_server(witness, "127.0.0.1", 0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return Running(witness, f"http://127.0.0.1:{server.server_port}")

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def log() -> MemoryLog:
    log = MemoryLog.for_tenant("spn_A")
    for i in range(5):
        log.append(f"statement {i}".encode())
    return log


def test_cosigns_a_new_log_then_its_growth_and_persists(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    first = log.checkpoint()
    answer = running.add(log, 0, first)
    assert answer.status_code == 200, answer.text
    text, _ = parse_note(first)
    cosigned = parse_note(first + answer.text)
    assert verified_signatures(*cosigned, [log.signer.verifier, running.verifier]) == [
        log.signer.verifier,
        running.verifier,
    ]
    for i in range(5, 12):
        log.append(f"statement {i}".encode())
    answer = running.add(log, 5, log.checkpoint())
    assert answer.status_code == 200, answer.text
    # The state is on disk, and a restarted witness holds the same size.
    state = json.loads((tmp_path / "witness-state.json").read_text())
    assert state["logs"][log.origin]["size"] == 12
    assert load_config(tmp_path / "witness.json").latest(log.origin) == (12, log.root())
    key_file = tmp_path / "witness.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert text.startswith(log.origin)


def test_a_rewritten_leaf_is_refused(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    assert running.add(log, 0, log.checkpoint()).status_code == 200
    forged = log.copy_rewritten(2, b"statement 2, rewritten")
    forged.append(b"statement 5")
    answer = running.add(forged, 5, forged.checkpoint())
    assert answer.status_code == 422
    assert answer.text.startswith("inconsistent:")
    # Shown at the same size, the rewritten tree is a fork.
    same_size = log.copy_rewritten(2, b"statement 2, rewritten")
    answer = running.add(same_size, 5, same_size.checkpoint(), proof=[])
    assert (answer.status_code, answer.text.split(":")[0]) == (422, "fork")
    assert running.witness.latest(log.origin) == (5, log.root())


def test_a_deleted_leaf_is_refused(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    assert running.add(log, 0, log.checkpoint()).status_code == 200
    shorter = log.copy_without(1)
    shorter.append(b"statement 5")  # back to size 5, one statement gone
    shorter.append(b"statement 6")
    answer = running.add(shorter, 5, shorter.checkpoint())
    assert answer.status_code == 422
    assert answer.text.startswith("inconsistent:")


def test_a_rolled_back_checkpoint_is_refused(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    assert running.add(log, 0, log.checkpoint()).status_code == 200
    older = log.checkpoint(3)
    # Claiming the size the witness holds, with a smaller checkpoint: 400, a rollback.
    answer = running.add(log, 5, older, proof=[])
    assert (answer.status_code, answer.text.split(":")[0]) == (400, "rollback")
    # Claiming the older size: 409 and the size the witness holds.
    answer = running.add(log, 3, older, proof=[])
    assert answer.status_code == 409
    assert answer.headers["content-type"] == "text/x.tlog.size"
    assert answer.text == "5\n"
    # Replaying the empty state: 409 too.
    assert running.add(log, 0, log.checkpoint(2), proof=[]).status_code == 409
    assert running.witness.latest(log.origin) == (5, log.root())


def test_a_checkpoint_signed_by_the_wrong_key_is_refused(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    impostor = generate_signer(log.origin)  # same name, another key
    answer = running.add(log, 0, log.checkpoint(signer=impostor))
    assert (answer.status_code, answer.text.split(":")[0]) == (403, "not_signed_by_log")
    # A line under the log's own name and key id whose signature fails: 403 as well.
    text, sigs = parse_note(log.checkpoint())
    flipped = NoteSignature(sigs[0].name, sigs[0].key_id, bytes([sigs[0].signature[0] ^ 1]) + sigs[0].signature[1:])
    answer = running.add(log, 0, format_note(text, [flipped]))
    assert (answer.status_code, answer.text.split(":")[0]) == (403, "bad_log_signature")
    assert running.witness.latest(log.origin) is None


def test_another_tenants_log_is_not_followed(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    other = MemoryLog.for_tenant("spn_B")
    other.append(b"x")
    answer = running.add(other, 0, other.checkpoint())
    assert (answer.status_code, answer.text.split(":")[0]) == (404, "unknown_log")
    # The other tenant's log signed under this tenant's origin by its own key: not the followed key.
    borrowed = MemoryLog(log.origin, other.signer)
    borrowed.append(b"x")
    assert running.add(borrowed, 0, borrowed.checkpoint()).status_code == 403


def test_a_fork_shown_to_a_second_witness(tmp_path, serve, log):
    """Both witnesses saw size 5. The log shows W1 the genuine size 8 and W2 a fork of it."""
    w1 = serve(_config(tmp_path / "w1", "witness.test/w1", [log]))
    w2 = serve(_config(tmp_path / "w2", "witness.test/w2", [log]))
    for w in (w1, w2):
        assert w.add(log, 0, log.checkpoint()).status_code == 200
    fork = log.copy_rewritten(0, b"statement 0")  # same history so far
    for i in range(5, 8):
        log.append(f"statement {i}".encode())
        fork.append(f"forked statement {i}".encode())
    assert w1.add(log, 5, log.checkpoint()).status_code == 200
    # The fork extends size 5 consistently, so W2 alone cannot tell it from the genuine log ...
    assert w2.add(fork, 5, fork.checkpoint()).status_code == 200
    # ... but the two views never meet: W1 refuses the fork, W2 the genuine log, each as a fork.
    answer = w1.add(fork, 8, fork.checkpoint(), proof=[])
    assert (answer.status_code, answer.text.split(":")[0]) == (422, "fork")
    answer = w2.add(log, 8, log.checkpoint(), proof=[])
    assert (answer.status_code, answer.text.split(":")[0]) == (422, "fork")
    # A fork that rewrites what W2 already saw is refused by W2 outright.
    early = log.copy_rewritten(1, b"statement 1, rewritten")
    early.append(b"statement 8")
    answer = w2.add(early, 8, early.checkpoint())
    assert (answer.status_code, answer.text.split(":")[0]) == (422, "inconsistent")


def test_concurrent_add_checkpoint_for_one_log_is_serialized(tmp_path, serve, log, monkeypatch):
    """Ten different extensions of size 5 at once: exactly one is cosigned, the rest see 409."""
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    assert running.add(log, 0, log.checkpoint()).status_code == 200
    check = witness_module.verify_consistency

    def slow_check(*args):
        time.sleep(0.5)  # widens the window between the check and the write that the lock must close
        return check(*args)

    monkeypatch.setattr(witness_module, "verify_consistency", slow_check)
    variants = []
    for n in range(10):
        variant = log.copy_rewritten(0, b"statement 0")
        variant.append(f"branch {n}".encode())
        variants.append(variant)
    barrier = threading.Barrier(len(variants))
    results: list[int] = [0] * len(variants)

    def submit(i: int) -> None:
        body = add_checkpoint_body(5, variants[i].consistency(5), variants[i].checkpoint())
        barrier.wait()
        results[i] = httpx.post(running.url + "/add-checkpoint", content=body, timeout=30).status_code

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(variants))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200] + [409] * 9
    winner = variants[results.index(200)]
    assert running.witness.latest(log.origin) == (6, winner.root())
    state = json.loads((tmp_path / "witness-state.json").read_text())
    assert state["logs"][log.origin]["size"] == 6


def test_a_new_log_takes_an_empty_proof_and_an_empty_tree_its_root(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    answer = running.add(log, 0, log.checkpoint(), proof=[log.root(1)])
    assert (answer.status_code, answer.text.split(":")[0]) == (422, "proof_not_empty")
    empty = MemoryLog(log.origin, log.signer)
    assert running.add(empty, 0, empty.checkpoint()).status_code == 200
    assert running.witness.latest(log.origin) == (0, empty.root())
    # Size 0 with another root is refused.
    text = Checkpoint(log.origin, 0, log.root()).text()
    answer = running.add(log, 0, format_note(text, [log.signer.sign(text.encode())]), proof=[])
    assert (answer.status_code, answer.text.split(":")[0]) == (422, "bad_empty_root")
    assert running.add(log, 0, log.checkpoint()).status_code == 200


def test_a_log_key_named_otherwise_than_its_origin(tmp_path, serve):
    """The configuration may give a log as {"origin", "key"}: the key's name need not be the origin."""
    log = MemoryLog("gw.test/tlog/spn_C", generate_signer("gw.test-log-key"))
    log.append(b"x")
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    assert json.loads((tmp_path / "witness.json").read_text())["logs"][0]["origin"] == log.origin
    assert running.add(log, 0, log.checkpoint()).status_code == 200


def test_malformed_requests_are_400(tmp_path, serve, log):
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    note = log.checkpoint().encode()
    for body in (
        b"",
        b"old 01\n\n" + note,
        "old \u0663\n\n".encode() + note,  # an Arabic-Indic digit three is not a size
        b"old 0\nnot base64\n\n" + note,
        b"old 0\n\n" + note.replace(b"\n\n", b"\n"),  # no signature block
        b"old 0\n\n\xff\xfe",
    ):
        answer = httpx.post(running.url + "/add-checkpoint", content=body, timeout=10)
        assert answer.status_code == 400, body
    assert httpx.post(running.url + "/elsewhere", content=b"x", timeout=10).status_code == 404


def test_a_key_readable_by_others_is_refused(tmp_path, log):
    config = _config(tmp_path, "witness.test/w1", [log])
    load_config(config)
    os.chmod(tmp_path / "witness.key", 0o644)
    with pytest.raises(ValueError, match="readable by others"):
        load_config(config)


def test_command_line_prints_the_key_and_serves(tmp_path, log):
    config = _config(tmp_path, "witness.test/w1", [log])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    done = subprocess.run(
        [sys.executable, "-m", "tollgate_client.witness", "--config", str(config), "--print-key"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    key = Verifier.parse(done.stdout.strip())
    assert (key.name, key.alg) == ("witness.test/w1", 0x04)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollgate_client.witness", "--config", str(config), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in banner, banner
        port = int(banner.rsplit(":", 1)[1])
        answer = httpx.post(
            f"http://127.0.0.1:{port}/add-checkpoint", content=add_checkpoint_body(0, [], log.checkpoint()), timeout=10
        )
        assert answer.status_code == 200, answer.text
        assert verified_signatures(*parse_note(log.checkpoint() + answer.text), [key]) == [key]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_state_that_cannot_be_written_is_not_cosigned(tmp_path, serve, log, monkeypatch):
    """The state is on disk before any answer: a failed write gives 503, no cosignature and no change."""
    running = serve(_config(tmp_path, "witness.test/w1", [log]))
    assert running.add(log, 0, log.checkpoint(3)).status_code == 200

    def disk_full(state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(running.witness, "_write", disk_full)
    answer = running.add(log, 3, log.checkpoint())
    assert (answer.status_code, answer.text.split(":")[0]) == (503, "state_not_persisted")
    assert running.witness.latest(log.origin) == (3, log.root(3))
    monkeypatch.undo()
    assert running.add(log, 3, log.checkpoint()).status_code == 200
    # No temporary file is left beside the state.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["witness-state.json", "witness.json", "witness.key"]


def test_an_unreadable_state_stops_the_witness(tmp_path, log):
    config = _config(tmp_path, "witness.test/w1", [log])
    (tmp_path / "witness-state.json").write_text('{"logs": {"x": {"size": "many"}}}')
    with pytest.raises(ValueError, match="unreadable"):
        load_config(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    done = subprocess.run(
        [sys.executable, "-m", "tollgate_client.witness", "--config", str(config), "--print-key"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unreadable" in done.stderr


def test_the_server_binds_localhost_by_default(tmp_path, log):
    server = make_server(load_config(_config(tmp_path, "witness.test/w1", [log])), port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.server_close()
