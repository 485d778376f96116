"""``tollgate-witness``: a C2SP ``tlog-witness`` that cosigns the checkpoints of the logs it follows.

Anyone (a sponsor, an auditor) can run one; it imports nothing of the gateway. It serves
``POST /add-checkpoint`` on the standard library's HTTP server, keeps the latest size and root hash
of each log it follows, verifies the consistency proof from that size to the new checkpoint, refuses
a fork or a rollback, and answers with a ``cosignature/v1`` from its own Ed25519 key.

Configuration (JSON)::

    {
      "name": "witness.example/w1",                    # the witness key's name (no spaces, no '+')
      "key_file": "witness.key",                       # created on first run, mode 0600
      "state_file": "witness-state.json",              # written atomically (tmp, fsync, rename)
      "logs": ["gw.example/tlog/spn_X+1a2b3c4d+AR..."] # the log keys it follows (key name = origin),
    }                                                  # or {"origin": "...", "key": "<note key>"}

Relative paths are relative to the configuration file. Command line::

    tollgate-witness --config witness.json [--listen 127.0.0.1:7380]
    tollgate-witness --config witness.json --print-key      # the verifier key to publish

Answers (tlog-witness): 200 and the cosignature line; 400 a malformed request, or an old size above
the checkpoint's (a rollback); 403 no valid signature of the log's key; 404 a log it does not follow;
409 the old size is not the one it holds (body: its size, ``text/x.tlog.size``); 422 the consistency
proof fails (a fork or a rewritten leaf). Every refusal's body names the reason. Requests for one log
are serialized: the check and the persisted update happen under the log's lock.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tollgate_client.tlog.checkpoint import Checkpoint
from tollgate_client.tlog.merkle import EMPTY_ROOT, HASH_SIZE, ProofError, verify_consistency
from tollgate_client.tlog.note import Cosigner, NoteError, Verifier, b64decode_strict, parse_note
from tollgate_client.tlog.policy import parse_log_key

__all__ = [
    "Witness",
    "WitnessError",
    "add_checkpoint_body",
    "load_config",
    "main",
    "make_server",
]

MAX_BODY = 64 * 1024
MAX_PROOF_LINES = 63
DEFAULT_PORT = 7380


class WitnessError(Exception):
    """A refusal: the HTTP status, a stable reason code and an explanation."""

    def __init__(self, status: int, reason: str, message: str, *, body: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.body = body


def add_checkpoint_body(old_size: int, proof: Sequence[bytes], checkpoint_note: str) -> bytes:
    """The ``add-checkpoint`` request body: ``old <size>``, the proof lines, a blank line, the signed checkpoint."""
    lines = [f"old {old_size}", *(base64.b64encode(h).decode("ascii") for h in proof)]
    return ("\n".join(lines) + "\n\n" + checkpoint_note).encode("utf-8")


def _parse_body(body: bytes) -> tuple[int, list[bytes], str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WitnessError(400, "malformed_request", "the body is not UTF-8") from exc
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise WitnessError(400, "malformed_request", "expected 'old <size>', proof lines, a blank line, a checkpoint")
    lines = head.split("\n")
    first = lines[0]
    if not re.fullmatch(r"old (0|[1-9][0-9]{0,18})", first):
        raise WitnessError(400, "malformed_request", "the first line is 'old <size>'")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise WitnessError(400, "malformed_request", f"more than {MAX_PROOF_LINES} proof lines")
    proof = []
    for line in lines[1:]:
        try:
            value = b64decode_strict(line)
        except ValueError as exc:
            raise WitnessError(400, "malformed_request", "a proof line is not base64") from exc
        if len(value) != HASH_SIZE:
            raise WitnessError(400, "malformed_request", "a proof line is not a 32-byte hash")
        proof.append(value)
    return int(first[4:]), proof, note


@dataclass
class _LogState:
    size: int
    root_hash: bytes
    checkpoint: str


class Witness:
    """The witness's logic, without HTTP: followed logs, persisted state, the cosigning key."""

    def __init__(
        self, *, cosigner: Cosigner, logs: Sequence[Verifier | tuple[str, Verifier]], state_file: Path
    ) -> None:
        """``logs``: the note keys of the logs it follows, each named by its origin or given as (origin, key)."""
        self.cosigner = cosigner
        self.logs = dict(entry if isinstance(entry, tuple) else (entry.name, entry) for entry in logs)
        self.state_file = state_file
        self._locks = {origin: threading.Lock() for origin in self.logs}
        self._file_lock = threading.Lock()
        self._state: dict[str, _LogState] = {}
        if state_file.exists():
            try:
                saved = json.loads(state_file.read_text(encoding="utf-8"))
                for origin, entry in saved["logs"].items():
                    self._state[origin] = _LogState(
                        int(entry["size"]), base64.b64decode(entry["root_hash"]), str(entry["checkpoint"])
                    )
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise ValueError(f"the witness state {state_file} is unreadable: {exc}") from exc

    @property
    def verifier_key(self) -> str:
        """The witness's ``cosignature/v1`` verifier key, to publish and to put in verifier policies."""
        return str(self.cosigner.verifier)

    def latest(self, origin: str) -> tuple[int, bytes] | None:
        state = self._state.get(origin)
        return None if state is None else (state.size, state.root_hash)

    def add_checkpoint(self, body: bytes, *, now: int | None = None) -> str:
        """Check an ``add-checkpoint`` request and return the cosignature line; raise :class:`WitnessError`."""
        old_size, proof, note = _parse_body(body)
        try:
            text, signatures = parse_note(note)
            checkpoint = Checkpoint.parse(text)
        except NoteError as exc:
            raise WitnessError(400, "malformed_checkpoint", str(exc)) from exc
        key = self.logs.get(checkpoint.origin)
        if key is None:
            raise WitnessError(404, "unknown_log", f"this witness does not follow {checkpoint.origin!r}")
        matching = [sig for sig in signatures if key.matches(sig)]
        if not matching:
            raise WitnessError(403, "not_signed_by_log", "no signature of the log's key (signed by another key?)")
        if not all(key.verify(text.encode("utf-8"), sig) for sig in matching):
            raise WitnessError(403, "bad_log_signature", "the log's signature does not verify")
        if old_size > checkpoint.size:
            raise WitnessError(
                400, "rollback", f"old size {old_size} is above the checkpoint's size {checkpoint.size}: a rollback"
            )
        if checkpoint.size == 0 and checkpoint.root_hash != EMPTY_ROOT:
            raise WitnessError(422, "bad_empty_root", "a checkpoint of size 0 has the empty tree's root")
        with self._locks[checkpoint.origin]:
            current = self._state.get(checkpoint.origin)
            held = 0 if current is None else current.size
            if old_size != held:
                raise WitnessError(
                    409,
                    "old_size_mismatch" if checkpoint.size >= held else "rollback",
                    f"this witness holds size {held} for the log (checkpoint size {checkpoint.size})",
                    body=f"{held}\n",
                )
            if current is None or old_size == 0:
                if proof:
                    raise WitnessError(422, "proof_not_empty", "a proof from size 0 is empty")
            elif old_size == checkpoint.size:
                if proof or checkpoint.root_hash != current.root_hash:
                    raise WitnessError(
                        422, "fork", "a different root hash for the size this witness holds: a fork of the log"
                    )
            else:
                try:
                    verify_consistency(old_size, checkpoint.size, proof, current.root_hash, checkpoint.root_hash)
                except ProofError as exc:
                    raise WitnessError(
                        422, "inconsistent", f"the new checkpoint does not extend the one this witness holds: {exc}"
                    ) from exc
            try:
                self._persist(checkpoint.origin, _LogState(checkpoint.size, checkpoint.root_hash, note))
            except OSError as exc:
                raise WitnessError(503, "state_not_persisted", f"cannot write the witness state: {exc}") from exc
        timestamp = int(time.time()) if now is None else now
        return self.cosigner.cosign(text.encode("utf-8"), timestamp).line()

    def _persist(self, origin: str, new: _LogState) -> None:
        """Record ``new`` for ``origin``: on disk first, atomically (a temporary file beside the state file,
        fsync, rename, fsync of the directory), then in memory, so a failed write changes nothing."""
        with self._file_lock:
            updated = {**self._state, origin: new}
            self._write(updated)
            self._state = updated

    def _write(self, state: dict[str, _LogState]) -> None:
        """The state file's new content, atomically: never a half-written file in its place."""
        document = {
            "logs": {
                origin: {
                    "size": s.size,
                    "root_hash": base64.b64encode(s.root_hash).decode("ascii"),
                    "checkpoint": s.checkpoint,
                }
                for origin, s in sorted(state.items())
            }
        }
        directory = self.state_file.parent
        fd, tmp = tempfile.mkstemp(prefix=".witness-state-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.state_file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _load_or_create_key(path: Path, name: str) -> Cosigner:
    """The witness key from ``path``; created (mode 0600) on first run. A key readable by others is refused."""
    if not path.exists():
        key = Cosigner(name, Ed25519PrivateKey.generate())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(key.signer_key() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return key
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(f"the witness key {path} is readable by others (mode {mode:o}); chmod 600 it")
    key = Cosigner.from_signer_key(path.read_text(encoding="ascii").strip())
    if key.name != name:
        raise ValueError(f"the witness key {path} is named {key.name!r}, the configuration says {name!r}")
    return key


def load_config(path: Path) -> Witness:
    """A :class:`Witness` from its configuration file (creating its key on first run)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError("the configuration is a JSON object")
    base = path.resolve().parent
    name, logs = config.get("name"), config.get("logs")
    if not isinstance(name, str) or not isinstance(logs, list) or not logs:
        raise ValueError("the configuration names the witness ('name') and the logs it follows ('logs')")
    keys = [parse_log_key(entry) for entry in logs]
    key_file = base / str(config.get("key_file", "witness.key"))
    state_file = base / str(config.get("state_file", "witness-state.json"))
    return Witness(cosigner=_load_or_create_key(key_file, name), logs=keys, state_file=state_file)


class _Handler(BaseHTTPRequestHandler):
    witness: Witness
    server_version = "tollgate-witness"

    def _answer(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        if self.path.rstrip("/").rsplit("/", 1)[-1] != "add-checkpoint":
            self._answer(404, "not found\n")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(411, "a Content-Length is required\n")
            return
        if not 0 <= length <= MAX_BODY:
            self._answer(413, f"the body is at most {MAX_BODY} bytes\n")
            return
        body = self.rfile.read(length)
        try:
            line = self.witness.add_checkpoint(body)
        except WitnessError as err:
            if err.body is not None:
                self._answer(err.status, err.body, "text/x.tlog.size")
            else:
                self._answer(err.status, f"{err.reason}: {err}\n")
            return
        self._answer(200, line)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def make_server(witness: Witness, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> ThreadingHTTPServer:
    """The HTTP server of ``witness`` bound to ``host:port`` (port 0: any free port); call ``serve_forever``."""
    handler = type("WitnessHandler", (_Handler,), {"witness": witness})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    """``tollgate-witness``: serve ``add-checkpoint`` for the logs of a configuration file."""
    parser = argparse.ArgumentParser(prog="tollgate-witness", description="A tlog-witness for Tollgate logs.")
    parser.add_argument("--config", required=True, help="the witness configuration (JSON)")
    parser.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", help="host:port (default 127.0.0.1:7380)")
    parser.add_argument("--print-key", action="store_true", help="print the witness's verifier key and exit")
    args = parser.parse_args(argv)
    try:
        witness = load_config(Path(args.config))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.print_key:
        print(witness.verifier_key)
        return 0
    host, _, port = args.listen.rpartition(":")
    try:
        server = make_server(witness, host or "127.0.0.1", int(port))
    except (OSError, ValueError) as err:
        print(f"error: cannot listen on {args.listen}: {err}", file=sys.stderr)
        return 2
    where = f"{host or '127.0.0.1'}:{server.server_port}"
    print(f"tollgate-witness {witness.verifier_key} listening on {where}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
