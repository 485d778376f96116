"""``TollgateClient``: a synchronous, typed client for the Tollgate HTTP API and governed MCP calls."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from types import TracebackType
from typing import Any, TypeVar

import httpx

from tollgate_client.errors import (
    AuthenticationError,
    Conflict,
    DecisionTimeout,
    NotFound,
    PermissionDenied,
    PermitRequestNotApproved,
    ProtocolError,
    ServerError,
    TollgateError,
    TransportError,
    ValidationError,
    error_for_status,
)
from tollgate_client.models import (
    ApiKey,
    Authority,
    EmergencyRevocation,
    Evidence,
    JSONObject,
    KeyRotation,
    Page,
    Permit,
    PermitRequest,
    PermitVerification,
    Policy,
    PolicyChangeProposal,
    PortableVerification,
    Quote,
    Receipt,
    ReceiptVerification,
    Tool,
    ToolCallResult,
    ToolManifest,
    Wallet,
)
from tollgate_client.verify import verify_portable_offline

__all__ = ["MCP_PROTOCOL_VERSION", "Amount", "TollgateClient"]

MCP_PROTOCOL_VERSION = "2026-07-28"
"""The stateless MCP revision ``call_tool`` speaks on ``POST /mcp`` (no session, per-request ``_meta``)."""

USER_AGENT = "tollgate-client/1.3.0"
Amount = Decimal | int | str
"""Credits: a Decimal, an int or a decimal string (never a float: amounts have 8 exact places)."""

# JSON-RPC error codes of the gateway's tools/call (docs/architecture.md, "The outcome table" and "HTTP contract").
_RPC_INVALID_PARAMS = -32602
_RPC_IN_PROGRESS = -32009
_RPC_FORBIDDEN = -32001
_RPC_METHOD_NOT_FOUND = -32601
_RPC_INTERNAL = -32603
_RPC_PROTOCOL = (-32700, -32600, -32020, -32021, -32022)

# Failures where the request certainly did not leave this process: safe to retry with anything.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

T = TypeVar("T")
_Objs = list[JSONObject]


def _amount(value: Amount) -> str:
    if isinstance(value, float | bool):
        raise TypeError("amounts are Decimal, int or str (floats are not exact)")
    return str(value)


def _value(value: Any) -> Any:
    """A request value as JSON: Decimal -> string, datetime -> ISO 8601."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _params(**values: Any) -> dict[str, str]:
    """Query parameters without the ``None`` ones; booleans as ``true``/``false``."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        else:
            out[name] = str(_value(value))
    return out


def _body(**values: Any) -> dict[str, Any]:
    """A JSON body without the ``None`` ones."""
    return {name: _value(value) for name, value in values.items() if value is not None}


def _new_key() -> str:
    return str(uuid.uuid4())


class TollgateClient:
    """A client for one gateway and one API key (``X-API-Key``).

    Resource groups: :attr:`wallets`, :attr:`keys`, :attr:`permits`,
    :attr:`permit_requests`, :attr:`quotes`, :attr:`policies`, :attr:`tools`,
    :attr:`receipts`, :attr:`me`, :attr:`signing_keys`; governed tool calls
    with :meth:`call_tool`.

    Retries are limited to what cannot act twice: a request that could not
    connect (nothing was sent) is retried up to ``max_retries`` times, and a
    call whose idempotency key is still running upstream (409
    ``idempotency_key_in_progress``) is re-asked with the *same* key after
    ``Retry-After`` (capped at ``max_retry_wait`` seconds).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int = 2,
        max_retry_wait: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout
        self._transport = transport
        self._extra_headers = dict(headers or {})
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        default_headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **self._extra_headers}
        if api_key is not None:
            default_headers["X-API-Key"] = api_key
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=default_headers)
        self._rpc_ids = itertools.count(1)
        self.wallets = Wallets(self)
        self.keys = Keys(self)
        self.permits = Permits(self)
        self.permit_requests = PermitRequests(self)
        self.quotes = Quotes(self)
        self.policies = Policies(self)
        self.tools = Tools(self)
        self.receipts = Receipts(self)
        self.me = Me(self)
        self.signing_keys = SigningKeys(self)

    def __repr__(self) -> str:
        return f"TollgateClient({self.base_url!r})"

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TollgateClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def with_api_key(self, api_key: str | None) -> TollgateClient:
        """A new client for the same gateway and settings with another key (close it too).

        A transport given to this client is shared, and closing the new client leaves it open.
        """
        return TollgateClient(
            self.base_url,
            api_key,
            timeout=self._timeout,
            transport=None if self._transport is None else _SharedTransport(self._transport),
            headers=self._extra_headers,
            max_retries=self.max_retries,
            max_retry_wait=self.max_retry_wait,
        )

    # -- low level ------------------------------------------------------------------------

    def _pause(self, seconds: float) -> None:
        time.sleep(max(0.0, min(seconds, self.max_retry_wait)))

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """One HTTP exchange, re-sent only when nothing was sent (connection refused or timed out)."""
        failures = 0
        while True:
            request = self._http.build_request(
                method,
                path,
                params=params,
                content=None if json_body is None else json.dumps(json_body, separators=(",", ":")).encode(),
                headers={**({"Content-Type": "application/json"} if json_body is not None else {}), **(headers or {})},
            )
            try:
                return self._http.send(request)
            except _NOT_SENT as exc:
                if failures < self.max_retries:
                    failures += 1
                    self._pause(0.2 * 2**failures)
                    continue
                raise TransportError(
                    f"{method} {path}: could not connect: {exc}", sent=False, idempotency_key=idempotency_key
                ) from exc
            except httpx.UnsupportedProtocol as exc:
                raise TransportError(f"{method} {path}: {exc}", sent=False, idempotency_key=idempotency_key) from exc
            except httpx.TransportError as exc:
                raise TransportError(
                    f"{method} {path}: no complete answer ({type(exc).__name__}: {exc}); the outcome is unknown"
                    + (f", retry with idempotency key {idempotency_key!r}" if idempotency_key else ""),
                    sent=True,
                    idempotency_key=idempotency_key,
                ) from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Call any endpoint; returns the decoded JSON (``None`` for an empty answer) or raises ``TollgateError``.

        With ``idempotency_key`` the ``Idempotency-Key`` header is sent and a 409
        ``idempotency_key_in_progress`` is re-asked with the same key.
        """
        all_headers = dict(headers or {})
        if idempotency_key is not None:
            all_headers["Idempotency-Key"] = idempotency_key
        query = _params(**params) if params else None
        waits = 0
        while True:
            response = self._send(
                method, path, params=query, json_body=json_body, headers=all_headers, idempotency_key=idempotency_key
            )
            try:
                return _decode(response)
            except Conflict as err:
                if idempotency_key is None or err.code != "idempotency_key_in_progress" or waits >= self.max_retries:
                    raise
                waits += 1
                self._pause(err.retry_after if err.retry_after is not None else 1.0)

    def _get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def _post(self, path: str, body: Any = None, *, idempotency_key: str | None = None, **params: Any) -> Any:
        return self.request("POST", path, params=params, json_body=body, idempotency_key=idempotency_key)

    # -- governed tool calls --------------------------------------------------------------

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        permit_id: str,
        idempotency_key: str | None = None,
        quote_id: str | None = None,
    ) -> ToolCallResult:
        """Call ``name`` through the governed path: ``tools/call`` on ``POST /mcp``, stateless 2026-07-28 mode.

        The idempotency key (a new uuid4 unless given) binds this one logical
        call: the client's own retries reuse it, so the tool runs and is charged
        at most once. Keep ``result.idempotency_key`` to ask again later: the
        same key and arguments return the stored answer (``replayed=True``).

        Every outcome the gateway accepted returns a :class:`ToolCallResult`
        (with a receipt), refusals and failures included. Raises only when there
        is no receipt: ``ValidationError`` (unknown tool, arguments that break
        the inputSchema, ``idempotency_key_reused``), ``Conflict`` (still in
        progress after the retries), ``AuthenticationError``,
        ``PermissionDenied`` (e.g. ``wallet_key_required``), ``TransportError``
        (``sent=True``: unknown outcome; call again with the same key).
        """
        key = idempotency_key if idempotency_key is not None else _new_key()
        meta: dict[str, Any] = {
            "permit_id": permit_id,
            "idempotency_key": key,
            "io.modelcontextprotocol/protocolVersion": MCP_PROTOCOL_VERSION,
        }
        if quote_id:
            meta["quote_id"] = quote_id
        message = {
            "jsonrpc": "2.0",
            "id": next(self._rpc_ids),
            "method": "tools/call",
            "params": {"name": name, "arguments": dict(arguments or {}), "_meta": meta},
        }
        headers = {
            "MCP-Protocol-Version": MCP_PROTOCOL_VERSION,
            "Mcp-Method": "tools/call",
            "Accept": "application/json, text/event-stream",
        }
        if name.isascii() and name.isprintable():
            headers["Mcp-Name"] = name
        waits = 0
        while True:
            response = self._send("POST", "/mcp", json_body=message, headers=headers, idempotency_key=key)
            answer = _rpc_answer(response, message["id"])
            if isinstance(answer.get("result"), dict):
                return _result_from_rpc(answer["result"], key, response)
            error = answer.get("error")
            if not isinstance(error, dict):
                raise ProtocolError(response.status_code, "invalid_jsonrpc", "Neither result nor error.", answer)
            data = error.get("data") if isinstance(error.get("data"), dict) else {}
            assert isinstance(data, dict)
            if isinstance(data.get("receipt_id"), str) and isinstance(data.get("outcome"), str):
                return ToolCallResult(
                    outcome=data["outcome"],
                    receipt_id=data["receipt_id"],
                    action_id=str(data.get("action_id") or ""),
                    replayed=bool(data.get("replayed")) or response.headers.get("Idempotent-Replayed") == "true",
                    idempotency_key=key,
                    credits_charged=None,
                    reason_code=str(data["error"]) if data.get("error") is not None else None,
                    result=None,
                    error=dict(error),
                )
            err = _rpc_exception(error, data)
            if isinstance(err, Conflict) and err.code == "idempotency_key_in_progress" and waits < self.max_retries:
                waits += 1
                self._pause(err.retry_after if err.retry_after is not None else 1.0)
                continue
            raise err

    # -- offline verification -------------------------------------------------------------

    @staticmethod
    def verify_portable_offline(portable: Any, jwks: Any = None) -> PortableVerification:
        """See :func:`tollgate_client.verify.verify_portable_offline` (no network)."""
        return verify_portable_offline(portable, jwks)


class _SharedTransport(httpx.BaseTransport):
    """A transport borrowed from another client: closing the borrower does not close it."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._inner.handle_request(request)

    def close(self) -> None:
        pass


# --- response decoding ---------------------------------------------------------------------


def _body_of(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


def _decode(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise error_for_status(response.status_code, _body_of(response), response.headers)
    if response.status_code == 204 or not response.content:
        return None
    content_type = response.headers.get("Content-Type", "")
    if "json" not in content_type:
        return response.text
    try:
        return response.json()
    except ValueError as exc:
        raise ProtocolError(response.status_code, "invalid_json", "The answer is not JSON.", response.text) from exc


def _sse_messages(text: str) -> list[Any]:
    """The JSON ``data`` of each event of a ``text/event-stream`` body."""
    out: list[Any] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:"))
        if data:
            try:
                out.append(json.loads(data))
            except ValueError:
                continue
    return out


def _rpc_answer(response: httpx.Response, rid: Any) -> dict[str, Any]:
    """The JSON-RPC response for ``rid``; raises the HTTP error when the answer is not JSON-RPC."""
    content_type = response.headers.get("Content-Type", "")
    if "text/event-stream" in content_type:
        candidates = [m for m in _sse_messages(response.text) if isinstance(m, dict) and m.get("id") == rid]
        if candidates:
            return dict(candidates[-1])
    else:
        body = _body_of(response)
        if isinstance(body, dict) and body.get("jsonrpc") == "2.0" and ("result" in body or "error" in body):
            return body
        if response.status_code >= 400:
            raise error_for_status(response.status_code, body, response.headers)
    if response.status_code >= 400:
        raise error_for_status(response.status_code, _body_of(response), response.headers)
    raise ProtocolError(response.status_code, "invalid_jsonrpc", "The answer is not a JSON-RPC response.", None)


def _result_from_rpc(result: dict[str, Any], key: str, response: httpx.Response) -> ToolCallResult:
    meta = result.get("_meta") if isinstance(result.get("_meta"), dict) else {}
    assert isinstance(meta, dict)
    receipt_id = meta.get("io.tollgate/receipt-id")
    if not isinstance(receipt_id, str):
        raise ProtocolError(response.status_code, "missing_receipt", "The tool result carries no receipt id.", result)
    charged = meta.get("io.tollgate/credits-charged")
    outcome = meta.get("io.tollgate/outcome") or ("tool_error" if result.get("isError") else "success")
    return ToolCallResult(
        outcome=str(outcome),
        receipt_id=receipt_id,
        action_id=str(meta.get("io.tollgate/action-id") or ""),
        replayed=bool(meta.get("io.tollgate/replayed")) or response.headers.get("Idempotent-Replayed") == "true",
        idempotency_key=key,
        credits_charged=None if charged is None else Decimal(str(charged)),
        reason_code=None,
        result=result,
        error=None,
    )


def _rpc_exception(error: dict[str, Any], data: dict[str, Any]) -> TollgateError:
    """A JSON-RPC error without a receipt as the exception of its REST equivalent (``status`` = that status)."""
    rpc_code = error.get("code")
    message = str(error.get("message") or "JSON-RPC error")
    code = str(data.get("error") or f"jsonrpc_{rpc_code}")
    if rpc_code == _RPC_INVALID_PARAMS:
        loc = data.get("loc") if isinstance(data.get("loc"), list) else ["params"]
        return ValidationError(422, code, message, [{"loc": loc, "msg": message, "type": code}])
    if rpc_code == _RPC_IN_PROGRESS:
        retry = data.get("retry_after_seconds")
        return Conflict(409, code, message, data, retry_after=float(retry) if isinstance(retry, int | float) else None)
    if rpc_code == _RPC_FORBIDDEN:
        if code in ("key_required", "not_authenticated", "invalid_api_key"):
            return AuthenticationError(401, code, message, data)
        return PermissionDenied(403, code, message, data)
    if rpc_code == _RPC_METHOD_NOT_FOUND:
        return NotFound(404, code, message, data)
    if rpc_code == _RPC_INTERNAL:
        return ServerError(500, code, message, data)
    if rpc_code in _RPC_PROTOCOL:
        return ProtocolError(400, code, message, data)
    return TollgateError(None, code, message, error)


# --- resource groups -----------------------------------------------------------------------


class _Group:
    def __init__(self, client: TollgateClient) -> None:
        self._c = client

    def _page(self, data: Any, item: Callable[[Any], T]) -> Page[T]:
        return Page.parse(data, item)


class Wallets(_Group):
    """Sponsor and agent wallets, ledger, pricing and charges (``/v1/billing``)."""

    def create_sponsor(
        self,
        name: str = "",
        *,
        initial_credits: Amount | None = None,
        daily_limit: Amount | None = None,
        expires_at: datetime | str | None = None,
    ) -> Wallet:
        """Create a sponsor wallet (a new tenant), provisioning ``initial_credits``. Operator key only."""
        body = _body(
            name=name,
            initial_credits=None if initial_credits is None else _amount(initial_credits),
            daily_limit=None if daily_limit is None else _amount(daily_limit),
            expires_at=expires_at,
        )
        return Wallet.from_dict(self._c._post("/v1/billing/wallets/sponsor", body))

    def create_agent(
        self,
        parent_wallet_id: str,
        name: str = "",
        *,
        initial_balance: Amount | None = None,
        budget: Amount | None = None,
        daily_limit: Amount | None = None,
        refill_threshold: Amount | None = None,
        refill_amount: Amount | None = None,
        expires_at: datetime | str | None = None,
    ) -> Wallet:
        """Create an agent (under a sponsor) or child (under an agent) wallet funded from its parent."""
        amounts = {
            "initial_balance": initial_balance,
            "budget": budget,
            "daily_limit": daily_limit,
            "refill_threshold": refill_threshold,
            "refill_amount": refill_amount,
        }
        body = _body(
            parent_wallet_id=parent_wallet_id,
            name=name,
            expires_at=expires_at,
            **{k: None if v is None else _amount(v) for k, v in amounts.items()},
        )
        return Wallet.from_dict(self._c._post("/v1/billing/wallets/agent", body))

    def get(self, wallet_id: str) -> Wallet:
        return Wallet.from_dict(self._c._get(f"/v1/billing/wallets/{wallet_id}"))

    def update(self, wallet_id: str, **changes: Any) -> Wallet:
        """Change some of a wallet's settings (``name``, ``budget``, ``daily_limit``, ``refill_threshold``,
        ``refill_amount``; ``None`` removes a limit). An extension of the 1.3.0 API.

        A key may lower its own wallet's limits but never raise them (``PermissionDenied``,
        ``wallet_limit_raise_denied``). The answer's ``raw`` holds ``changes`` (before and after) and
        ``notices`` (a limit set under what the wallet already spent in its window).
        """
        body = {name: _value(value) for name, value in changes.items()}
        return Wallet.from_dict(self._c.request("PATCH", f"/v1/billing/wallets/{wallet_id}", json_body=body))

    def list(
        self, *, wallet_type: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> Page[Wallet]:
        data = self._c._get("/v1/billing/wallets", wallet_type=wallet_type, limit=limit, offset=offset)
        return self._page(data, Wallet.from_dict)

    def ledger(self, wallet_id: str, *, limit: int | None = None) -> JSONObject:
        """``{"wallet_id", "balance", "items": [entries, newest first], "total", "limit"}``."""
        return dict(self._c._get(f"/v1/billing/ledger/{wallet_id}", limit=limit))

    def pricing(self) -> JSONObject:
        """``{"unit", "categories": [...], "tools": [{"tool", "credits_per_call"}]}``."""
        return dict(self._c._get("/v1/billing/pricing"))

    def charge(
        self,
        wallet_id: str,
        *,
        service_category: str | None = None,
        units: Amount | None = None,
        request_path: str | None = None,
        description: str | None = None,
        idempotency_key: str | None = None,
    ) -> JSONObject:
        """Debit ``units`` of ``service_category`` (a new idempotency key per call unless given)."""
        data = self._c._post(
            "/v1/billing/charge",
            None,
            idempotency_key=idempotency_key if idempotency_key is not None else _new_key(),
            wallet_id=wallet_id,
            service_category=service_category,
            units=None if units is None else _amount(units),
            request_path=request_path,
            description=description,
        )
        return dict(data)


class Keys(_Group):
    """API keys (``/v1/api-keys``). Secrets are shown once: on create and rotate."""

    def create(self, wallet_id: str, name: str = "") -> ApiKey:
        return ApiKey.from_dict(self._c._post("/v1/api-keys", {"wallet_id": wallet_id, "name": name}))

    def list(self, wallet_id: str, *, limit: int | None = None, offset: int | None = None) -> Page[ApiKey]:
        return self._page(self._c._get(f"/v1/api-keys/{wallet_id}", limit=limit, offset=offset), ApiKey.from_dict)

    def rotate(
        self, wallet_id: str, key_id: str, *, revoke_old: bool | None = None, reason: str | None = None
    ) -> KeyRotation:
        """Create the key's successor (``new_key.secret``); the old key is revoked unless ``revoke_old=False``."""
        body = _body(wallet_id=wallet_id, key_id=key_id, revoke_old=revoke_old, reason=reason)
        return KeyRotation.from_dict(self._c._post("/v1/api-keys/rotate", body))

    def revoke(self, wallet_id: str, key_id: str, *, reason: str | None = None) -> None:
        self._c.request("DELETE", f"/v1/api-keys/{wallet_id}/{key_id}", params={"reason": reason})

    def emergency_revoke(self, wallet_id: str, *, reason: str | None = None) -> EmergencyRevocation:
        """Revoke every key of the wallet at once."""
        body = _body(wallet_id=wallet_id, reason=reason)
        return EmergencyRevocation.from_dict(self._c._post("/v1/api-keys/emergency-revoke", body))

    def logs(self, wallet_id: str, *, limit: int | None = None) -> _Objs:
        """Key lifecycle log entries (created, rotated, revoked), newest first."""
        return [dict(e) for e in self._c._get(f"/v1/api-keys/{wallet_id}/logs", limit=limit)]


class Permits(_Group):
    """Signed permits (``/v1/permits``)."""

    def issue(
        self,
        wallet_id: str,
        allowed_tools: Sequence[str],
        max_credits: Amount,
        *,
        max_calls: int | None = None,
        expires_in_seconds: int | None = None,
        subject_key_id: str | None = None,
        idempotency_key: str | None = None,
        allowed_servers: Sequence[str] | None = None,
    ) -> Permit:
        """Issue a permit for ``wallet_id`` (the issuer is the caller's wallet, the subject or above it).

        A new idempotency key is generated unless given; a replay returns the same permit.
        ``allowed_servers``: the upstream servers (slugs) whose tools it covers; None: any.
        """
        body = _body(
            wallet_id=wallet_id,
            allowed_tools=list(allowed_tools),
            max_credits=_amount(max_credits),
            max_calls=max_calls,
            expires_in_seconds=expires_in_seconds,
            subject_key_id=subject_key_id,
            allowed_servers=None if allowed_servers is None else list(allowed_servers),
        )
        key = idempotency_key if idempotency_key is not None else _new_key()
        return Permit.from_dict(self._c._post("/v1/permits", body, idempotency_key=key))

    def get(self, permit_id: str) -> Permit:
        return Permit.from_dict(self._c._get(f"/v1/permits/{permit_id}"))

    def list(
        self,
        *,
        wallet_id: str | None = None,
        status: str | None = None,
        subject_key_id: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        expires_after: datetime | str | None = None,
        expires_before: datetime | str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Permit]:
        data = self._c._get(
            "/v1/permits",
            wallet_id=wallet_id,
            status=status,
            subject_key_id=subject_key_id,
            created_after=created_after,
            created_before=created_before,
            expires_after=expires_after,
            expires_before=expires_before,
            limit=limit,
            offset=offset,
        )
        return self._page(data, Permit.from_dict)

    def revoke(self, permit_id: str) -> Permit:
        return Permit.from_dict(self._c._post(f"/v1/permits/{permit_id}/revoke"))

    def verify(
        self, permit_id: str | None = None, *, statement: Mapping[str, Any] | None = None, signature: str | None = None
    ) -> PermitVerification:
        """Verify a permit by id, or a signed permit document (``statement`` + ``signature``)."""
        if statement is not None:
            body: dict[str, Any] = {"permit": dict(statement), "signature": signature}
        else:
            body = {"permit_id": permit_id}
        return PermitVerification.from_dict(self._c._post("/v1/permits/verify", body))

    def receipts(
        self,
        permit_id: str,
        *,
        tool: str | None = None,
        outcome: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Receipt]:
        data = self._c._get(f"/v1/permits/{permit_id}/receipts", tool=tool, outcome=outcome, limit=limit, offset=offset)
        return self._page(data, Receipt.from_dict)


class PermitRequests(_Group):
    """Ask a human for a permit (``/v1/permit-requests``) and wait for the decision."""

    def create(
        self,
        wallet_id: str,
        allowed_tools: Sequence[str],
        max_credits: Amount,
        *,
        max_calls: int | None = None,
        expires_in_seconds: int | None = None,
        subject_key_id: str | None = None,
        justification: str | None = None,
        idempotency_key: str | None = None,
        allowed_servers: Sequence[str] | None = None,
    ) -> PermitRequest:
        """File a request (status ``pending``); a new idempotency key is generated unless given.

        ``allowed_servers``: the upstream servers (slugs) whose tools the permit would cover; None: any.
        An approval mints the permit with exactly these.
        """
        body = _body(
            wallet_id=wallet_id,
            allowed_tools=list(allowed_tools),
            max_credits=_amount(max_credits),
            max_calls=max_calls,
            expires_in_seconds=expires_in_seconds,
            subject_key_id=subject_key_id,
            justification=justification,
            allowed_servers=None if allowed_servers is None else list(allowed_servers),
        )
        key = idempotency_key if idempotency_key is not None else _new_key()
        return PermitRequest.from_dict(self._c._post("/v1/permit-requests", body, idempotency_key=key))

    def get(self, request_id: str) -> PermitRequest:
        return PermitRequest.from_dict(self._c._get(f"/v1/permit-requests/{request_id}"))

    def card(self, request_id: str) -> str:
        """The read-only HTML card (the approver's notification)."""
        return str(self._c.request("GET", f"/v1/permit-requests/{request_id}/card", headers={"Accept": "text/html"}))

    def wait_for_decision(self, request_id: str, timeout: float = 300.0, interval: float = 2.0) -> Permit:
        """Poll until the request is decided; return the minted permit.

        Raises ``PermitRequestNotApproved`` when it was rejected or expired and
        ``DecisionTimeout`` when it is still pending after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            preq = self.get(request_id)
            if preq.status != "pending":
                if preq.status == "approved" and preq.permit is not None:
                    return preq.permit
                raise PermitRequestNotApproved(preq)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DecisionTimeout(request_id, timeout)
            time.sleep(max(0.0, min(interval, remaining)))


class Quotes(_Group):
    """Signed price quotes (``/v1/quotes``): free, 600 s lifetime, consumed by one call."""

    def create(self, wallet_id: str, tool: str) -> Quote:
        return Quote.from_dict(self._c._post("/v1/quotes", {"wallet_id": wallet_id, "tool": tool}))

    def get(self, quote_id: str) -> Quote:
        return Quote.from_dict(self._c._get(f"/v1/quotes/{quote_id}"))

    def list_mine(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Quote]:
        """Quotes of the caller's own wallet (``status="active"`` for spendable ones). Wallet keys only."""
        data = self._c._get("/v1/me/quotes", status=status, tool=tool, limit=limit, offset=offset)
        return self._page(data, Quote.from_dict)


class Policies(_Group):
    """Policy bundles (``/v1/policies``)."""

    def create(
        self,
        wallet_id: str,
        *,
        name: str | None = None,
        enabled: bool | None = None,
        allowed_tools: Sequence[str] | None = None,
        denied_tools: Sequence[str] | None = None,
        max_credits_per_call: Amount | None = None,
        max_daily_credits: Amount | None = None,
        allowed_categories: Sequence[str] | None = None,
        human_approval_required: bool | None = None,
        allowed_servers: Sequence[str] | None = None,
    ) -> Policy:
        """Create a bundle for ``wallet_id`` and the wallets below it (omitted rules keep their defaults)."""
        body = _body(
            wallet_id=wallet_id,
            name=name,
            enabled=enabled,
            allowed_tools=None if allowed_tools is None else list(allowed_tools),
            denied_tools=None if denied_tools is None else list(denied_tools),
            max_credits_per_call=None if max_credits_per_call is None else _amount(max_credits_per_call),
            max_daily_credits=None if max_daily_credits is None else _amount(max_daily_credits),
            allowed_categories=None if allowed_categories is None else list(allowed_categories),
            human_approval_required=human_approval_required,
            allowed_servers=None if allowed_servers is None else list(allowed_servers),
        )
        return Policy.from_dict(self._c._post("/v1/policies", body))

    def list(
        self, *, wallet_id: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> Page[Policy]:
        data = self._c._get("/v1/policies", wallet_id=wallet_id, limit=limit, offset=offset)
        return self._page(data, Policy.from_dict)

    def get(self, policy_id: str) -> Policy:
        return Policy.from_dict(self._c._get(f"/v1/policies/{policy_id}"))

    def patch(self, policy_id: str, **changes: Any) -> Policy | PolicyChangeProposal:
        """Change some rules; a ``None`` value is sent as JSON null (e.g. ``allowed_tools=None``: every tool).

        Returns the policy as changed, or, when the change relaxes human approval (turns
        ``human_approval_required`` off or disables a policy requiring it), the pending
        ``PolicyChangeProposal``: nothing changed until a second person confirms it in the console.
        """
        body = {name: _value(value) for name, value in changes.items()}
        data = self._c.request("PATCH", f"/v1/policies/{policy_id}", json_body=body)
        if isinstance(data, Mapping) and "proposal_id" in data:
            return PolicyChangeProposal.from_dict(data)
        return Policy.from_dict(data)


class Tools(_Group):
    """The tool catalog (``/mcp/tools.json``, ``/mcp/tools``)."""

    def manifest(self, *, category: str | None = None) -> ToolManifest:
        """The authoritative manifest of callable tools (mirrors MCP ``tools/list``)."""
        return ToolManifest.from_dict(self._c._get("/mcp/tools.json", category=category))

    def list(self, *, category: str | None = None, limit: int | None = None, offset: int | None = None) -> Page[Tool]:
        data = self._c._get("/mcp/tools", category=category, limit=limit, offset=offset)
        return self._page(data, Tool.from_dict)

    def get(self, name: str) -> Tool:
        return Tool.from_dict(self._c._get(f"/mcp/tools/{name}"))


class Receipts(_Group):
    """Receipts, evidence and portable export (``/v1/receipts``, ``/v1/evidence``)."""

    def get(self, receipt_id: str) -> Receipt:
        return Receipt.from_dict(self._c._get(f"/v1/receipts/{receipt_id}"))

    def list(
        self,
        *,
        permit_id: str | None = None,
        wallet_id: str | None = None,
        tool: str | None = None,
        outcome: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Receipt]:
        data = self._c._get(
            "/v1/receipts",
            permit_id=permit_id,
            wallet_id=wallet_id,
            tool=tool,
            outcome=outcome,
            limit=limit,
            offset=offset,
        )
        return self._page(data, Receipt.from_dict)

    def evidence(self, receipt_id: str) -> Evidence:
        """The evidence bundle with every check computed now (``verified``, ``verification``)."""
        return Evidence.from_dict(self._c._get(f"/v1/evidence/{receipt_id}"))

    def portable(self, receipt_id: str) -> JSONObject:
        """The portable export: signed bytes, signature, kid and key snapshot. Save it as JSON."""
        return dict(self._c._get(f"/v1/receipts/{receipt_id}/portable"))

    def verify(
        self, receipt_id: str | None = None, *, statement: Mapping[str, Any] | None = None, signature: str | None = None
    ) -> ReceiptVerification:
        """Ask the gateway to verify a receipt by id, or a signed receipt document."""
        if statement is not None:
            body: dict[str, Any] = {"receipt": dict(statement), "signature": signature}
        else:
            body = {"receipt_id": receipt_id}
        return ReceiptVerification.from_dict(self._c._post("/v1/receipts/verify", body))

    @staticmethod
    def verify_portable_offline(portable: Any, jwks: Any = None) -> PortableVerification:
        """Verify a portable export with no network (see :mod:`tollgate_client.verify`)."""
        return verify_portable_offline(portable, jwks)


class Me(_Group):
    """Self-inspection of the caller's own wallet (``/v1/me``; wallet-scoped keys only)."""

    def authority(self) -> Authority:
        return Authority.from_dict(self._c._get("/v1/me/authority"))

    def permits(
        self,
        *,
        status: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        expires_after: datetime | str | None = None,
        expires_before: datetime | str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Permit]:
        data = self._c._get(
            "/v1/me/permits",
            status=status,
            created_after=created_after,
            created_before=created_before,
            expires_after=expires_after,
            expires_before=expires_before,
            limit=limit,
            offset=offset,
        )
        return self._page(data, Permit.from_dict)

    def permit_requests(
        self, *, status: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> Page[PermitRequest]:
        data = self._c._get("/v1/me/permit-requests", status=status, limit=limit, offset=offset)
        return self._page(data, PermitRequest.from_dict)

    def quotes(
        self,
        *,
        status: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Quote]:
        return self._c.quotes.list_mine(status=status, tool=tool, limit=limit, offset=offset)

    def receipts(
        self,
        *,
        permit_id: str | None = None,
        tool: str | None = None,
        outcome: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[Receipt]:
        data = self._c._get(
            "/v1/me/receipts", permit_id=permit_id, tool=tool, outcome=outcome, limit=limit, offset=offset
        )
        return self._page(data, Receipt.from_dict)

    def alerts(self, *, limit: int | None = None, offset: int | None = None) -> Page[JSONObject]:
        return self._page(self._c._get("/v1/me/alerts", limit=limit, offset=offset), dict)

    def audit_events(self, *, limit: int | None = None, offset: int | None = None, **filters: Any) -> Page[JSONObject]:
        """Audit events about the caller's wallet (filters: event, tool, endpoint, ok, created_after, ...)."""
        return self._page(self._c._get("/v1/me/audit/events", limit=limit, offset=offset, **filters), dict)


class SigningKeys(_Group):
    """Public evidence keys: metadata and the JWKS to verify portable receipts against."""

    def active(self) -> JSONObject:
        return dict(self._c._get("/v1/signing-keys/active"))

    def get(self, key_id: str) -> JSONObject:
        return dict(self._c._get(f"/v1/signing-keys/{key_id}"))

    def jwks(self) -> JSONObject:
        """``/.well-known/jwks.json``. Fetch it over TLS from the issuer for offline verification."""
        return dict(self._c._get("/.well-known/jwks.json"))
