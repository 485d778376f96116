"""Generic API views: the endpoints that only read what the caller may see and answer it serialized
(DRF's generic views, without their model plumbing). A subclass declares what differs: the caller
(``principal``, or ``wallet_principal`` for the ``/v1/me`` views), the query, the selector, the item
serializer; ``page_schema`` and ``detail_schema`` give it its OpenAPI operation.

Lists follow docs/architecture.md, "HTTP contract" (``common.pagination``). They live in access because
the caller is an API key's :class:`access.selectors.Principal`, which ``common`` cannot import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from access.authentication import principal, wallet_principal
from access.selectors import Principal
from common.pagination import PageQuery, page, parse_query
from common.schema import error_responses

V = TypeVar("V", bound=type[APIView])


# A view that reads as the calling key: ``caller`` gives it (``wallet_principal`` for wallet keys only).
# The generic views' notes are comments, not docstrings: a view's docstring is its operations' description.
class CallerView(APIView):
    caller: Callable[[Request], Principal] = staticmethod(principal)


# GET: a page (``common.pagination.page``) of ``rows(caller, params, **url kwargs)``, each row an ``item``;
# ``rows`` is a selector (``staticmethod``) or a method. The caller is read before the query is validated:
# a key refused by ``caller`` is told so whatever it asked.
class PageView(CallerView):
    query: type[serializers.Serializer] = PageQuery
    item: type[serializers.Serializer]
    rows: Callable[..., QuerySet[Any]]

    def item_for(self, params: dict[str, Any]) -> type[serializers.Serializer]:
        """The serializer of one row; a view whose query chooses it (a summary) says how."""
        return self.item

    def get(self, request: Request, **kwargs: str) -> Response:
        caller = self.caller(request)
        params = parse_query(request, self.query)
        return Response(page(self.rows(caller, params, **kwargs), params, self.item_for(params)))


# A page of the caller's own wallet's rows (``/v1/me``): wallet keys only (403 ``wallet_key_required``).
class MePageView(PageView):
    caller = staticmethod(wallet_principal)


# GET: ``item`` of ``lookup(caller, <the id in the URL>)``, the selector (``staticmethod``) or method that
# answers 404 for what the caller may not see.
class DetailView(CallerView):
    item: type[serializers.Serializer]
    lookup: Callable[[Principal, str], Any]

    def get(self, request: Request, **kwargs: str) -> Response:
        (key,) = kwargs.values()
        return Response(self.item(self.lookup(self.caller(request), key)).data)


def page_schema(operation_id: str, summary: str, tags: list[str], response: Any, *errors: int) -> Callable[[V], V]:
    """The OpenAPI operation of a ``PageView``'s GET: its ``query`` as parameters, ``response`` (the list
    envelope) for 200, then ``errors``."""

    def decorate(view: V) -> V:
        query = view.query  # type: ignore[attr-defined]
        responses = {200: response, **error_responses(*errors)}
        get = extend_schema(
            operation_id=operation_id, tags=tags, parameters=[query], responses=responses, summary=summary
        )
        return extend_schema_view(get=get)(view)

    return decorate


def detail_schema(operation_id: str, summary: str, tags: list[str], *errors: int) -> Callable[[V], V]:
    """The OpenAPI operation of a ``DetailView``'s GET: its ``item`` for 200, then ``errors``."""

    def decorate(view: V) -> V:
        responses = {200: view.item, **error_responses(*errors)}  # type: ignore[attr-defined]
        get = extend_schema(operation_id=operation_id, tags=tags, responses=responses, summary=summary)
        return extend_schema_view(get=get)(view)

    return decorate
