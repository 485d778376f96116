"""Phase 2 of the governed call: one upstream ``tools/call`` outside any transaction, never resent.

Each upstream server has its own client per process (``upstreams.upstream_client_for``), shared by
its threads; a tool registered without a server goes through the ``UPSTREAM_MCP_URL`` client.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings
from django.utils import timezone

from common import metrics, tracing
from mcpgateway.models import Action, Tool, UpstreamServer
from mcpgateway.services.call import CallRequest
from mcpgateway.services.upstreams import (
    AnyClient,
    upstream_client_for,
    upstream_headers,
    upstream_token,
    upstream_token_refused,
)
from mcpgateway.upstream.client import CallResult, UpstreamClient
from mcpgateway.upstream.oauth import AccessToken, TokenUnavailable

# --- Upstream client (one per process) -------------------------------------------------

_client_lock = threading.Lock()
_client: UpstreamClient | None = None
_client_url: str | None = None


def upstream_client() -> UpstreamClient:
    """The process-wide upstream client for ``settings.UPSTREAM_MCP_URL`` (thread-safe)."""
    global _client, _client_url
    url = settings.UPSTREAM_MCP_URL
    if not url:
        raise RuntimeError("UPSTREAM_MCP_URL is not configured")
    with _client_lock:
        if _client is None or _client_url != url:
            if _client is not None:
                _client.close()
            _client = UpstreamClient(
                url,
                connect_timeout=settings.UPSTREAM_CONNECT_TIMEOUT,
                read_timeout=settings.UPSTREAM_READ_TIMEOUT,
                total_timeout=settings.UPSTREAM_READ_TIMEOUT * 2,
            )
            _client_url = url
        return _client


def send_deadline(action: Action) -> float | None:
    """The ``time.monotonic()`` instant after which ``action``'s call must not be sent.

    The sweeper gives a claim up after ``sweep_threshold()`` (connect + twice the read timeout +
    the margin), which covers one call sent at once: its response completes within twice the read
    timeout of being sent. Negotiating the upstream's session first (several requests, or waiting
    for another thread's) can take longer; a call sent after connect + half the margin could still
    be running when the sweep declares it lost, and its outcome would then not count (a refund owed
    skipped, or an operator's "not executed" for a call that ran). Past that it is ``not_sent``.
    """
    if action.claimed_at is None:
        return None
    connect = action.upstream_connect_timeout or settings.UPSTREAM_CONNECT_TIMEOUT  # the server's, as claimed
    budget = connect + settings.SWEEP_MARGIN_SECONDS / 2
    elapsed = (timezone.now() - action.claimed_at).total_seconds()
    return time.monotonic() + budget - elapsed


def _server_client(action: Action, server: UpstreamServer | None) -> tuple[AnyClient, AccessToken | None]:
    """The client of the server the call was claimed on, to the URL and with the timeouts claimed.

    The credentials are the tenant's own for that server, else the server's (``upstream_headers``);
    they go to that server only, and the agent's API key never leaves the gateway. The one place
    they are put on the call: static headers with the client, an OAuth access token (fetched before
    the claim, ``upstream_credentials_ready``; from the cache here) on the client as it is sent.
    Raises ``TokenUnavailable`` when that token is gone from the cache and cannot be fetched again.
    """
    if action.upstream_server_id is None or server is None:
        return upstream_client(), None
    assert action.upstream_url is not None
    client = upstream_client_for(
        server_id=action.upstream_server_id,
        url=action.upstream_url,
        connect_timeout=action.upstream_connect_timeout or settings.UPSTREAM_CONNECT_TIMEOUT,
        read_timeout=action.upstream_read_timeout or settings.UPSTREAM_READ_TIMEOUT,
        credentials=upstream_headers(server=server, tenant_id=action.tenant_id),
        credentials_version=server.credentials_version,
        transport=server.transport,
    )
    token = upstream_token(server=server, tenant_id=action.tenant_id)
    if token is not None:
        client.authorize(token.authorization)
    return client, token


def _dispatch(action: Action, tool: Tool, req: CallRequest, server: UpstreamServer | None = None) -> CallResult:
    """Phase 2: one upstream tools/call outside any transaction. Never raises, never resends.

    Sent to the server the call was claimed on (``server``, the tool's), under the tool's name
    there. What keeps the call from being sent (no upstream configured, an outputSchema the client
    cannot compile) is ``not_sent``: the tool did not run, phase 3 refunds.
    """
    try:
        client, token = _server_client(action, server)
    except RuntimeError as exc:
        return CallResult(kind="not_sent", reason=str(exc), request_id=action.action_id)
    except TokenUnavailable as exc:
        return CallResult(kind="not_sent", reason=f"no access token: {exc.reason}", request_id=action.action_id)
    slug = server.slug if server is not None else ""
    # The one tracing hook of the dispatch: a CLIENT span, and the trace context sent upstream.
    with tracing.upstream_span(
        tool=tool.upstream_name, url=action.upstream_url, server=slug, request_id=action.action_id
    ) as traced:
        try:
            result = client.call_tool(
                tool.upstream_name,
                req.arguments,
                idempotency_key=f"{action.wallet_id}:{action.idempotency_key}",
                request_id=action.action_id,
                extra_meta={**traced.meta, "io.tollgate/action-id": action.action_id},
                output_schema=tool.output_schema or None,
                input_schema=tool.input_schema or None,  # arguments marked x-mcp-header travel as headers too
                send_by=send_deadline(action),
                headers=traced.headers,
            )
        except ValueError as exc:
            # Raised before anything is sent: an outputSchema the client cannot compile. Such a tool is not
            # callable (``tool_is_callable``), so this is a backstop: a claimed call ends in phase 3, refunded.
            problem = str(exc).removeprefix("invalid output_schema: ")
            reason = (
                f"Not sent: the tool's outputSchema, as the upstream lists it, is not a valid JSON Schema ({problem})."
            )
            result = CallResult(kind="not_sent", reason=reason, request_id=action.action_id)
            traced.answered(result.kind, None)
            return result
        traced.answered(result.kind, result.status_code)
    if token is not None and server is not None and result.status_code in (401, 403):
        # The upstream refused the token (expired early, revoked): the next call fetches a fresh one.
        upstream_token_refused(server=server, tenant_id=action.tenant_id, token=token)
    metrics.observe_upstream(result.elapsed, kind=result.kind, server=slug, tool=tool.service_id)
    return result
