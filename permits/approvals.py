"""The human approval surface: server-rendered pages for approvers (Django session login).

API keys cannot reach these pages: they need a logged-in Django user who is an
approver of the request's tenant. Viewing the queue or a request never changes
it; only the POST of the decision form does.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from common.errors import ApplicationError, RequestValidationError
from common.jsonbody import check_storable
from permits import selectors, services
from permits.models import PermitRequest, PermitRequestStatus

# The pending requests the queue page lists (newest first); it says how many more are waiting.
QUEUE_PENDING_SHOWN = 500


@require_GET
@login_required
def queue(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    # Pending requests are read apart from decided ones: the newest rows of the queue alone let a burst
    # of requests push older pending ones off the page.
    queue = selectors.approval_queue(request.user)
    waiting = queue.filter(status=PermitRequestStatus.PENDING, expires_at__gt=now)
    pending = list(waiting[:QUEUE_PENDING_SHOWN])
    decided = list(queue.exclude(pk__in=waiting.values("pk"))[:50])
    context = {
        "pending": pending,
        "pending_not_shown": max(0, waiting.count() - len(pending)) if len(pending) == QUEUE_PENDING_SHOWN else 0,
        "decided": decided,
        "now": now,
        "is_approver": bool(selectors.approver_tenants(request.user)),
    }
    return render(request, "permits/approvals_queue.html", context)


def _visible_request(request: HttpRequest, request_id: str) -> PermitRequest:
    preq = selectors.approval_queue(request.user).filter(request_id=request_id).first()
    if preq is None:
        raise Http404("No such permit request in your queue.")
    return preq


def _detail_page(request: HttpRequest, preq: PermitRequest, *, status: int = 200) -> HttpResponse:
    approval_url = request.build_absolute_uri(reverse("approvals-detail", args=[preq.request_id]))
    context = {
        **selectors.permit_request_card_context(preq, approval_url=approval_url),
        "show_decide_link": False,  # the decision form is on this page
        "terms": services.permit_request_terms(preq),  # sent back with the decision: the terms shown
    }
    return render(request, "permits/approvals_detail.html", context, status=status)


@require_GET
@login_required
def detail(request: HttpRequest, request_id: str) -> HttpResponse:
    return _detail_page(request, _visible_request(request, request_id))


def _form_text_problem(request: HttpRequest) -> str | None:
    """Why the decision form's text cannot be taken, if it cannot: PostgreSQL text holds no NUL and
    no lone surrogate (``common.jsonbody.check_storable``, the API's rule for stored strings)."""
    for name, label in (("note", "Note"), ("terms", "Terms")):
        try:
            check_storable(request.POST.get(name, ""), [name])
        except RequestValidationError as err:
            return f"{label}: {err.errors[0]['msg']} Nothing was decided."
    return None


@require_POST
@login_required
def decide(request: HttpRequest, request_id: str) -> HttpResponse:
    preq = _visible_request(request, request_id)
    action = request.POST.get("decision")
    if action not in {"approve", "reject"}:
        messages.error(request, "Choose approve or reject.")
        return HttpResponseRedirect(reverse("approvals-detail", args=[preq.request_id]))
    problem = _form_text_problem(request)
    if problem is not None:
        messages.error(request, problem)
        return _detail_page(request, preq, status=400)
    try:
        decided = services.permit_request_decide(
            request_id=preq.request_id,
            user=request.user,
            approve=action == "approve",
            note=request.POST.get("note", ""),
            shown_terms=request.POST.get("terms", ""),
        )
    except ApplicationError as err:
        messages.error(request, err.detail_message)
    else:
        if decided.permit_id:
            messages.success(request, f"Approved. Permit {decided.permit_id} was minted.")
        else:
            messages.success(request, "Rejected.")
    return HttpResponseRedirect(reverse("approvals-detail", args=[preq.request_id]))
