"""OAuth 2.0 client credentials for upstream servers (docs/decisions.md, "Upstream servers").

``token_fetch`` asks a token endpoint for an access token (RFC 6749 section 4.4): one POST of
``application/x-www-form-urlencoded`` ``grant_type=client_credentials`` (with ``scope`` and the RFC 8707
``resource`` when set), the client authenticated by HTTP Basic (``client_secret_basic``, RFC 6749
section 2.3.1: id and secret form-urlencoded, then base64). No redirect is followed and no proxy setting
of the environment is used, so the secret goes to the token URL only.

``TokenCache`` holds one token per key per process (the caller's key names the server, whose credential
and its version) and fetches one when it has none or the one it has is within ``margin`` seconds of its
``expires_in``; concurrent callers of one key wait on that key's lock, so one fetch serves them all.

Nothing here puts the client secret or a token in an exception, a log line or a ``repr``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import quote_plus

import httpx

from common.cache import BoundedCache
from mcpgateway.upstream.client import UpstreamError
from mcpgateway.upstream.http import _check_value

MAX_TOKEN_RESPONSE_BYTES: Final = 64 * 1024
DEFAULT_LIFETIME: Final = 300.0
"""Seconds a token whose answer has no ``expires_in`` is reused (until the upstream refuses it first)."""
# RFC 6749 section 5.2's error codes, and RFC 8707's: the only text of a token endpoint's answer that is repeated.
_OAUTH_ERRORS: Final = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_target",
    }
)

Failure = Literal["unreachable", "unavailable", "refused", "malformed"]


@dataclass(frozen=True)
class ClientCredentials:
    """What a credential of kind ``oauth_client_credentials`` holds (the secret never in its ``repr``)."""

    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str = ""
    resource: str = ""


@dataclass(frozen=True)
class AccessToken:
    """An access token and when (``time.monotonic()``) it was obtained and expires; its value never in a ``repr``."""

    value: str = field(repr=False)
    obtained_at: float
    expires_at: float

    @property
    def authorization(self) -> str:
        return f"Bearer {self.value}"


class TokenUnavailable(UpstreamError):
    """No access token could be had: ``failure`` says why in a word, ``reason`` in a sentence without secrets.

    ``unreachable`` (no answer: refused, timed out, reset) and ``unavailable`` (a 5xx) may pass;
    ``refused`` (a 4xx: the endpoint refused these credentials; ``oauth_error`` is its RFC 6749 code
    when it gave a known one) and ``malformed`` (an answer that is not a bearer token) need the operator.
    """

    def __init__(self, reason: str, *, failure: Failure, oauth_error: str | None = None) -> None:
        super().__init__(reason)
        self.failure = failure
        self.oauth_error = oauth_error


def _basic(credentials: ClientCredentials) -> str:
    """``client_secret_basic``: the id and the secret each form-urlencoded, joined by a colon, in base64."""
    pair = f"{quote_plus(credentials.client_id)}:{quote_plus(credentials.client_secret)}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")


def token_fetch(credentials: ClientCredentials, *, connect_timeout: float, read_timeout: float) -> AccessToken:
    """One token request to ``credentials.token_url``; raises ``TokenUnavailable`` when no usable token came."""
    form = {"grant_type": "client_credentials"}
    if credentials.scope:
        form["scope"] = credentials.scope
    if credentials.resource:
        form["resource"] = credentials.resource
    timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
    started = now()
    try:
        with (
            httpx.Client(timeout=timeout, trust_env=False, follow_redirects=False) as client,
            client.stream(
                "POST",
                credentials.token_url,
                data=form,
                headers={"Authorization": _basic(credentials), "Accept": "application/json"},
            ) as response,
        ):
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_TOKEN_RESPONSE_BYTES:
                    raise TokenUnavailable(
                        f"the token endpoint's answer is larger than {MAX_TOKEN_RESPONSE_BYTES} bytes",
                        failure="malformed",
                    )
            status = response.status_code
    except httpx.HTTPError as exc:
        # The class name only: httpx's text can carry the URL, never the secret (it is in a header).
        raise TokenUnavailable(
            f"the token endpoint could not be reached ({type(exc).__name__})", failure="unreachable"
        ) from None
    return _token_of(status, body, obtained_at=started)


def _token_of(status: int, body: bytes, *, obtained_at: float) -> AccessToken:
    """The token in a token endpoint's answer (RFC 6749 sections 5.1 and 5.2), else ``TokenUnavailable``."""
    try:
        answer: Any = json.loads(body)
    except ValueError:
        answer = None
    if status >= 500:
        raise TokenUnavailable(f"the token endpoint answered HTTP {status}", failure="unavailable")
    if not 200 <= status < 300:
        code = answer.get("error") if isinstance(answer, dict) else None
        known = code if isinstance(code, str) and code in _OAUTH_ERRORS else None
        said = f" ({known})" if known else ""
        raise TokenUnavailable(
            f"the token endpoint refused the client credentials: HTTP {status}{said}",
            failure="refused",
            oauth_error=known,
        )
    if not isinstance(answer, dict):
        raise TokenUnavailable("the token endpoint's answer is not a JSON object", failure="malformed")
    value, kind, expires_in = answer.get("access_token"), answer.get("token_type"), answer.get("expires_in")
    if not isinstance(value, str) or not value or " " in value:
        raise TokenUnavailable("the token endpoint's answer has no usable access_token", failure="malformed")
    try:
        _check_value(value)
    except ValueError:
        raise TokenUnavailable("the access_token is not printable ASCII", failure="malformed") from None
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise TokenUnavailable("the token endpoint's answer is not a bearer token", failure="malformed")
    if expires_in is None:
        lifetime = DEFAULT_LIFETIME
    elif isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and expires_in > 0:
        lifetime = float(expires_in)
    else:
        raise TokenUnavailable("the token endpoint's expires_in is not a positive number", failure="malformed")
    return AccessToken(value=value, obtained_at=obtained_at, expires_at=obtained_at + lifetime)


Fetch = Callable[[], AccessToken]


class TokenCache:
    """One access token per key per process, fetched once per key however many callers need it at once."""

    def __init__(self, name: str, *, max_entries: int = 10_000) -> None:
        self._tokens: BoundedCache[Any, AccessToken] = BoundedCache(name, max_entries=max_entries)
        self._locks: BoundedCache[Any, threading.Lock] = BoundedCache(f"{name}.locks", max_entries=max_entries)
        # The last failed fetch of a key (when it ended, why): callers that waited for it share its failure.
        self._failures: BoundedCache[Any, tuple[float, TokenUnavailable]] = BoundedCache(
            f"{name}.failures", max_entries=max_entries
        )
        self._locks_lock = threading.Lock()

    def _usable(self, key: Any, margin: float) -> AccessToken | None:
        token = self._tokens.get(key)
        if token is not None and now() < token.expires_at - margin:
            return token
        return None

    def get(self, key: Any, fetch: Fetch, *, margin: float) -> AccessToken:
        """The token cached under ``key``, or one ``fetch`` gets (under the key's lock) when there is none usable.

        Usable: more than ``margin`` seconds before its expiry. A token just fetched is returned even
        when its whole life is shorter than the margin (it is then fetched again by the next caller).
        ``fetch``'s ``TokenUnavailable`` reaches every caller that waited for that fetch (they do not
        fetch again one after another); no token is cached, and the next caller fetches again.
        """
        token = self._usable(key, margin)
        if token is not None:
            return token
        waiting_since = time.monotonic()
        with self._locks_lock:
            lock = self._locks.get(key)
            if lock is None:
                lock = threading.Lock()
                self._locks.set(key, lock)
        with lock:
            token = self._usable(key, margin)  # another caller fetched it while this one waited
            if token is not None:
                return token
            failed = self._failures.get(key)
            if failed is not None and failed[0] >= waiting_since:
                earlier = failed[1]  # the fetch this caller waited for failed: the same failure, raised anew
                raise TokenUnavailable(earlier.reason, failure=earlier.failure, oauth_error=earlier.oauth_error)
            try:
                token = fetch()
            except TokenUnavailable as exc:
                self._failures.set(key, (time.monotonic(), exc))
                raise
            self._tokens.set(key, token)
            return token

    def drop(self, key: Any, token: AccessToken | None = None) -> None:
        """Forget the token of ``key`` (only if it is still ``token``, when given): the next caller fetches one."""
        if token is None or self._tokens.get(key) is token:
            self._tokens.pop(key)


def now() -> float:
    """The clock tokens' lives are measured on (``time.monotonic``); tests replace it to age a token."""
    return time.monotonic()
