"""Where evidence signing private keys live: the environment or an owner-only key file.

* ``settings.SIGNING_KEY_PRIVATE``: one unpadded base64url 32-byte Ed25519
  seed (production: a secret injected by the platform);
* ``settings.SIGNING_KEY_FILE`` (default ``.data/keys/signing-keys.json``,
  git-ignored, mode 0600): ``{"keys": [{"kid", "private_key", "created_at"}]}``.
  It may hold several keys so that a rotated key's private part stays with
  the operator; verification never needs it.

The database stores public keys only. Loaded private keys are cached in
process memory by key id; a key id is derived from the public key, so a cached
entry can never go stale. Nothing here logs or returns private material except
:func:`private_key_for` to the signing code.

Test runs (``settings.TESTING`` or ``TOLLGATE_TESTING`` in the environment,
which the root ``conftest.py`` sets) that still point at the developer's
default key file are redirected to a per-process temporary file, so no test
can write into the real key store whatever its fixtures do.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from audit.evidence_core import key_id_for_public_key, private_key_from_seed, raw_public_key
from common.cache import BoundedCache
from common.canonical import b64url_decode_strict, b64url_encode

# Private keys by kid, once read from the environment or the key file (a kid names one key forever).
_cache: BoundedCache[str, Ed25519PrivateKey] = BoundedCache("audit.private_keys", max_entries=1_000)
_lock = threading.Lock()
_test_dir: Path | None = None


@dataclass(frozen=True)
class KeyMaterial:
    """A private key with its derived id and public key (base64url). Never serialized."""

    kid: str
    private_key: Ed25519PrivateKey
    public_key: str

    def __repr__(self) -> str:  # keep the private key out of tracebacks and logs
        return f"KeyMaterial(kid={self.kid!r})"


def material(private_key: Ed25519PrivateKey) -> KeyMaterial:
    raw = raw_public_key(private_key)
    return KeyMaterial(kid=key_id_for_public_key(raw), private_key=private_key, public_key=b64url_encode(raw))


def _seed(private_key: Ed25519PrivateKey) -> bytes:
    return private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _default_key_file() -> Path:
    return (Path(settings.BASE_DIR) / ".data" / "keys" / "signing-keys.json").resolve()


def _testing() -> bool:
    # The environment is read at call time: pytest-django may load settings before conftest sets the flag.
    flag = os.environ.get("TOLLGATE_TESTING", "").strip().lower() in ("1", "true", "yes", "on")
    return flag or bool(getattr(settings, "TESTING", False))


def key_file_path() -> Path:
    """The key file in use (a temporary one for test runs aimed at the developer's real file)."""
    global _test_dir
    path = Path(settings.SIGNING_KEY_FILE).expanduser().resolve()
    if path == _default_key_file() and _testing():
        with _lock:
            if _test_dir is None:
                _test_dir = Path(tempfile.mkdtemp(prefix="tollgate-test-keys-"))
                atexit.register(shutil.rmtree, _test_dir, True)
        return _test_dir / "signing-keys.json"
    return path


def env_key() -> KeyMaterial | None:
    """The key from ``SIGNING_KEY_PRIVATE``, if set."""
    value = (getattr(settings, "SIGNING_KEY_PRIVATE", "") or "").strip()
    if not value:
        return None
    try:
        seed = b64url_decode_strict(value)
        if len(seed) != 32:
            raise ValueError("wrong length")
        key = material(private_key_from_seed(seed))
    except ValueError as exc:
        raise ImproperlyConfigured(
            "SIGNING_KEY_PRIVATE must be an unpadded base64url 32-byte Ed25519 private key"
        ) from exc
    _cache.set(key.kid, key.private_key)
    return key


def _read_file(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open("r", encoding="utf-8") as fh:
        data = json.load(fh)
    keys = data.get("keys", []) if isinstance(data, dict) else []
    return [entry for entry in keys if isinstance(entry, dict)]


def file_keys() -> list[KeyMaterial]:
    """Every key in the key file, oldest first."""
    out = []
    for entry in _read_file(key_file_path()):
        try:
            key = material(private_key_from_seed(b64url_decode_strict(str(entry["private_key"]))))
        except (KeyError, ValueError) as exc:
            raise ImproperlyConfigured(f"unreadable entry in the signing key file {key_file_path()}") from exc
        _cache.set(key.kid, key.private_key)
        out.append(key)
    return out


def private_key_for(kid: str) -> Ed25519PrivateKey | None:
    """The private key for ``kid`` from memory, the environment or the key file; None if unavailable."""
    cached = _cache.get(kid)
    if cached is not None:
        return cached
    env = env_key()
    if env is not None and env.kid == kid:
        return env.private_key
    for key in file_keys():
        if key.kid == kid:
            return key.private_key
    return None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_owner_only_json(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` with ``document`` atomically (a temporary file beside it, mode 0600, fsync, rename).

    The caller holds the file's lock (``_file_lock``). Also the transparency log's key file (tlog.keys).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def generate_and_store() -> KeyMaterial:
    """Generate a key and append it to the key file (atomic replace, mode 0600). Returns it."""
    key = material(Ed25519PrivateKey.generate())
    path = key_file_path()
    with _file_lock(path):
        entries = _read_file(path)
        entries.append(
            {
                "kid": key.kid,
                "private_key": b64url_encode(_seed(key.private_key)),
                "created_at": timezone.now().isoformat(),
            }
        )
        write_owner_only_json(path, {"keys": entries})
    _cache.set(key.kid, key.private_key)
    return key
