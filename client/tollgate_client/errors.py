"""The one exception hierarchy of the client.

Every failure raises a :class:`TollgateError` carrying the HTTP ``status``
(``None`` for failures that never got an HTTP answer), the stable error
``code`` from ``{"detail": {"error": code, "message": ...}}``, the ``message``
and the whole ``detail``. A governed tool call that was refused or failed
after the gateway accepted it is *not* an exception: a receipt exists, and
``call_tool`` returns a :class:`~tollgate_client.models.ToolCallResult` with
its ``outcome`` and ``error``.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tollgate_client.models import PermitRequest

__all__ = [
    "AuthenticationError",
    "Conflict",
    "DecisionTimeout",
    "InsufficientFunds",
    "NotFound",
    "PermissionDenied",
    "PermitRequestNotApproved",
    "ProtocolError",
    "RateLimited",
    "ServerError",
    "TollgateError",
    "TransportError",
    "ValidationError",
]


class TollgateError(Exception):
    """Base of every client error."""

    def __init__(self, status: int | None, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        prefix = f"{self.status} " if self.status is not None else ""
        return f"{prefix}{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class AuthenticationError(TollgateError):
    """401: missing, malformed, unknown or revoked API key."""


class InsufficientFunds(TollgateError):
    """402: the wallet cannot cover the amount (``balance``, ``required``, ``shortfall``)."""

    def __init__(self, status: int | None, code: str, message: str, detail: Any = None) -> None:
        super().__init__(status, code, message, detail)
        fields = detail if isinstance(detail, dict) else {}
        self.wallet_id: str | None = fields.get("wallet_id")
        self.balance = _decimal(fields.get("balance"))
        self.required = _decimal(fields.get("required"))
        self.shortfall = _decimal(fields.get("shortfall"))


class PermissionDenied(TollgateError):
    """403: the caller may not do this (``wallet_access_denied``, ``operator_key_required``, ...)."""


class NotFound(TollgateError):
    """404: no such resource, or one outside the caller's reach (existence does not leak)."""


class Conflict(TollgateError):
    """409: for example ``idempotency_key_in_progress`` (``retry_after`` seconds when given)."""

    def __init__(
        self, status: int | None, code: str, message: str, detail: Any = None, *, retry_after: float | None = None
    ) -> None:
        super().__init__(status, code, message, detail)
        self.retry_after = retry_after


class ValidationError(TollgateError):
    """422: ``errors`` is the list of ``{"loc", "msg", "type"}`` items (``idempotency_key_reused`` too)."""

    def __init__(self, status: int | None, code: str, message: str, detail: Any = None) -> None:
        super().__init__(status, code, message, detail)
        self.errors: list[dict[str, Any]] = (
            [e for e in detail if isinstance(e, dict)] if isinstance(detail, list) else []
        )


class RateLimited(TollgateError):
    """429: ``retry_after`` seconds from ``Retry-After`` or ``retry_after_seconds``."""

    def __init__(
        self, status: int | None, code: str, message: str, detail: Any = None, *, retry_after: float | None = None
    ) -> None:
        super().__init__(status, code, message, detail)
        self.retry_after = retry_after


class ServerError(TollgateError):
    """5xx: the gateway (or something in front of it) failed."""


class ProtocolError(TollgateError):
    """The answer was not what the protocol promises (not JSON, not a JSON-RPC response, ...)."""


class TransportError(TollgateError):
    """No HTTP answer. ``sent`` tells whether the request may have reached the gateway.

    When ``sent`` is true the outcome is unknown: retry with the same
    ``idempotency_key`` (when there is one) to learn it without acting twice.
    """

    def __init__(self, message: str, *, sent: bool, idempotency_key: str | None = None) -> None:
        super().__init__(None, "transport_error", message, None)
        self.sent = sent
        self.idempotency_key = idempotency_key


class PermitRequestNotApproved(TollgateError):
    """``wait_for_decision``: the request was rejected or expired (``code`` is its status)."""

    def __init__(self, permit_request: PermitRequest) -> None:
        note = f": {permit_request.decision_note}" if permit_request.decision_note else ""
        super().__init__(
            None,
            permit_request.status,
            f"Permit request {permit_request.request_id} was {permit_request.status}{note}",
            permit_request.raw,
        )
        self.permit_request = permit_request


class DecisionTimeout(TollgateError):
    """``wait_for_decision``: still pending when the timeout ran out."""

    def __init__(self, request_id: str, timeout: float) -> None:
        super().__init__(None, "decision_timeout", f"Permit request {request_id} still pending after {timeout:g}s")
        self.request_id = request_id


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _retry_after(headers: Any, detail: Any) -> float | None:
    raw = headers.get("Retry-After") if headers is not None else None
    if raw is None and isinstance(detail, dict):
        raw = detail.get("retry_after_seconds")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except (TypeError, ValueError):
        return None


def error_for_status(status: int, body: Any, headers: Any = None) -> TollgateError:
    """The exception for an HTTP error answer in the gateway's error shape (or anything else)."""
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        first = next((e for e in detail if isinstance(e, dict)), {})
        code = str(first.get("type") or "validation_error")
        message = str(first.get("msg") or "Request validation failed.")
    elif isinstance(detail, dict):
        code = str(detail.get("error") or "error")
        message = str(detail.get("message") or code)
    else:
        code = "http_error"
        message = str(detail)[:500] if detail not in (None, "") else f"HTTP {status}"
    if status == 401:
        return AuthenticationError(status, code, message, detail)
    if status == 402:
        return InsufficientFunds(status, code, message, detail)
    if status == 403:
        return PermissionDenied(status, code, message, detail)
    if status == 404:
        return NotFound(status, code, message, detail)
    if status == 409:
        return Conflict(status, code, message, detail, retry_after=_retry_after(headers, detail))
    if status == 422 or isinstance(detail, list):
        return ValidationError(status, code, message, detail)
    if status == 429:
        return RateLimited(status, code, message, detail, retry_after=_retry_after(headers, detail))
    if status >= 500:
        return ServerError(status, code, message, detail)
    return TollgateError(status, code, message, detail)
