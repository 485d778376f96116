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

from config.errors import ApplicationError
from permits import selectors, services
from permits.models import PermitRequest


@require_GET
@login_required
def queue(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    rows = list(selectors.approval_queue(request.user)[:200])
    pending = [r for r in rows if r.effective_status(now) == "pending"]
    decided = [r for r in rows if r.effective_status(now) != "pending"][:50]
    context = {
        "pending": pending,
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


@require_GET
@login_required
def detail(request: HttpRequest, request_id: str) -> HttpResponse:
    preq = _visible_request(request, request_id)
    context = {
        **selectors.permit_request_card_context(preq, approval_url=request.build_absolute_uri()),
        "show_decide_link": False,  # the decision form is on this page
        "terms": services.permit_request_terms(preq),  # sent back with the decision: the terms shown
    }
    return render(request, "permits/approvals_detail.html", context)


@require_POST
@login_required
def decide(request: HttpRequest, request_id: str) -> HttpResponse:
    preq = _visible_request(request, request_id)
    action = request.POST.get("decision")
    if action not in {"approve", "reject"}:
        messages.error(request, "Choose approve or reject.")
        return HttpResponseRedirect(reverse("approvals-detail", args=[preq.request_id]))
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
