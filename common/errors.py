"""The one error model (docs/architecture.md, "HTTP contract").

Every failure the service reports is an :class:`ApplicationError` subclass with a
stable ``code``, an HTTP status and a message, rendered as
``{"detail": {"error": code, "message": text, ...extra}}``. Request validation
failures are 422 with the HTTPValidationError shape
``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``. One DRF exception
handler renders both and rolls back the open transaction; views never build
error responses inline.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.response import Response

logger = logging.getLogger("tollgate.errors")


class ApplicationError(Exception):
    """Base of every domain failure. Subclasses set ``code``, ``http_status``, ``message``."""

    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = status.HTTP_400_BAD_REQUEST
    message: ClassVar[str] = "The request failed."

    def __init__(
        self,
        message: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        self.detail_message = message or self.message
        self.extra = extra
        self.headers = dict(headers or {})
        super().__init__(self.detail_message)

    def as_detail(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.detail_message, **self.extra}


class NotAuthenticated(ApplicationError):
    code = "not_authenticated"
    http_status = status.HTTP_401_UNAUTHORIZED
    message = "An API key is required: send it in the X-API-Key header or as Authorization: Bearer <key>."


class PayloadTooLarge(ApplicationError):
    code = "payload_too_large"
    http_status = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    message = "The request body is larger than this service accepts."


class InvalidAPIKey(ApplicationError):
    code = "invalid_api_key"
    http_status = status.HTTP_401_UNAUTHORIZED
    message = "The API key is malformed, too short, unknown or revoked."


class PermissionDeniedError(ApplicationError):
    code = "permission_denied"
    http_status = status.HTTP_403_FORBIDDEN
    message = "The caller is not allowed to do this."


class OperatorKeyRequired(PermissionDeniedError):
    code = "operator_key_required"
    message = "This operation needs an operator (bootstrap administrator) key."


class WalletAccessDenied(PermissionDeniedError):
    code = "wallet_access_denied"
    message = "The wallet is outside the caller's reach."


class WalletKeyRequired(PermissionDeniedError):
    code = "wallet_key_required"
    message = "This operation needs a wallet-scoped API key; operator keys have no wallet."


class NotFound(ApplicationError):
    code = "not_found"
    http_status = status.HTTP_404_NOT_FOUND
    message = "No such resource."


class Conflict(ApplicationError):
    code = "conflict"
    http_status = status.HTTP_409_CONFLICT
    message = "The request conflicts with the current state."


class IdempotencyKeyInProgress(Conflict):
    code = "idempotency_key_in_progress"
    message = "A request with this idempotency key is still being processed; retry later."


class TransactionConflict(Conflict):
    code = "transaction_conflict"
    message = "The database refused the transaction because of a concurrent one; nothing was written. Retry."


class RateLimited(ApplicationError):
    code = "rate_limited"
    http_status = status.HTTP_429_TOO_MANY_REQUESTS
    message = "Rate limit exceeded."


class InternalError(ApplicationError):
    code = "internal_error"
    http_status = status.HTTP_500_INTERNAL_SERVER_ERROR
    message = "An internal error occurred. It has been logged; the request was not applied."


class RequestValidationError(Exception):
    """422 in the HTTPValidationError shape. ``errors`` are ``{"loc", "msg", "type"}`` dicts."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__(errors)

    @classmethod
    def single(cls, loc: Sequence[str | int], msg: str, type_: str) -> RequestValidationError:
        return cls([{"loc": list(loc), "msg": msg, "type": type_}])


class IdempotencyKeyReused(RequestValidationError):
    """The idempotency conflict: the same key with a different request (docs/architecture.md, "HTTP contract")."""

    def __init__(self) -> None:
        super().__init__(
            [
                {
                    "loc": ["header", "Idempotency-Key"],
                    "msg": "This idempotency key was already used with a different request; use a new key.",
                    "type": "idempotency_key_reused",
                }
            ]
        )


def flatten_drf_errors(detail: Any, loc: list[str | int]) -> list[dict[str, Any]]:
    """Turn DRF's nested error detail into HTTPValidationError items."""
    out: list[dict[str, Any]] = []
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            sub = loc if key == "non_field_errors" else [*loc, key]
            out.extend(flatten_drf_errors(value, sub))
    elif isinstance(detail, list):
        if detail and all(isinstance(d, (str, drf_exceptions.ErrorDetail)) for d in detail):
            for d in detail:
                out.append({"loc": loc, "msg": str(d), "type": getattr(d, "code", None) or "invalid"})
        else:
            for i, value in enumerate(detail):
                out.extend(flatten_drf_errors(value, [*loc, i]))
    else:
        out.append({"loc": loc, "msg": str(detail), "type": getattr(detail, "code", None) or "invalid"})
    return out


def _validation_response(errors: list[dict[str, Any]]) -> Response:
    return Response({"detail": errors}, status=status.HTTP_422_UNPROCESSABLE_ENTITY)


def _error_response(err: ApplicationError) -> Response:
    response = Response({"detail": err.as_detail()}, status=err.http_status)
    for name, value in err.headers.items():
        response[name] = value
    if err.http_status == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = 'Bearer realm="tollgate"'
    return response


# Serialization failures and deadlocks: PostgreSQL aborted the transaction and nothing it wrote
# remains, so the answer is 409 ``transaction_conflict`` with ``Retry-After``, never a 500.
# ``common.dbretry.run_retrying`` first runs a transaction that is safe to repeat a few times more.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})


def is_retryable(exc: BaseException) -> bool:
    """True for a serialization failure or deadlock (directly or wrapped by Django)."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        if candidate is not None and getattr(candidate, "sqlstate", None) in RETRYABLE_SQLSTATES:
            return True
    return False


def conflict_response() -> TransactionConflict:
    return TransactionConflict(headers={"Retry-After": "1"}, retry_after_seconds=1)


_DRF_MAP: dict[type[Exception], type[ApplicationError]] = {
    drf_exceptions.NotAuthenticated: NotAuthenticated,
    drf_exceptions.AuthenticationFailed: InvalidAPIKey,
    drf_exceptions.PermissionDenied: PermissionDeniedError,
    drf_exceptions.NotFound: NotFound,
}


def exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response:
    """DRF EXCEPTION_HANDLER: render every error in the shape of docs/architecture.md, "HTTP contract"."""
    # Whatever was written in the failed request must not be committed (DRF's rule:
    # only matters under ATOMIC_REQUESTS, which stays off; services own their transactions).
    from rest_framework.views import set_rollback  # late: rest_framework.views imports our auth classes

    set_rollback()

    if isinstance(exc, RequestValidationError):
        return _validation_response(exc.errors)
    if isinstance(exc, ApplicationError):
        return _error_response(exc)
    if isinstance(exc, drf_exceptions.ValidationError):
        loc = context.get("validation_loc", ["body"])
        return _validation_response(flatten_drf_errors(exc.detail, list(loc)))
    if isinstance(exc, drf_exceptions.ParseError):
        return _validation_response([{"loc": ["body"], "msg": str(exc.detail), "type": "json_invalid"}])
    if isinstance(exc, Http404):
        return _error_response(NotFound())
    if isinstance(exc, PermissionDenied):
        return _error_response(PermissionDeniedError())
    for drf_cls, app_cls in _DRF_MAP.items():
        if isinstance(exc, drf_cls):
            err = app_cls(str(exc.detail)) if isinstance(exc, drf_exceptions.APIException) else app_cls()
            return _error_response(err)
    if isinstance(exc, drf_exceptions.Throttled):
        return _error_response(RateLimited())
    from django.db import OperationalError

    if isinstance(exc, OperationalError) and is_retryable(exc):
        logger.warning("transaction conflict answered 409: %s", exc)
        return _error_response(conflict_response())
    if isinstance(exc, drf_exceptions.APIException):
        code = exc.default_code if isinstance(exc.default_code, str) else "error"
        response = Response(
            {"detail": {"error": code, "message": str(exc.detail)}},
            status=exc.status_code,
        )
        return response
    logger.exception("unhandled error", exc_info=exc)
    return _error_response(InternalError())


def json_error(request: HttpRequest, err: ApplicationError) -> JsonResponse:
    """Render an ApplicationError outside DRF (middleware, plain Django views)."""
    response = JsonResponse({"detail": err.as_detail()}, status=err.http_status)
    for name, value in err.headers.items():
        response[name] = value
    return response


def handler500(request: HttpRequest) -> JsonResponse:
    return json_error(request, InternalError())


HUMAN_PAGES = ("/admin/", "/approvals/", "/dashboard")


def _for_a_person(request: HttpRequest) -> bool:
    """A browser on the console, approval or dashboard pages gets an HTML error page; API clients JSON."""
    accept = request.headers.get("Accept", "")
    return request.path.startswith(HUMAN_PAGES) and "text/html" in accept


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _for_a_person(request):
        from django.template.response import TemplateResponse

        response = TemplateResponse(request, "403.html", {"path": request.path}, status=403)
        return response.render()
    return json_error(request, PermissionDeniedError())


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _for_a_person(request):
        from django.template.response import TemplateResponse

        return TemplateResponse(request, "404.html", {"path": request.path}, status=404).render()
    return json_error(request, NotFound())


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        {"detail": [{"loc": ["request"], "msg": "Malformed request.", "type": "bad_request"}]},
        status=422,
    )
