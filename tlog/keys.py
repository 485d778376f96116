"""The log's Ed25519 note key: where its private part lives, and the signer and verifier of each tenant's log.

One key signs the checkpoints of every tenant's log, each under the log's origin as the key name
(C2SP signed-note), so each log has its own key id and verifier string and a signature for one
tenant's log is no signature for another's (docs/decisions.md, Evidence). The private part is kept
like the evidence signing keys (audit.keystore): ``TLOG_KEY_PRIVATE`` (an unpadded base64url 32-byte
seed) or the owner-only key file ``TLOG_KEY_FILE``, created on first use by the integrator. Only the
integrator signs; the public part is recorded in ``tlog_log_key`` for the web servers to publish.
Nothing here logs or returns the private key.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from audit import keystore
from common.cache import BoundedCache
from common.canonical import b64url_decode_strict, b64url_encode
from tlog.lib import checkpoint, note
from tlog.models import LogKey

_loaded: BoundedCache[str, Ed25519PrivateKey] = BoundedCache("tlog.log_key", max_entries=1)


def gateway_name() -> str:
    """The gateway's name in every log's origin line (``TLOG_GATEWAY_NAME``)."""
    return str(settings.TLOG_GATEWAY_NAME)


def origin_of(tenant_id: str) -> str:
    """The origin line of the tenant's log, ``<gateway>/tlog/<tenant id>``."""
    return checkpoint.log_origin(gateway=gateway_name(), tenant=tenant_id)


def key_file_path() -> Path:
    """The key file (a per-process temporary one for test runs aimed at the default file, as audit.keystore)."""
    path = Path(settings.TLOG_KEY_FILE).expanduser().resolve()
    default = (Path(settings.BASE_DIR) / ".data" / "keys" / "tlog-key.json").resolve()
    if path == default and keystore._testing():
        return keystore.key_file_path().with_name("tlog-key.json")
    return path


def _from_seed(text: str, where: str) -> Ed25519PrivateKey:
    try:
        seed = b64url_decode_strict(text)
        if len(seed) != 32:
            raise ValueError("wrong length")
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where} must be an unpadded base64url 32-byte Ed25519 private key") from exc
    return Ed25519PrivateKey.from_private_bytes(seed)


def private_key() -> Ed25519PrivateKey:
    """The log key: from ``TLOG_KEY_PRIVATE``, else the key file, created (mode 0600) when it does not exist."""
    cached = _loaded.get("key")
    if cached is not None:
        return cached
    value = (settings.TLOG_KEY_PRIVATE or "").strip()
    if value:
        key = _from_seed(value, "TLOG_KEY_PRIVATE")
    else:
        path = key_file_path()
        with keystore._file_lock(path):
            if path.exists():
                key = _from_seed(str(json.loads(path.read_text(encoding="utf-8")).get("private_key", "")), str(path))
            else:
                key = Ed25519PrivateKey.generate()
                seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
                keystore.write_owner_only_json(
                    path, {"private_key": b64url_encode(seed), "created_at": timezone.now().isoformat()}
                )
    _loaded.set("key", key)
    return key


def public_key_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def log_signer(tenant_id: str) -> note.Signer:
    """The note signer of the tenant's log (the log key named by the log's origin); records its public part."""
    key = private_key()
    public = note.b64encode(public_key_bytes(key))
    LogKey.objects.get_or_create(public_key=public, defaults={"created_at": timezone.now()})
    return note.Signer(origin_of(tenant_id), key)


def log_verifiers(tenant_id: str) -> list[note.Verifier]:
    """The note verifiers of the tenant's log: one per published log key (newest first)."""
    origin = origin_of(tenant_id)
    return [
        note.Verifier(origin, note.ALG_ED25519, note.b64decode_strict(public))
        for public in LogKey.objects.order_by("-created_at").values_list("public_key", flat=True)
    ]
