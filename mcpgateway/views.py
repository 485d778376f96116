"""Gateway HTTP surface. For now: liveness."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """Liveness only: the process answers. Dependency truth is ``/health/dependencies``."""
    return JsonResponse({"status": "ok", "service": "tollgate", "version": settings.SERVICE_VERSION})
