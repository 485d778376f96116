"""C2SP ``tlog-checkpoint`` bodies and ``tlog-proof@v1`` documents.

A checkpoint body is three lines, ``<origin>``, ``<tree size>`` (decimal, no leading zero) and
``base64(<root hash>)``, then optional extension lines; it travels as a signed note. A
``tlog-proof@v1`` is ``c2sp.org/tlog-proof@v1``, an optional ``extra <base64>`` line, ``index <n>``,
the inclusion proof hashes one per line (leaf's sibling first), a blank line and the signed
checkpoint verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tollgate_client.tlog.merkle import HASH_SIZE
from tollgate_client.tlog.note import NoteError, b64decode_strict, b64encode, parse_note

__all__ = ["PROOF_HEADER", "Checkpoint", "TlogProof", "log_origin", "tenant_of_origin"]

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
_DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,19})$")
_ORIGIN_PART = re.compile(r"^[A-Za-z0-9._:-]+$")


def log_origin(*, gateway: str, tenant: str) -> str:
    """The origin line of a tenant's log: ``<gateway>/tlog/<tenant id>`` (docs/decisions.md, Evidence).

    ``gateway`` is the gateway's host name (with an optional port), ``tenant`` the tenant's id; the
    origin is also the log key's name, so neither may hold spaces, ``+`` or ``/``.
    """
    if not _ORIGIN_PART.match(gateway) or not _ORIGIN_PART.match(tenant):
        raise ValueError("the gateway name and the tenant id are letters, digits and . _ : - only")
    return f"{gateway}/tlog/{tenant}"


def tenant_of_origin(origin: str) -> str | None:
    """The tenant id an origin line of :func:`log_origin` names, ``None`` for another shape."""
    parts = origin.split("/")
    if len(parts) == 3 and parts[1] == "tlog" and _ORIGIN_PART.match(parts[0]) and _ORIGIN_PART.match(parts[2]):
        return parts[2]
    return None


def _decimal(text: str, what: str) -> int:
    if not _DECIMAL.match(text):
        raise NoteError("malformed_checkpoint", f"{what} is not a decimal without leading zeroes")
    value = int(text)
    if value >= 1 << 63:
        raise NoteError("malformed_checkpoint", f"{what} is too large")
    return value


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint body: the origin, the tree size, the root hash and any extension lines."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        if not self.origin or "\n" in self.origin:
            raise NoteError("malformed_checkpoint", "the origin is one non-empty line")
        if len(self.root_hash) != HASH_SIZE:
            raise NoteError("malformed_checkpoint", "the root hash is 32 bytes")
        lines = [self.origin, str(self.size), b64encode(self.root_hash), *self.extensions]
        return "".join(line + "\n" for line in lines)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        if not text.endswith("\n"):
            raise NoteError("malformed_checkpoint", "a checkpoint body ends with a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3:
            raise NoteError("malformed_checkpoint", "a checkpoint body has at least three lines")
        origin, size, root, *extensions = lines
        if not origin:
            raise NoteError("malformed_checkpoint", "the origin line is empty")
        try:
            root_hash = b64decode_strict(root)
        except ValueError as exc:
            raise NoteError("malformed_checkpoint", "the root hash is not base64") from exc
        if len(root_hash) != HASH_SIZE:
            raise NoteError("malformed_checkpoint", "the root hash is not 32 bytes")
        if any(not line for line in extensions):
            raise NoteError("malformed_checkpoint", "an extension line is empty")
        return cls(origin, _decimal(size, "the tree size"), root_hash, tuple(extensions))

    @classmethod
    def from_note(cls, note: str) -> Checkpoint:
        """The body of a signed checkpoint note (its signatures are not checked here)."""
        text, _ = parse_note(note)
        return cls.parse(text)


@dataclass(frozen=True)
class TlogProof:
    """A ``tlog-proof@v1``: the leaf index, the inclusion path, the signed checkpoint, optional extra data."""

    index: int
    path: tuple[bytes, ...]
    checkpoint_note: str
    extra: bytes | None = None

    def text(self) -> str:
        lines = [PROOF_HEADER]
        if self.extra is not None:
            lines.append(f"extra {b64encode(self.extra)}")
        lines.append(f"index {self.index}")
        lines += [b64encode(h) for h in self.path]
        return "\n".join(lines) + "\n\n" + self.checkpoint_note

    @classmethod
    def parse(cls, text: str) -> TlogProof:
        if not isinstance(text, str):
            raise NoteError("malformed_proof", "a tlog-proof is text")
        head, sep, note = text.partition("\n\n")
        if not sep:
            raise NoteError("malformed_proof", "a tlog-proof has a blank line before its checkpoint")
        lines = head.split("\n")
        if lines[0] != PROOF_HEADER:
            raise NoteError("malformed_proof", f"a tlog-proof starts with {PROOF_HEADER}")
        position = 1
        extra = None
        if position < len(lines) and lines[position].startswith("extra "):
            try:
                extra = b64decode_strict(lines[position][len("extra ") :])
            except ValueError as exc:
                raise NoteError("malformed_proof", "the extra data is not base64") from exc
            position += 1
        if position >= len(lines) or not lines[position].startswith("index "):
            raise NoteError("malformed_proof", "a tlog-proof names the leaf index")
        try:
            index = _decimal(lines[position][len("index ") :], "the index")
        except NoteError as exc:
            raise NoteError("malformed_proof", str(exc)) from exc
        path = []
        for line in lines[position + 1 :]:
            try:
                value = b64decode_strict(line)
            except ValueError as exc:
                raise NoteError("malformed_proof", "a proof line is not base64") from exc
            if len(value) != HASH_SIZE:
                raise NoteError("malformed_proof", "a proof line is not a 32-byte hash")
            path.append(value)
        if len(path) > 63:
            raise NoteError("malformed_proof", "more than 63 proof hashes")
        return cls(index, tuple(path), note, extra)
