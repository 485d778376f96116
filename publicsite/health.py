"""Dependency truth for ``/health/dependencies`` and the dashboard (spec, point 12).

Each check measures one dependency and never raises: the database (``SELECT 1``),
the evidence signing key (an active key exists and its private part loads here;
no key material leaves this module), the cache backend (a set/get round trip)
and, for upstream tools, the configured upstream MCP server (with short timeouts:
the protocol era negotiated as the gateway's dispatch negotiates it, then a
``ping``, which in the stateless 2026-07-28 era, where ``ping`` does not exist, is
a ``server/discover``). The report is ``healthy`` only when every check that applies is
``ok``; a down upstream makes it ``degraded`` and the endpoint answers 503.

Nothing here activates a signing key or changes what an operator set: health observes, it does not
repair. The one write is readiness keeping each upstream server's last probe for the console
(``UpstreamServerState``, not audited); readiness probes and keeps each server at most once per
``UPSTREAM_STATE_READINESS_INTERVAL`` (docs/decisions.md, "Upstream servers").
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from publicsite.discovery import LOCAL_TOOLS
from tlog.selectors import witness_states

logger = logging.getLogger("tollgate.health")

OK: Final = "ok"
DOWN: Final = "down"
SKIPPED: Final = "skipped"
NOT_CONFIGURED: Final = "not_configured"
HEALTHY: Final = "healthy"
DEGRADED: Final = "degraded"

NOTICE: Final = (
    "Dependency truth for the selected tool. An HTTP 200 alone does not mean every dependency is ready, and "
    "health never replaces authentication, permit authorization or receipt verification."
)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)


def _check(name: str, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``probe`` (returns extra fields, raises on failure) and time it."""
    started = time.perf_counter()
    try:
        extra = probe()
    except _Down as exc:
        return {"status": DOWN, "latency_ms": _ms(started), "error": str(exc), **exc.extra}
    except Exception as exc:  # a failing dependency is a finding, not a crash
        return {"status": DOWN, "latency_ms": _ms(started), "error": f"{name} check failed: {type(exc).__name__}"}
    return {"status": OK, "latency_ms": _ms(started), "error": None, **extra}


class _Down(Exception):
    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.extra = extra


def check_database() -> dict[str, Any]:
    """``SELECT 1`` on the default database."""

    def probe() -> dict[str, Any]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            row = cursor.fetchone()
        if row is None or row[0] != 1:
            raise _Down("SELECT 1 returned an unexpected row")
        return {}

    return _check("database", probe)


def check_signing_key() -> dict[str, Any]:
    """An active evidence signing key exists and its private key is loadable in this process."""
    from audit import keystore
    from audit.models import SigningKey, SigningKeyState

    def probe() -> dict[str, Any]:
        key_id = SigningKey.objects.filter(state=SigningKeyState.ACTIVE).values_list("key_id", flat=True).first()
        if key_id is None:
            raise _Down("no active signing key (run manage.py ensure_signing_key)")
        try:
            loaded = keystore.private_key_for(key_id) is not None
        except Exception as exc:
            raise _Down("the signing key store is unreadable", key_id=key_id) from exc
        if not loaded:
            raise _Down("the active key's private key is not available on this server", key_id=key_id)
        return {"key_id": key_id}

    return _check("signing_key", probe)


def check_cache() -> dict[str, Any]:
    """A set/get/delete round trip on the default cache (the rate-limit store)."""

    def probe() -> dict[str, Any]:
        key = f"tollgate:health:{secrets.token_hex(8)}"
        token = secrets.token_hex(8)
        cache.set(key, token, timeout=10)
        value = cache.get(key)
        cache.delete(key)
        if value != token:
            raise _Down("the cache did not return the value just written")
        return {"backend": str(settings.CACHES["default"]["BACKEND"]).rsplit(".", 1)[-1]}

    return _check("cache", probe)


def check_upstream(url: str, *, timeout: float) -> dict[str, Any]:
    """Negotiate with the upstream MCP server and ``ping`` it, with short timeouts; the URL is never reported.

    A fresh client runs the whole negotiation (the ``server/discover`` probe, and the
    handshake when the upstream is not of the stateless era), so a failure of either
    reports the upstream down, as it would fail a dispatch; ``ping`` is a
    ``server/discover`` in the stateless era.
    """
    from mcpgateway.upstream.client import UpstreamClient, UpstreamError

    if not url:
        return {"status": NOT_CONFIGURED, "latency_ms": None, "error": "UPSTREAM_MCP_URL is not set"}

    def probe() -> dict[str, Any]:
        client = UpstreamClient(
            url,
            connect_timeout=min(timeout, settings.UPSTREAM_CONNECT_TIMEOUT),
            read_timeout=timeout,
            total_timeout=timeout * 2,
            max_connections=1,
        )
        try:
            client.ping()
        except UpstreamError as exc:
            logger.warning("upstream health check failed: %s", exc.reason.replace(url, "<upstream>")[:300])
            raise _Down(_public_reason(exc)) from exc
        finally:
            client.close()
        return {}

    return _check("upstream", probe)


def _public_reason(exc: Any) -> str:
    """What an anonymous caller learns of an upstream failure: the request that failed and how (the
    exception's class, an HTTP status, a JSON-RPC error code), never free text. Exception messages and
    an upstream's error message can name internal hosts or carry whatever the upstream wrote; the full
    reason goes to the log."""
    method = exc.reason.split(": ", 1)[0][:60]
    if exc.error is not None:
        code = exc.error.get("code")
        return f"{method}: JSON-RPC error {code if isinstance(code, int) else 'without a valid code'}"
    if exc.__cause__ is not None:
        return f"{method}: {type(exc.__cause__).__name__}"
    if exc.status_code is not None and not 200 <= exc.status_code < 300:
        return f"{method}: HTTP {exc.status_code}"
    return f"{method}: the upstream's answer was not usable"


def tool_scope(tool: str | None) -> str | None:
    if not tool:
        return None
    return "local" if tool in LOCAL_TOOLS else "upstream"


def dependency_report(*, tool: str | None = None) -> dict[str, Any]:
    """Check every dependency of ``tool`` (the configured upstream's when no tool is named).

    A local tool has no upstream: that check is ``skipped`` with the reason.
    The tool name is taken as given; whether it is registered is the tool catalog's business.
    """
    scope = tool_scope(tool)
    checks: dict[str, dict[str, Any]] = {
        "database": check_database(),
        "signing_key": check_signing_key(),
        "cache": check_cache(),
    }
    if scope == "local":
        checks["upstream"] = {
            "status": SKIPPED,
            "latency_ms": None,
            "error": None,
            "reason": f"{tool} is a local tool: it runs in-process, has no upstream and is not covered by "
            "dispatch-uncertainty semantics"
            + ("" if settings.ENABLE_DOGFOOD_TOOL else "; it is disabled here (ENABLE_DOGFOOD_TOOL is false)"),
        }
    else:
        checks["upstream"] = check_upstream(settings.UPSTREAM_MCP_URL, timeout=settings.HEALTH_UPSTREAM_TIMEOUT)
    healthy = all(check["status"] in (OK, SKIPPED) for check in checks.values())
    return {
        "status": HEALTHY if healthy else DEGRADED,
        "version": settings.SERVICE_VERSION,
        "checked_at": timezone.now(),
        "tool": tool or None,
        "tool_scope": scope,
        "dependencies": checks,
        "notice": NOTICE,
    }


# --- Readiness: the database, the signing key and each enabled upstream server ----------------------


def upstream_server_states() -> list[dict[str, Any]]:
    """Each enabled upstream server: reachable, the protocol version negotiated, the last successful sync and an
    error class (a fixed word, never the upstream's text or its URL). Probed in parallel, with short timeouts.

    Anyone may call readiness, so it probes a server (with the server's own credentials) and keeps its state
    at most once per ``UPSTREAM_STATE_READINESS_INTERVAL``: a server whose kept state is younger (from
    readiness, the console, the API or a sync) is answered from it, with no probe and no write. A flood of
    calls is then neither a flood of authenticated requests to the upstreams nor of writes (docs/decisions.md,
    "Upstream servers"); calls that find the state stale at the same moment each probe (the newest is kept).
    """
    from concurrent.futures import ThreadPoolExecutor

    from mcpgateway.models import UpstreamProbeSource, UpstreamServer, UpstreamServerState
    from mcpgateway.services.upstreams import upstream_headers, upstream_probe, upstream_server_state_record

    servers = list(UpstreamServer.objects.filter(enabled=True).order_by("slug"))
    if not servers:
        return []
    since = timezone.now() - timedelta(seconds=settings.UPSTREAM_STATE_READINESS_INTERVAL)
    probes: dict[str, dict[str, Any]] = {
        state.server_id: {
            "reachable": state.reachable,
            "protocol_version": state.protocol_version or None,
            "error": state.error_class or None,
        }
        for state in UpstreamServerState.objects.filter(
            server_id__in=[server.server_id for server in servers], checked_at__gt=since
        )
    }
    stale = [server for server in servers if server.server_id not in probes]
    if stale:
        for server in stale:  # credentials are read (and cached) here, not in the probes' threads
            upstream_headers(server=server, tenant_id="")
        with ThreadPoolExecutor(max_workers=min(8, len(stale))) as pool:
            fresh = list(pool.map(lambda s: upstream_probe(s, timeout=settings.HEALTH_UPSTREAM_TIMEOUT), stale))
        probes.update((server.server_id, probe) for server, probe in zip(stale, fresh, strict=True))
        checked_at = timezone.now()
        try:  # here, not in the probes' threads (each would open a database connection of its own)
            for server, probe in zip(stale, fresh, strict=True):
                upstream_server_state_record(
                    server_id=server.server_id,
                    probe=probe,
                    checked_by=UpstreamProbeSource.READINESS,
                    checked_at=checked_at,
                )
        except Exception:  # keeping the state is a convenience of the console: readiness answers all the same
            logger.warning("could not keep the upstream servers' last state", exc_info=True)
    return [
        {
            "slug": server.slug,
            "required": server.required,
            "last_synced_at": server.last_synced_at,
            **probes[server.server_id],
        }
        for server in servers
    ]


def readiness_report() -> dict[str, Any]:
    """Ready when the database and the signing key are, and every enabled server marked required is reachable.

    Servers not marked required are reported and do not hold readiness back: their tools fail on
    their own (docs/decisions.md, "Upstream servers").
    """
    checks = {"database": check_database(), "signing_key": check_signing_key()}
    servers = upstream_server_states()
    ready = all(check["status"] == OK for check in checks.values()) and all(
        s["reachable"] for s in servers if s["required"]
    )
    return {
        "status": "ready" if ready else "not_ready",
        "version": settings.SERVICE_VERSION,
        "checked_at": timezone.now(),
        "dependencies": checks,
        "upstream_servers": servers,
        # Shown, never holding readiness back: the log's checkpoints are signed without them.
        "tlog_witnesses": witness_states(),
    }
