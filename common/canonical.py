"""Canonical JSON (RFC 8785) and hashing helpers shared by every signed or chained object.

This module imports no Django so the offline verifier can reuse the same rules.

``rfc8785.dumps`` is the reference implementation but costs about 25 us for an
audit event, which caps chain verification near 40,000 events/s. For the
values Tollgate actually signs and chains (strings, safe integers, booleans,
null, arrays and objects whose keys sort the same in UTF-16 and in code points)
RFC 8785 output is byte-for-byte what the C-accelerated ``json`` encoder writes
with sorted keys, no whitespace and no ASCII escaping:

* strings: both escape ``"`` and ``\\``, write ``\\b \\f \\n \\r \\t`` short and
  every other control character as ``\\u00xx`` with lowercase hex, and leave
  everything else (DEL, U+2028, non-ASCII) as UTF-8;
* integers with ``|n| <= 2**53 - 1``: both write plain decimal digits;
* key order: RFC 8785 sorts by UTF-16 code units, Python by code points; the
  two orders differ only between a supplementary character (a surrogate pair
  in UTF-16, 0xD800-0xDFFF) and a BMP character at or above U+E000, so keys
  below U+E000 sort identically;
* floats (tool results are full of them): RFC 8785 writes a number as
  ECMAScript's ``Number.prototype.toString`` does, with the same shortest
  round-trip digits as Python's ``repr``. For a finite non-integral float of
  magnitude at least 1e-4 (non-integral floats are all below 2**53) both
  write those digits in plain decimal notation, so the bytes are equal. An
  integral float below 2**53 is written as the integer (``3.0`` becomes
  ``3``), which is what the C encoder writes for ``int(value)``, so such
  floats are converted first (:func:`_ready` copies only the containers
  that hold one).

Anything else (smaller or larger floats, large integers, exotic keys, lone
surrogates) takes the reference path, so :func:`canonical_bytes_fast` equals :func:`canonical_bytes`
on every input, including raising on the same inputs. The property test in
``tests/test_audit_canonical.py`` checks this with hypothesis.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring as _json_string  # C implementation when available
from typing import Any, TypedDict, Unpack

import rfc8785

MAX_SAFE_INTEGER = 2**53 - 1
# Keys with such characters sort differently by UTF-16 units (RFC 8785) than by code points (sort_keys);
# an ASCII key never has one, so it skips the search.
_KEY_UNSAFE = re.compile("[\ue000-\U0010ffff]")
_reference_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode


def _no_default(value: Any) -> Any:
    raise TypeError(f"not JSON: {type(value).__name__}")


def _make_encode() -> Callable[[Any], str]:
    """The C encoder built once (``JSONEncoder.encode`` rebuilds it on every call, about 1 us)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _reference_encode
    try:
        iterencode = make(None, _no_default, _json_string, None, ":", ",", True, False, False)
        probe = {"b": [1, "\u00e9\n", None, True], "a": {}}
        if "".join(iterencode(probe, 0)) != _reference_encode(probe):
            return _reference_encode
    except TypeError:  # another interpreter's signature
        return _reference_encode
    return lambda value: "".join(iterencode(value, 0))


_encode = _make_encode()
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")

CanonicalizationError = rfc8785.CanonicalizationError


def canonical_bytes(obj: Any) -> bytes:
    """RFC 8785 (JCS) canonical UTF-8 bytes of a JSON-compatible object (reference implementation)."""
    return rfc8785.dumps(obj)


class _Unsafe:
    """Marker: the value is outside the subset the C encoder writes as RFC 8785."""


_UNSAFE: Any = _Unsafe()
_MIN_PLAIN_FLOAT = 1e-4  # below this, repr switches to exponent notation long before ECMAScript does


def _ready(value: Any) -> Any:
    """``value`` in a form the C json encoder writes as its RFC 8785 bytes, or ``_UNSAFE``.

    Returns ``value`` itself when nothing needs converting; otherwise a copy of
    the containers on the way to each integral float, which becomes an ``int``.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        return value if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else _UNSAFE
    if kind is float:
        if not math.isfinite(value):
            return _UNSAFE
        if value.is_integer():
            return int(value) if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else _UNSAFE
        return value if abs(value) >= _MIN_PLAIN_FLOAT else _UNSAFE
    if kind is dict or kind is list:
        if kind is dict:
            for key in value:
                if type(key) is not str or (not key.isascii() and _KEY_UNSAFE.search(key)):
                    return _UNSAFE
        copy: Any = None  # a copy only of a container that holds a converted item
        for key, item in value.items() if kind is dict else enumerate(value):
            ready = _ready(item)
            if ready is not item:
                if ready is _UNSAFE:
                    return _UNSAFE
                if copy is None:
                    copy = kind(value)
                copy[key] = ready
        return value if copy is None else copy
    if isinstance(value, str):  # a str enum such as a model's TextChoices: both encoders write its text
        return value
    return _UNSAFE


def _plain(value: Any) -> bool:
    """True when ``value`` is in the subset where the C json encoder writes RFC 8785 bytes (after ``_ready``)."""
    return _ready(value) is not _UNSAFE


def fast_text(value: Any) -> str | None:
    """RFC 8785 text of ``value`` from the C encoder, or ``None`` when it needs the reference path."""
    ready = _ready(value)
    if ready is _UNSAFE:
        return None
    return _encode(ready)


def check_round_trip(value: Any) -> None:
    """Refuse values whose canonical form would change after a PostgreSQL ``jsonb`` round trip.

    ``jsonb`` stores numbers as decimals and prints integral ones without an
    exponent, so a float of 2**53 or more comes back as an integer outside the
    RFC 8785 domain, and NaN or infinity cannot be stored at all. Audit details
    are hashed before storage and re-hashed after reading, so such values would
    read back as tampering. Raises ``ValueError``.
    """
    if _plain(value):
        return
    kind = type(value)
    if kind is float:
        if not math.isfinite(value) or abs(value) >= 2**53:
            raise ValueError(f"{value!r} does not survive storage; send large or special numbers as strings")
    elif kind is dict:
        for item in value.values():
            check_round_trip(item)
    elif kind is list:
        for item in value:
            check_round_trip(item)


def canonical_bytes_fast(obj: Any) -> bytes:
    """Same bytes as :func:`canonical_bytes` for every input, several times faster on plain values."""
    text = fast_text(obj)
    if text is not None:
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogate: let the reference path raise its own error
            pass
    return rfc8785.dumps(obj)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with a ``Z`` suffix, as hashed into audit events (microseconds when non-zero)."""
    text = moment.isoformat()
    if text.endswith("+00:00"):
        return text[:-6] + "Z"
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AuditEventContent(TypedDict):
    """An audit event's hashed payload: every field except ``prev_hash`` and ``hash``."""

    event_id: str
    chain: str
    seq: int
    event: str
    tenant_id: str | None
    wallet_id: str | None
    key_id: str | None
    tool: str | None
    endpoint: str | None
    policy_decision_id: str | None
    request_id: str | None
    ok: bool
    detail: Any
    created_at: str


def audit_event_bytes(**content: Unpack[AuditEventContent]) -> bytes:
    """Canonical bytes of an audit event's hashed payload (everything except ``prev_hash`` and ``hash``).

    Equal to ``canonical_bytes(audit_event_payload(...))``.
    """
    return event_bytes(
        content["chain"],
        content["seq"],
        content["event_id"],
        content["event"],
        content["tenant_id"],
        content["wallet_id"],
        content["key_id"],
        content["tool"],
        content["endpoint"],
        content["policy_decision_id"],
        content["request_id"],
        content["ok"],
        content["detail"],
        content["created_at"],
    )


def event_bytes(
    chain: str,
    seq: int,
    event_id: str,
    event: str,
    tenant_id: str | None,
    wallet_id: str | None,
    key_id: str | None,
    tool: str | None,
    endpoint: str | None,
    policy_decision_id: str | None,
    request_id: str | None,
    ok: bool,
    detail: Any,
    created_at: str,
) -> bytes:
    """Positional form of :func:`audit_event_bytes` for the verification loop.

    The object is written out field by field with keys in RFC 8785 order;
    ``_json_string`` raises ``TypeError`` on anything but ``str``, so a value of
    an unexpected type falls back to the reference path.
    """
    js = _json_string
    ready = _ready(detail)
    if type(seq) is int and type(ok) is bool and -MAX_SAFE_INTEGER <= seq <= MAX_SAFE_INTEGER and ready is not _UNSAFE:
        try:
            return (
                f'{{"chain":{js(chain)},"created_at":{js(created_at)},"detail":{_encode(ready)},'
                f'"endpoint":{"null" if endpoint is None else js(endpoint)},"event":{js(event)},'
                f'"event_id":{js(event_id)},"key_id":{"null" if key_id is None else js(key_id)},'
                f'"ok":{"true" if ok else "false"},'
                f'"policy_decision_id":{"null" if policy_decision_id is None else js(policy_decision_id)},'
                f'"request_id":{"null" if request_id is None else js(request_id)},"seq":{seq},'
                f'"tenant_id":{"null" if tenant_id is None else js(tenant_id)},'
                f'"tool":{"null" if tool is None else js(tool)},"type":"audit_event",'
                f'"wallet_id":{"null" if wallet_id is None else js(wallet_id)}}}'
            ).encode()
        except (TypeError, UnicodeEncodeError):
            pass
    return canonical_bytes(
        audit_event_payload(
            event_id=event_id,
            chain=chain,
            seq=seq,
            event=event,
            tenant_id=tenant_id,
            wallet_id=wallet_id,
            key_id=key_id,
            tool=tool,
            endpoint=endpoint,
            policy_decision_id=policy_decision_id,
            request_id=request_id,
            ok=ok,
            detail=detail,
            created_at=created_at,
        )
    )


def audit_event_payload(**content: Unpack[AuditEventContent]) -> dict[str, Any]:
    """The hashed content of an audit event as a JSON object (its keys are sorted when it is hashed)."""
    return {"type": "audit_event", **content}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Lenient base64url decoding (padding optional)."""
    padding = "=" * (-len(text) % 4)
    return base64.urlsafe_b64decode(text + padding)


def b64url_decode_strict(text: str) -> bytes:
    """Decode unpadded base64url, refusing any other spelling of the same bytes.

    Raises ``ValueError`` on padding, characters outside the alphabet, an
    impossible length or non-zero trailing bits, so one byte string has exactly
    one accepted encoding.
    """
    if not isinstance(text, str) or not _B64URL.match(text) or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:
        raise ValueError("not base64url") from exc
    if b64url_encode(data) != text:
        raise ValueError("non-canonical base64url")
    return data
