"""API-key authentication for DRF (docs/architecture.md, "Tenancy and authority").

Credentials: ``X-API-Key: <key>`` or ``Authorization: Bearer <key>``. The
rate-limit middleware resolves the credential first (it must know whose bucket
to charge) and leaves the result on the request; authentication reuses it.

The caller it authenticates is a :class:`billing.selectors.Principal`, defined
in billing beside the reach rule it carries; this module wires billing's key
lookup into DRF and gives views the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import HttpRequest
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from billing.models import APIKey
from billing.selectors import Principal, api_key_authenticate
from common.errors import InvalidAPIKey, NotAuthenticated, WalletKeyRequired


def credential_from_headers(request: HttpRequest) -> str | None:
    """The presented secret, or None when no credential header is present."""
    return credential_from_meta(request.META)


def credential_from_meta(meta: Mapping[str, Any]) -> str | None:
    """``credential_from_headers`` on a request's ``META`` (or a WSGI environ, which it copies)."""
    key = meta.get("HTTP_X_API_KEY")
    if key is not None:
        return str(key).strip()
    auth = meta.get("HTTP_AUTHORIZATION")
    if auth is not None:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer":
            return auth.strip() or " "  # present but not a bearer credential: rejected
        return token.strip()
    return None


def resolve_credential(request: HttpRequest) -> tuple[APIKey | None, Exception | None]:
    """Resolve (once per request) the presented credential to an active key or an error."""
    cached = getattr(request, "_tollgate_auth", None)
    if cached is not None:
        return cached
    secret = credential_from_headers(request)
    result: tuple[APIKey | None, Exception | None]
    if secret is None:
        result = (None, None)
    else:
        try:
            result = (api_key_authenticate(secret=secret), None)
        except InvalidAPIKey as exc:
            result = (None, exc)
    request._tollgate_auth = result  # type: ignore[attr-defined]
    return result


class APIKeyAuthentication(BaseAuthentication):
    """DRF authentication class: the caller is a :class:`Principal` or anonymous."""

    def authenticate(self, request: Request) -> tuple[Principal, APIKey] | None:
        key, error = resolve_credential(request._request)
        if error is not None:
            raise error
        if key is None:
            return None
        return Principal(key), key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="tollgate"'


class HasAPIKey(BasePermission):
    """Default permission: an authenticated API key is required."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not isinstance(request.user, Principal):
            raise NotAuthenticated()
        return True


class AllowAnyone(BasePermission):
    """For public endpoints: a presented key is still checked (a bad one is 401)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return True


def principal(request: Request) -> Principal:
    user = request.user
    if not isinstance(user, Principal):
        raise NotAuthenticated()
    return user


def wallet_principal(request: Request) -> Principal:
    """The caller, who must hold a wallet-scoped key (403 ``wallet_key_required`` for operator keys)."""
    caller = principal(request)
    if caller.is_operator:
        raise WalletKeyRequired()
    return caller


def optional_principal(request: Request) -> Principal | None:
    user = request.user
    return user if isinstance(user, Principal) else None


class APIKeyScheme(OpenApiAuthenticationExtension):
    target_class = "billing.authentication.APIKeyAuthentication"
    name = ["APIKeyHeader", "BearerAuth"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        # Either header authenticates: two alternative requirements, not one requiring both.
        return [{"APIKeyHeader": []}, {"BearerAuth": []}]

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, Any]]:
        return [
            {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            {"type": "http", "scheme": "bearer"},
        ]
