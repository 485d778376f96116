"""C2SP ``signed-note`` (Ed25519 note keys) and ``tlog-cosignature`` (``cosignature/v1``).

A note is UTF-8 text ending in a newline, a blank line, then signature lines
``— <name> base64(key id || signature)``. The key id is the first four bytes of
``SHA-256(<name> || "\\n" || <type byte> || <public key>)``: type 0x01 for an Ed25519 note key,
0x04 for an Ed25519 ``cosignature/v1`` witness key. A verifier key is published as the string
``<name>+<key id, 8 hex digits>+base64(<type byte> || <public key>)`` and a signer key is kept as
``PRIVATE+KEY+<name>+<key id>+base64(0x01 || <32-byte seed>)``.

A ``cosignature/v1`` signs ``"cosignature/v1\\ntime <t>\\n" || <note text>`` and its signature bytes
are the 8-byte big-endian timestamp followed by the 64-byte Ed25519 signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = [
    "ALG_COSIGNATURE_V1",
    "ALG_ED25519",
    "Cosigner",
    "NoteError",
    "NoteSignature",
    "Signer",
    "Verifier",
    "format_note",
    "generate_signer",
    "key_id",
    "parse_note",
    "verified_signatures",
]

ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04
SIGNATURE_PREFIX = "— "  # U+2014 EM DASH and a space
MAX_SIGNATURES = 100
_B64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


class NoteError(ValueError):
    """A malformed note or key, or a signature that fails; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def b64decode_strict(text: str) -> bytes:
    """Standard padded base64 (RFC 4648 section 4), canonical spelling only."""
    if not _B64.match(text) or len(text) % 4:
        raise ValueError("not standard base64")
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError("not standard base64") from exc
    if base64.b64encode(data).decode("ascii") != text:
        raise ValueError("non-canonical base64")
    return data


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _check_name(name: str) -> None:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise NoteError("bad_key_name", f"a key name must be non-empty, without spaces or '+': {name!r}")


def key_id(name: str, alg: int, public_key: bytes) -> int:
    """The 32-bit key id of a key of type ``alg`` named ``name``."""
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: the key name, the key id and the signature bytes after the id."""

    name: str
    key_id: int
    signature: bytes

    def line(self) -> str:
        return f"{SIGNATURE_PREFIX}{self.name} {b64encode(self.key_id.to_bytes(4, 'big') + self.signature)}\n"


@dataclass(frozen=True)
class Verifier:
    """A public key that checks note signatures: an Ed25519 note key or a ``cosignature/v1`` key."""

    name: str
    alg: int
    public_key: bytes

    @property
    def key_id(self) -> int:
        return key_id(self.name, self.alg, self.public_key)

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """``<name>+<hex key id>+<base64(type || key)>``; the key id must be the one the key derives."""
        if not isinstance(vkey, str):
            raise NoteError("bad_verifier_key", "a verifier key is a string")
        name, sep1, rest = vkey.partition("+")
        hex_id, sep2, material = rest.partition("+")
        if not sep1 or not sep2 or not re.fullmatch(r"[0-9a-f]{8}", hex_id):
            raise NoteError("bad_verifier_key", f"not <name>+<key id>+<key>: {vkey!r}")
        _check_name(name)
        try:
            raw = b64decode_strict(material)
        except ValueError as exc:
            raise NoteError("bad_verifier_key", "the key is not base64") from exc
        if len(raw) != 33 or raw[0] not in (ALG_ED25519, ALG_COSIGNATURE_V1):
            raise NoteError("bad_verifier_key", "only Ed25519 note and cosignature/v1 keys are supported")
        verifier = cls(name, raw[0], raw[1:])
        if verifier.key_id != int(hex_id, 16):
            raise NoteError("bad_verifier_key", "the key id is not the one this key derives")
        return verifier

    def __str__(self) -> str:
        return f"{self.name}+{self.key_id:08x}+{b64encode(bytes([self.alg]) + self.public_key)}"

    def matches(self, sig: NoteSignature) -> bool:
        return sig.name == self.name and sig.key_id == self.key_id

    def verify(self, text: bytes, sig: NoteSignature) -> bool:
        """Whether ``sig`` (already matched by name and id) signs the note text ``text``."""
        if self.alg == ALG_COSIGNATURE_V1:
            if len(sig.signature) != 72:
                return False
            timestamp = int.from_bytes(sig.signature[:8], "big")
            if timestamp >= 1 << 63:
                return False
            message = cosigned_message(text, timestamp)
            raw = sig.signature[8:]
        else:
            message, raw = text, sig.signature
        if len(raw) != 64:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(raw, message)
        except (InvalidSignature, ValueError):
            return False
        return True


def cosigned_message(text: bytes, timestamp: int) -> bytes:
    """What a ``cosignature/v1`` signs: the header line, the time line, then the note text."""
    return b"cosignature/v1\ntime " + str(timestamp).encode("ascii") + b"\n" + text


def cosignature_timestamp(sig: NoteSignature) -> int:
    """The timestamp a ``cosignature/v1`` signature carries."""
    if len(sig.signature) != 72:
        raise NoteError("bad_cosignature", "a cosignature/v1 is 8 timestamp bytes and a 64-byte signature")
    return int.from_bytes(sig.signature[:8], "big")


class Signer:
    """An Ed25519 note key (type 0x01): signs note text."""

    alg = ALG_ED25519

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        _check_name(name)
        self.name = name
        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def parse(cls, skey: str) -> Signer:
        """``PRIVATE+KEY+<name>+<hex key id>+base64(0x01 || seed)``."""
        prefix = "PRIVATE+KEY+"
        if not isinstance(skey, str) or not skey.startswith(prefix):
            raise NoteError("bad_signer_key", "a signer key starts with PRIVATE+KEY+")
        name, sep1, rest = skey[len(prefix) :].partition("+")
        hex_id, sep2, material = rest.partition("+")
        if not sep1 or not sep2 or not re.fullmatch(r"[0-9a-f]{8}", hex_id):
            raise NoteError("bad_signer_key", "not PRIVATE+KEY+<name>+<key id>+<key>")
        try:
            raw = b64decode_strict(material)
        except ValueError as exc:
            raise NoteError("bad_signer_key", "the key is not base64") from exc
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise NoteError("bad_signer_key", "only Ed25519 signer keys are supported")
        signer = cls(name, Ed25519PrivateKey.from_private_bytes(raw[1:]))
        if signer.key_id != int(hex_id, 16):
            raise NoteError("bad_signer_key", "the key id is not the one this key derives")
        return signer

    @property
    def key_id(self) -> int:
        return key_id(self.name, self.alg, self.public_key)

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, self.alg, self.public_key)

    def signer_key(self) -> str:
        """The ``PRIVATE+KEY+...`` string (keep it secret)."""
        seed = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return f"PRIVATE+KEY+{self.name}+{self.key_id:08x}+{b64encode(bytes([ALG_ED25519]) + seed)}"

    def sign(self, text: bytes) -> NoteSignature:
        return NoteSignature(self.name, self.key_id, self._key.sign(text))


class Cosigner(Signer):
    """A witness's Ed25519 ``cosignature/v1`` key (type 0x04), stored as an ordinary signer key."""

    alg = ALG_COSIGNATURE_V1

    @classmethod
    def from_signer_key(cls, skey: str) -> Cosigner:
        """The same seed as the note signer key ``skey``, used for ``cosignature/v1``."""
        signer = Signer.parse(skey)
        return cls(signer.name, signer._key)

    def signer_key(self) -> str:
        """Stored as a type 0x01 signer key of the same seed (the form C2SP tools exchange)."""
        return Signer(self.name, self._key).signer_key()

    def cosign(self, text: bytes, timestamp: int) -> NoteSignature:
        """A ``cosignature/v1`` over the checkpoint text at ``timestamp`` (POSIX seconds)."""
        if not 0 < timestamp < 1 << 63:
            raise NoteError("bad_timestamp", "a cosignature timestamp is positive and below 2**63")
        signature = self._key.sign(cosigned_message(text, timestamp))
        return NoteSignature(self.name, self.key_id, timestamp.to_bytes(8, "big") + signature)

    def sign(self, text: bytes) -> NoteSignature:
        raise NoteError("wrong_key_type", "a cosignature/v1 key only cosigns (Cosigner.cosign)")


def generate_signer(name: str) -> Signer:
    """A fresh Ed25519 note key."""
    return Signer(name, Ed25519PrivateKey.generate())


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("malformed_note", "the note text must end with a newline")
    if "\n\n" in text:
        raise NoteError("malformed_note", "the note text must not contain a blank line")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("malformed_note", "the note text must not contain control characters")


def format_note(text: str, signatures: list[NoteSignature]) -> str:
    """The signed note: the text, a blank line, one line per signature."""
    _check_text(text)
    if not signatures:
        raise NoteError("malformed_note", "a signed note carries at least one signature")
    return text + "\n" + "".join(sig.line() for sig in signatures)


def parse_note(note: str | bytes) -> tuple[str, list[NoteSignature]]:
    """The text and the signature lines of a signed note (nothing verified yet)."""
    if isinstance(note, bytes):
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NoteError("malformed_note", "the note is not UTF-8") from exc
    split = note.rfind("\n\n")
    if split < 0:
        raise NoteError("malformed_note", "the note has no signature block")
    text, block = note[: split + 1], note[split + 2 :]
    _check_text(text)
    if not block.endswith("\n"):
        raise NoteError("malformed_note", "the last signature line must end with a newline")
    signatures: list[NoteSignature] = []
    for line in block[:-1].split("\n"):
        if not line.startswith(SIGNATURE_PREFIX):
            raise NoteError("malformed_note", f"not a signature line: {line[:60]!r}")
        name, sep, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
        if not sep or " " in encoded:
            raise NoteError("malformed_note", "a signature line is '— <name> <base64>'")
        _check_name(name)
        try:
            raw = b64decode_strict(encoded)
        except ValueError as exc:
            raise NoteError("malformed_note", "a signature is not base64") from exc
        if len(raw) < 5:
            raise NoteError("malformed_note", "a signature is shorter than its key id")
        signatures.append(NoteSignature(name, int.from_bytes(raw[:4], "big"), raw[4:]))
    if len(signatures) > MAX_SIGNATURES:
        raise NoteError("malformed_note", f"more than {MAX_SIGNATURES} signatures")
    return text, signatures


def verified_signatures(text: str, signatures: list[NoteSignature], verifiers: list[Verifier]) -> list[Verifier]:
    """The verifiers among ``verifiers`` whose signature on ``text`` is present and valid.

    Lines from unknown keys are ignored; a line that names a known key (name and key id) but does
    not verify makes the note malformed (C2SP signed-note), so it raises ``bad_signature``.
    """
    data = text.encode("utf-8")
    found: list[Verifier] = []
    for sig in signatures:
        for verifier in verifiers:
            if verifier.matches(sig):
                if not verifier.verify(data, sig):
                    raise NoteError("bad_signature", f"the signature of {verifier.name} does not verify")
                if verifier not in found:
                    found.append(verifier)
    return found
