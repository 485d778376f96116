"""Upstream MCP servers as records (docs/decisions.md, "Upstream servers"): their writes, credentials and clients.

Servers are reference data shared by every tenant and written off the hot path (the console, the
operator API, ``UPSTREAM_MCP_URL`` at start). The governed call reads a tool's server with the tool
(``tools._registered_tool``, by ``gateway_tool_version``, which moves with the server's row) and
sends each call through that server's own client (``upstream_client_for``): one connection pool
and one set of limits per server, so a server that hangs holds only its own connections.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from billing.models import ServiceCategory
from common.cache import BoundedCache
from common.errors import ApplicationError, Conflict, NotFound, RequestValidationError
from common.ids import new_id
from mcpgateway.models import (
    CredentialKind,
    UpstreamCredential,
    UpstreamProbeSource,
    UpstreamServer,
    UpstreamTransport,
)
from mcpgateway.services.tools import SyncReport, tools_sync
from mcpgateway.upstream.client import UpstreamClient, UpstreamError
from mcpgateway.upstream.legacy_sse import LegacySseClient
from mcpgateway.upstream.oauth import AccessToken, ClientCredentials, TokenCache, TokenUnavailable, token_fetch
from mcpgateway.upstream.secrets import (
    SecretUnreadable,
    secret_decrypt,
    secret_encrypt,
    secret_is_current,
    secret_reencrypt,
)
from permits.exceptions import PermitDenied

DEFAULT_SLUG = "default"
# Header names a credential may not set: the transport's own, and what the gateway sends itself.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
        "idempotency-key",
        "x-api-key",
    }
)


# --- Refusals of a call to a server (before anything is debited) --------------------------


class UpstreamServerDisabled(PermitDenied):
    code = "upstream_server_disabled"
    message = "The upstream server of this tool is disabled; nothing was charged."


class UpstreamServerNotAllowed(PermitDenied):
    code = "upstream_server_not_allowed"
    message = "The upstream server of this tool is not open to this tenant; nothing was charged."


class UpstreamCredentialsMissing(PermitDenied):
    code = "upstream_credentials_missing"
    message = (
        "The upstream server of this tool requires credentials and none are set for this tenant or the "
        "server; nothing was charged."
    )


class UpstreamCredentialsUnavailable(ApplicationError):
    """No access token for the server's OAuth client credentials: refused before anything is written or debited.

    503 when the token endpoint could not answer (unreachable, a 5xx: retry later, with the same
    idempotency key); ``UpstreamCredentialsRejected`` (502) when it refused the credentials or answered
    something that is not a token (the operator must act). ``failure`` says which in a word.
    """

    code = "upstream_credentials_unavailable"
    http_status = 503
    message = (
        "No access token could be obtained for the upstream server of this tool; nothing was charged and the "
        "call was not recorded (retry later with the same idempotency key)."
    )


class UpstreamCredentialsRejected(UpstreamCredentialsUnavailable):
    http_status = 502
    message = (
        "The token endpoint of the upstream server of this tool refused its client credentials or gave no usable "
        "token; nothing was charged and the call was not recorded."
    )


class UpstreamServerInvalid(RequestValidationError):
    """Settings or credentials that cannot be stored: 422 in the validation shape, one entry per field."""

    def __init__(self, *problems: tuple[str, str]) -> None:
        super().__init__(
            [{"loc": ["body", field], "msg": msg, "type": "upstream_server_invalid"} for field, msg in problems]
        )
        self.problems = problems

    def __str__(self) -> str:
        return "; ".join(f"{field}: {msg}" for field, msg in self.problems)


class UpstreamServerConflict(Conflict):
    code = "upstream_server_conflict"
    message = "Another upstream server has this slug or tool prefix."


class UpstreamSyncFailed(ApplicationError):
    code = "upstream_sync_failed"
    http_status = 502
    message = "The upstream server's tools/list failed; nothing was changed."


class UpstreamServerNotFound(NotFound):
    code = "upstream_server_not_found"
    message = "No such upstream server."


def upstream_check_open(*, server: UpstreamServer, tenant_id: str) -> None:
    """Raise the refusal when ``tenant_id`` may not call ``server``'s tools now (disabled, closed, no credentials)."""
    if not server.enabled:
        raise UpstreamServerDisabled(server=server.slug)
    if not server.open_to(tenant_id):
        raise UpstreamServerNotAllowed(server=server.slug)
    if server.credentials_required and upstream_headers(server=server, tenant_id=tenant_id) is None:
        raise UpstreamCredentialsMissing(server=server.slug)


# --- Writes ---------------------------------------------------------------------------------

# What may change on a server once it exists (through the API or the console); its slug never does.
UPSTREAM_EDITABLE = (
    "name",
    "url",
    "transport",
    "connect_timeout",
    "read_timeout",
    "enabled",
    "required",
    "default_category",
    "tool_prefix",
    "tenant_ids",
    "credentials_required",
)


def upstream_server_validate(values: dict[str, Any]) -> None:
    """Raise ``UpstreamServerInvalid`` naming each setting in ``values`` that cannot be stored."""
    problems: list[tuple[str, str]] = []
    url = values.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        problems.append(("url", "must be an http(s) URL"))
    for name in ("connect_timeout", "read_timeout"):
        value = values.get(name)
        if value is not None and not (isinstance(value, int | float) and 0 < value <= 600):
            problems.append((name, "must be a number of seconds in (0, 600]"))
    prefix = values.get("tool_prefix")
    if prefix is not None and (not isinstance(prefix, str) or "." in prefix or len(prefix) > 64):
        problems.append(("tool_prefix", "must be at most 64 characters without a dot"))
    transport = values.get("transport")
    if transport is not None and transport not in UpstreamTransport.values:
        problems.append(("transport", "must be streamable_http or http_sse"))
    category = values.get("default_category")
    if category is not None and category not in ServiceCategory.values:
        problems.append(("default_category", "must be a service category"))
    tenants = values.get("tenant_ids")
    if tenants is not None and not (isinstance(tenants, list) and all(isinstance(t, str) and t for t in tenants)):
        problems.append(("tenant_ids", "must be null (every tenant) or a list of tenant ids"))
    if problems:
        raise UpstreamServerInvalid(*problems)


@transaction.atomic(durable=True)
def upstream_server_create(*, slug: str, name: str, url: str, actor: str, **values: Any) -> UpstreamServer:
    """Register an upstream server (its tools come with its first sync); audited.

    Refuses a slug or a tool prefix another server has (``UpstreamServerConflict``): the unique
    constraints decide, so two concurrent creations cannot both take one.
    """
    unknown = set(values) - set(UPSTREAM_EDITABLE)
    if unknown:
        raise UpstreamServerInvalid(*((name, "unknown field") for name in sorted(unknown)))
    upstream_server_validate({"url": url, **values})
    server = UpstreamServer(server_id=new_id("ups"), slug=slug, name=name or slug, url=url, **values)
    try:
        with transaction.atomic():
            server.save(force_insert=True)
    except IntegrityError:
        raise UpstreamServerConflict() from None
    audit_record(
        event="upstream_server.created",
        ok=True,
        detail={"server_id": server.server_id, "slug": slug, "actor": actor, **_public(server)},
    )
    return server


@transaction.atomic(durable=True)
def upstream_server_update(*, server_id: str, actor: str, **changes: Any) -> UpstreamServer:
    """Change a server's settings under its row lock; audited with before and after.

    Its tools keep their names (a changed prefix names the tools of the next sync only: nothing
    stored is renamed). Any change moves the version of its tools (``gateway_tool_version``), so
    calls decided on the old row are decided again, and its client is replaced on the next call.
    """
    unknown = set(changes) - set(UPSTREAM_EDITABLE)
    if unknown:
        raise UpstreamServerInvalid(*((name, "unknown field") for name in sorted(unknown)))
    upstream_server_validate(changes)
    server = _server_locked(server_id)
    before = _public(server)
    for name, value in changes.items():
        setattr(server, name, value)
    try:
        with transaction.atomic():
            server.save(update_fields=[*changes, "updated_at"])
    except IntegrityError:
        raise UpstreamServerConflict() from None
    audit_record(
        event="upstream_server.updated",
        ok=True,
        detail={"server_id": server_id, "before": before, "after": _public(server), "actor": actor},
    )
    return server


def _public(server: UpstreamServer) -> dict[str, Any]:
    """A server's settings as audit events and the API show them (never its credentials)."""
    return {
        "name": server.name,
        "url": server.url,
        "transport": server.transport,
        "connect_timeout": server.connect_timeout,
        "read_timeout": server.read_timeout,
        "enabled": server.enabled,
        "required": server.required,
        "default_category": server.default_category,
        "tool_prefix": server.tool_prefix,
        "tenant_ids": server.tenant_ids,
        "credentials_required": server.credentials_required,
    }


def upstream_default_ensure() -> UpstreamServer | None:
    """Create or update the server ``default`` from ``UPSTREAM_MCP_URL`` and its timeouts (none without it).

    Today's deployments name their one upstream in the environment; at start (``sync_tools``,
    ``devtools/run.py``, the WSGI application) that server becomes the record ``default`` with an
    empty tool prefix, so its tools keep their names. Only the URL and timeouts follow the
    environment; what the operator set in the console (tenants, category, credentials) stays.
    """
    url = settings.UPSTREAM_MCP_URL
    if not url:
        return None
    wanted = {
        "url": url,
        "connect_timeout": float(settings.UPSTREAM_CONNECT_TIMEOUT),
        "read_timeout": float(settings.UPSTREAM_READ_TIMEOUT),
    }
    server = UpstreamServer.objects.filter(slug=DEFAULT_SLUG).first()
    if server is None:
        try:
            return upstream_server_create(
                slug=DEFAULT_SLUG, name="Default upstream (UPSTREAM_MCP_URL)", actor="UPSTREAM_MCP_URL", **wanted
            )
        except UpstreamServerConflict:
            server = UpstreamServer.objects.filter(slug=DEFAULT_SLUG).first()  # another process created it first
            if server is None:  # another server has the empty prefix: the operator decides
                raise UpstreamServerConflict(
                    "UPSTREAM_MCP_URL cannot become the server default: another server has the empty tool prefix."
                ) from None
    changed = {name: value for name, value in wanted.items() if getattr(server, name) != value}
    if changed:
        server = upstream_server_update(server_id=server.server_id, actor="UPSTREAM_MCP_URL", **changed)
    return server


# --- Credentials ----------------------------------------------------------------------------


def upstream_credential_validate(*, kind: str, secret: dict[str, Any]) -> None:
    """Raise ``UpstreamServerInvalid`` when ``secret`` is not a credential of ``kind`` that can be sent."""
    _credential_headers(kind, secret)
    _client_credentials(kind, secret)


# The fields a credential of each kind stores (whatever else a form or a body carries is not stored).
CREDENTIAL_FIELDS: dict[str, tuple[str, ...]] = {
    CredentialKind.BEARER: ("token",),
    CredentialKind.HEADERS: ("headers",),
    CredentialKind.OAUTH_CLIENT_CREDENTIALS: ("token_url", "client_id", "client_secret", "scope", "resource"),
}


def _printable(value: Any, *, max_length: int = 2000) -> bool:
    return isinstance(value, str) and 0 < len(value) <= max_length and value.isascii() and value.isprintable()


def _client_credentials(kind: str, secret: dict[str, Any]) -> ClientCredentials | None:
    """The OAuth client credentials of an ``oauth_client_credentials`` secret (None for another kind).

    Raises ``UpstreamServerInvalid`` naming each field that cannot be used: an http(s) token URL,
    a client id and secret of printable ASCII, a scope of RFC 6749 scope tokens, an absolute
    ``resource`` URI without a fragment (RFC 8707).
    """
    if kind != CredentialKind.OAUTH_CLIENT_CREDENTIALS:
        return None
    problems: list[tuple[str, str]] = []
    token_url = secret.get("token_url")
    if not (_printable(token_url) and str(token_url).startswith(("http://", "https://")) and " " not in str(token_url)):
        problems.append(("token_url", "must be the token endpoint's http(s) URL"))
    if not _printable(secret.get("client_id"), max_length=500):
        problems.append(("client_id", "must be a non-empty client id of printable ASCII"))
    if not _printable(secret.get("client_secret"), max_length=500):
        problems.append(("client_secret", "must be a non-empty client secret of printable ASCII"))
    scope = secret.get("scope") or ""
    if scope and not (_printable(scope) and '"' not in scope and "\\" not in scope):
        problems.append(("scope", "must be space-separated scope tokens of printable ASCII"))
    resource = secret.get("resource") or ""
    if resource and not (_printable(resource) and ":" in resource and "#" not in resource and " " not in resource):
        problems.append(("resource", "must be an absolute URI without a fragment (RFC 8707)"))
    if problems:
        raise UpstreamServerInvalid(*problems)
    return ClientCredentials(
        token_url=str(token_url),
        client_id=str(secret["client_id"]),
        client_secret=str(secret["client_secret"]),
        scope=str(scope),
        resource=str(resource),
    )


def _credential_headers(kind: str, secret: dict[str, Any]) -> dict[str, str]:
    """The static headers a credential sends (none for OAuth client credentials: their token changes).

    Raises ``UpstreamServerInvalid`` for a malformed secret or an unknown kind.
    """
    if kind == CredentialKind.OAUTH_CLIENT_CREDENTIALS:
        _client_credentials(kind, secret)
        return {}
    if kind == CredentialKind.BEARER:
        token = secret.get("token")
        if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
            raise UpstreamServerInvalid(("token", "a bearer credential needs a non-empty token of printable ASCII"))
        return {"authorization": f"Bearer {token}"}
    if kind == CredentialKind.HEADERS:
        headers = secret.get("headers")
        if not isinstance(headers, dict) or not headers:
            raise UpstreamServerInvalid(
                ("headers", "a headers credential needs a non-empty map of header names to values")
            )
        out: dict[str, str] = {}
        for name, value in headers.items():
            if (
                not isinstance(name, str)
                or not name.isascii()
                or not name.replace("-", "").isalnum()
                or name.lower() in RESERVED_HEADERS
            ):
                raise UpstreamServerInvalid(("headers", f"header name {str(name)[:40]!r} is not allowed"))
            if not isinstance(value, str) or not value.isascii() or not value.isprintable():
                raise UpstreamServerInvalid(("headers", f"header {name} must be printable ASCII on one line"))
            out[name.lower()] = value
        return out
    raise UpstreamServerInvalid(("kind", f"unknown credential kind {str(kind)[:20]!r}"))


@transaction.atomic(durable=True)
def upstream_credential_set(
    *, server_id: str, tenant_id: str | None, kind: str, secret: dict[str, Any], actor: str
) -> UpstreamCredential:
    """Store (encrypted) the credentials sent to ``server_id`` for ``tenant_id`` (None: the server's own).

    Write-only: nothing returns the secret. The server's ``credentials_version`` moves under its
    row lock, so every process replaces its client and cached headers at its next call.
    Audited without the secret.
    """
    _credential_headers(kind, secret)  # refuse a malformed secret before anything is stored
    secret = {name: secret[name] for name in CREDENTIAL_FIELDS.get(kind, ()) if secret.get(name) is not None}
    server = _server_locked(server_id)
    blob = secret_encrypt({"kind": kind, **secret})
    credential = UpstreamCredential.objects.filter(server=server, tenant_id=tenant_id).first()
    if credential is None:
        credential = UpstreamCredential(credential_id=new_id("ucr"), server=server, tenant_id=tenant_id)
    credential.kind = kind
    credential.secret = blob
    credential.set_at = timezone.now()
    credential.save()
    _credentials_changed(server, "upstream_credential.set", tenant_id=tenant_id, kind=kind, actor=actor)
    return credential


@transaction.atomic(durable=True)
def upstream_credential_clear(*, server_id: str, tenant_id: str | None, actor: str) -> bool:
    """Remove the credentials of ``server_id`` for ``tenant_id`` (None: the server's own); audited."""
    server = _server_locked(server_id)
    deleted, _ = UpstreamCredential.objects.filter(server=server, tenant_id=tenant_id).delete()
    if deleted:
        _credentials_changed(server, "upstream_credential.cleared", tenant_id=tenant_id, actor=actor)
    return bool(deleted)


@dataclass(frozen=True)
class SecretsRotation:
    """What ``upstream_secrets_rotate`` did: how many credentials it re-encrypted, how many were current."""

    reencrypted: int
    current: int


@transaction.atomic(durable=True)
def upstream_secrets_rotate(*, actor: str) -> SecretsRotation:
    """Re-encrypt every stored credential under the current key (``UPSTREAM_SECRETS_KEY``), all or nothing.

    Each credential is locked and read under the current or a previous key
    (``UPSTREAM_SECRETS_PREVIOUS_KEYS``); one that no key decrypts stops the rotation with nothing
    changed (``SecretUnreadable``, naming the credential ids, never a secret). The values do not change, so
    no process's client or token is replaced. Audited with the counts.
    """
    credentials = list(UpstreamCredential.objects.select_for_update().order_by("credential_id"))
    unreadable = [c.credential_id for c in credentials if not _decrypts(bytes(c.secret))]
    if unreadable:
        raise SecretUnreadable(f"no configured key decrypts the credentials {', '.join(unreadable)}")
    stale = [c for c in credentials if not secret_is_current(bytes(c.secret))]
    for credential in stale:
        credential.secret = secret_reencrypt(bytes(credential.secret))
        credential.save(update_fields=["secret"])
    rotation = SecretsRotation(reencrypted=len(stale), current=len(credentials) - len(stale))
    audit_record(
        event="upstream_credential.secrets_rotated",
        ok=True,
        detail={"actor": actor, "reencrypted": rotation.reencrypted, "current": rotation.current},
    )
    return rotation


def _decrypts(blob: bytes) -> bool:
    try:
        secret_decrypt(blob)
    except SecretUnreadable:
        return False
    return True


def _server_locked(server_id: str) -> UpstreamServer:
    """The server's row under a lock that still lets its tools reference it, or ``UpstreamServerNotFound``."""
    server = UpstreamServer.objects.select_for_update(no_key=True).filter(server_id=server_id).first()
    if server is None:
        raise UpstreamServerNotFound()
    return server


def _credentials_changed(server: UpstreamServer, event: str, *, tenant_id: str | None, **detail: Any) -> None:
    """Move the server's ``credentials_version`` (caller holds its row lock), so that every process replaces
    its client and cached headers at its next call, and audit the change (never the secret)."""
    server.credentials_version += 1
    server.save(update_fields=["credentials_version", "updated_at"])
    audit_record(
        event=event,
        ok=True,
        tenant_id=tenant_id,
        detail={"server_id": server.server_id, "tenant_id": tenant_id, **detail},
    )


@dataclass(frozen=True)
class _Headers:
    """The headers a tenant's calls to a server carry, and whose they are (``scope``: the tenant or ``*``).

    ``oauth``: the OAuth client credentials whose access token every request carries as well
    (``upstream_token``); ``headers`` is then empty.
    """

    scope: str
    headers: dict[str, str]
    oauth: ClientCredentials | None = None


# (server id, credentials version, tenant id) -> the headers, or None when neither has credentials.
# A credential change moves the version, so an entry is never used for other credentials.
_headers: BoundedCache[tuple[str, int, str], _Headers | None] = BoundedCache("upstream.headers", max_entries=10_000)


def upstream_headers(*, server: UpstreamServer, tenant_id: str) -> _Headers | None:
    """The credential headers for ``tenant_id``'s calls to ``server``: the tenant's own, else the server's.

    None when neither holds credentials, or they do not decrypt under the current key (logged by
    the caller's refusal: the call is refused before its debit when the server requires them).
    """
    key = (server.server_id, server.credentials_version, tenant_id)
    if key in _headers:
        return _headers.get(key)
    rows = {
        row.tenant_id: row
        for row in UpstreamCredential.objects.filter(
            Q(tenant_id=tenant_id) | Q(tenant_id__isnull=True), server_id=server.server_id
        )
    }
    row = rows.get(tenant_id) or rows.get(None)
    found: _Headers | None = None
    if row is not None:
        try:
            secret = secret_decrypt(bytes(row.secret))
            found = _Headers(
                scope=row.tenant_id or "*",
                headers=_credential_headers(row.kind, secret),
                oauth=_client_credentials(row.kind, secret),
            )
        except (SecretUnreadable, UpstreamServerInvalid):
            found = None
    _headers.set(key, found)
    return found


# --- OAuth access tokens ----------------------------------------------------------------------

# (server id, credential scope, credentials version) -> the access token, per process. A credential
# change moves the version, so a token is never used for other client credentials.
_tokens = TokenCache("upstream.oauth_tokens")


def _token_key(server: UpstreamServer, credentials: _Headers) -> tuple[str, str, int]:
    return (server.server_id, credentials.scope, server.credentials_version)


def upstream_token(*, server: UpstreamServer, tenant_id: str, timeout: float | None = None) -> AccessToken | None:
    """The access token for ``tenant_id``'s calls to ``server`` (None unless its credentials are OAuth's).

    From the process's cache while it is more than ``UPSTREAM_OAUTH_EXPIRY_MARGIN`` seconds from its
    expiry, else fetched from the token endpoint (with the server's timeouts, or ``timeout`` when they are
    longer), once for all the callers
    that need it at that moment. Raises ``TokenUnavailable`` (no secret in it) when none could be had.
    Call it outside any transaction: it may wait for the token endpoint.
    """
    credentials = upstream_headers(server=server, tenant_id=tenant_id)
    if credentials is None or credentials.oauth is None:
        return None
    oauth = credentials.oauth
    connect, read = server.connect_timeout, server.read_timeout
    if timeout is not None:
        connect, read = min(connect, timeout), min(read, timeout)
    return _tokens.get(
        _token_key(server, credentials),
        lambda: token_fetch(oauth, connect_timeout=connect, read_timeout=read),
        margin=float(settings.UPSTREAM_OAUTH_EXPIRY_MARGIN),
    )


def upstream_token_refused(*, server: UpstreamServer, tenant_id: str, token: AccessToken) -> None:
    """The upstream refused ``token`` (401 or 403): forget it, so that the next call fetches a fresh one.

    Only that token: one another caller fetched since stays.
    """
    credentials = upstream_headers(server=server, tenant_id=tenant_id)
    if credentials is not None and credentials.oauth is not None:
        _tokens.drop(_token_key(server, credentials), token)


def upstream_credentials_ready(*, server: UpstreamServer, tenant_id: str) -> None:
    """Before a call is accepted: make sure the access token its dispatch needs is at hand (fetch it now).

    Off any transaction, before anything is written or debited: a token endpoint that fails refuses
    the call with ``UpstreamCredentialsUnavailable`` (503, unreachable or 5xx) or
    ``UpstreamCredentialsRejected`` (502, refused or malformed), and the idempotency key stays free.
    A server the tenant may not call is left to the claim's refusal (``upstream_check_open``).
    """
    if not server.enabled or not server.open_to(tenant_id):
        return
    try:
        upstream_token(server=server, tenant_id=tenant_id)
    except TokenUnavailable as exc:
        lasting = exc.failure in ("refused", "malformed")
        refusal = UpstreamCredentialsRejected if lasting else UpstreamCredentialsUnavailable
        extra: dict[str, Any] = {"server": server.slug, "failure": exc.failure}
        if exc.oauth_error:
            extra["oauth_error"] = exc.oauth_error
        headers = {"Retry-After": "5"} if refusal is UpstreamCredentialsUnavailable else None
        raise refusal(f"{refusal.message} ({exc.reason})", headers=headers, **extra) from None


# --- One client per server ------------------------------------------------------------------

AnyClient = UpstreamClient | LegacySseClient


def upstream_client_new(url: str, *, transport: str, **options: Any) -> AnyClient:
    """A client for a server at ``url`` speaking ``transport`` (Streamable HTTP, or the legacy HTTP+SSE).

    ``options`` are the clients' common keyword arguments (timeouts, ``headers``).
    """
    if transport == UpstreamTransport.HTTP_SSE:
        return LegacySseClient(url, **options)
    return UpstreamClient(url, **options)


_clients_lock = threading.Lock()
# (server id, credential scope) -> (what the client was built for, the client). Bounded by the rows:
# servers times the tenants holding credentials of their own. A client built for another URL,
# other timeouts or other credentials is replaced and closed.
_clients: dict[tuple[str, str], tuple[tuple[Any, ...], AnyClient]] = {}


def upstream_client_for(
    *,
    server_id: str,
    url: str,
    connect_timeout: float,
    read_timeout: float,
    credentials: _Headers | None,
    credentials_version: int = 0,
    transport: str = UpstreamTransport.STREAMABLE_HTTP,
) -> AnyClient:
    """The process's client for one server as a call was claimed on it (thread-safe).

    Each server (and each tenant holding credentials of its own for it) has its own client, hence
    its own connection pool and limits: a server that hangs ties up only its own connections.
    """
    scope = credentials.scope if credentials is not None else "*"
    built_for = (
        url,
        transport,
        connect_timeout,
        read_timeout,
        credentials_version,
        tuple(sorted((credentials or _NONE).headers.items())),
    )
    with _clients_lock:
        entry = _clients.get((server_id, scope))
        if entry is not None and entry[0] == built_for:
            return entry[1]
        client = upstream_client_new(
            url,
            transport=transport,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            total_timeout=read_timeout * 2,
            headers=credentials.headers if credentials is not None else None,
        )
        _clients[(server_id, scope)] = (built_for, client)
    if entry is not None:
        entry[1].close()
    return client


_NONE = _Headers(scope="*", headers={})


def upstream_clients_close() -> None:
    """Close and forget every server's client (tests; a worker's shutdown)."""
    with _clients_lock:
        entries = list(_clients.values())
        _clients.clear()
    for _, client in entries:
        client.close()


def server_client(server: UpstreamServer, *, tenant_id: str | None = None) -> AnyClient:
    """A new client for ``server`` with its server-wide credentials (or ``tenant_id``'s); the caller closes it.

    Raises ``TokenUnavailable`` (an ``UpstreamError``) when they are OAuth's and no token could be had.
    """
    creds = upstream_headers(server=server, tenant_id=tenant_id or "")
    token = upstream_token(server=server, tenant_id=tenant_id or "")
    client = upstream_client_new(
        server.url,
        transport=server.transport,
        connect_timeout=server.connect_timeout,
        read_timeout=server.read_timeout,
        total_timeout=server.read_timeout * 2,
        headers=creds.headers if creds is not None else None,
    )
    if token is not None:
        client.authorize(token.authorization)
    return client


# --- Health and connection tests --------------------------------------------------------------


def upstream_error_class(exc: UpstreamError) -> str:
    """A fixed word for why a server could not be used, without the upstream's free text."""
    if isinstance(exc, TokenUnavailable):
        return "credentials_unavailable"
    status = exc.status_code
    if status in (401, 403):
        return "auth_refused"
    if status is not None and status >= 500:
        return "server_error"
    if status is not None:
        return "http_error"
    reason = exc.reason.lower()
    if "timed out" in reason or "timeout" in reason:
        return "timeout"
    if "refused" in reason or "connect" in reason or "resolve" in reason or "unreachable" in reason:
        return "unreachable"
    return "protocol_error"


def upstream_probe(server: UpstreamServer, *, timeout: float | None = None) -> dict[str, Any]:
    """Negotiate with ``server`` and ping it with its server-wide credentials: reachable, protocol version, error class.

    Nothing the upstream wrote is returned (its URL and messages can name internal hosts).
    """
    wait = timeout if timeout is not None else min(server.read_timeout, float(settings.HEALTH_UPSTREAM_TIMEOUT))
    creds = upstream_headers(server=server, tenant_id="")
    client = upstream_client_new(
        server.url,
        transport=server.transport,
        connect_timeout=min(server.connect_timeout, wait),
        read_timeout=wait,
        total_timeout=wait * 2,
        headers=creds.headers if creds is not None else None,
    )
    token = None
    try:
        token = upstream_token(server=server, tenant_id="", timeout=wait)
        if token is not None:
            client.authorize(token.authorization)
        session = client.initialize()
        client.ping()
        return {"reachable": True, "protocol_version": session.protocol_version, "error": None}
    except UpstreamError as exc:
        if token is not None and exc.status_code in (401, 403):
            upstream_token_refused(server=server, tenant_id="", token=token)
        return {"reachable": False, "protocol_version": None, "error": upstream_error_class(exc)}
    finally:
        client.close()


def upstream_server_check(*, server: UpstreamServer, checked_by: UpstreamProbeSource) -> dict[str, Any]:
    """Probe ``server`` now (``upstream_probe``) and keep the result as its last state; returns the probe."""
    probe = upstream_probe(server)
    upstream_server_state_record(server_id=server.server_id, probe=probe, checked_by=checked_by)
    return probe


_STATE_UPSERT = """
    INSERT INTO mcpgateway_upstream_server_state AS s
           (server_id, checked_at, checked_by, reachable, protocol_version, error_class)
    VALUES (%s, %s, %s, %s, %s, %s)
    ON CONFLICT (server_id) DO UPDATE
       SET checked_at = EXCLUDED.checked_at, checked_by = EXCLUDED.checked_by, reachable = EXCLUDED.reachable,
           protocol_version = EXCLUDED.protocol_version, error_class = EXCLUDED.error_class
     WHERE s.checked_at <= EXCLUDED.checked_at
"""


@transaction.atomic(durable=True)
def upstream_server_state_record(
    *, server_id: str, probe: dict[str, Any], checked_by: UpstreamProbeSource, checked_at: datetime | None = None
) -> None:
    """Keep ``probe`` (``upstream_probe``'s reachable, protocol version, error class) as ``server_id``'s last state.

    One statement on ``UpstreamServerState``, never on the server's row (whose version its tools' calls
    are decided by), and not audited: a probe observes, it changes nothing an operator set. A probe
    older than the stored state (``checked_at``, default now) does not replace it, so probes that
    finish out of order leave the newest. Only the error class is stored (a fixed word, checked by the
    table), never the upstream's text.
    """
    reachable = bool(probe["reachable"])
    with connection.cursor() as cursor:
        cursor.execute(
            _STATE_UPSERT,
            [
                server_id,
                checked_at or timezone.now(),
                checked_by,
                reachable,
                (probe.get("protocol_version") or "")[:32] if reachable else "",
                "" if reachable else probe["error"],
            ],
        )


# --- Sync -------------------------------------------------------------------------------------


def upstream_server_sync(*, server: UpstreamServer, actor: str) -> SyncReport:
    """Fetch ``server``'s tools/list with its server-wide credentials, then register them (``tools_sync``).

    The fetch happens outside any transaction; raises ``UpstreamError`` when it fails (nothing
    is changed then but the server's last state, ``upstream_server_state_record``, as a sync's
    success records it too). Returns the ``SyncReport``.
    """
    try:
        with server_client(server) as client:
            remote = client.list_tools()
            protocol_version = client.initialize().protocol_version  # negotiated already: no request
    except UpstreamError as exc:
        failed = {"reachable": False, "protocol_version": None, "error": upstream_error_class(exc)}
        upstream_server_state_record(server_id=server.server_id, probe=failed, checked_by=UpstreamProbeSource.SYNC)
        raise
    upstream_server_state_record(
        server_id=server.server_id,
        probe={"reachable": True, "protocol_version": protocol_version, "error": None},
        checked_by=UpstreamProbeSource.SYNC,
    )
    return tools_sync(remote_tools=remote, server=server, actor=actor)
