"""``GET /metrics``: Prometheus text exposition (format 0.0.4) for operators and scrapers.

Who may read it: an operator API key, or a scraper presenting the configured
``METRICS_SCRAPE_TOKEN`` as ``Authorization: Bearer <token>``. The token is
checked first, before API-key authentication (which would refuse a bearer
that is not an API key with 401). Wallet keys get 403.

Where each figure comes from:

* PostgreSQL, at scrape time (exact across every process and node; each a
  counter because the rows behind it are immutable and only ever added):
  governed actions by receipt outcome and upstream server (its slug), actions
  swept by the sweeper, charges and refunds posted to the revenue account
  (count and credits), and audit appends (the sum of the chain heads' sequence
  numbers). Five queries: the server records (id to slug), one small group-by
  over receipts, one over the revenue side of the ledger, one over the chain
  heads (one row per tenant) and one on the partial index of claimed actions.
  The receipts and ledger group-bys read every receipt and every charge/refund
  entry, so their cost grows with history; scrape every 15 s or more.
* ``prometheus-client`` (:mod:`common.metrics`; summed over every gunicorn
  worker of the instance in its multiprocess mode): requests by route and
  status, the upstream latency histogram and upstream failures by server and
  class, rate-limit refusals; with ``METRICS_TOOL_LABELS``, upstream calls by
  server and tool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.http import HttpResponse
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.authentication import BaseAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from access.authentication import APIKeyAuthentication
from access.selectors import Principal
from audit.models import ChainHead
from billing.models import LedgerEntry, LedgerKind, SystemAccount
from common.errors import NotAuthenticated, OperatorKeyRequired
from common.metrics import exposition, multiprocess_dir
from common.schema import error_responses
from mcpgateway.models import Action, ActionState, UpstreamServer
from metrics.middleware import scrape_token_matches
from receipts.models import Outcome, Receipt

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SWEPT_REASON = "dispatch_lost"  # mcpgateway.services.action_sweep's reason code

Labels = tuple[tuple[str, str], ...]


# --- Exposition writer ----------------------------------------------------------------------------


@dataclass
class Family:
    """One metric family: ``# HELP``, ``# TYPE`` and its samples (suffix, labels, value)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, Labels, str]] = field(default_factory=list)

    def add(self, value: int | float | Decimal | str, labels: Labels = (), suffix: str = "") -> Family:
        self.samples.append((suffix, labels, _number(value)))
        return self


def _number(value: int | float | Decimal | str) -> str:
    if isinstance(value, Decimal):
        return format(value.normalize(), "f") if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(families: Iterable[Family]) -> str:
    """The text exposition format, version 0.0.4."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for suffix, labels, value in family.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{family.name}{suffix}{{{text}}} {value}" if text else f"{family.name}{suffix} {value}")
    return "\n".join(lines) + "\n"


# --- Business totals (PostgreSQL) ------------------------------------------------------------------


@dataclass(frozen=True)
class BusinessTotals:
    """Exact totals over every process, read from the system of record."""

    # (outcome, server slug) -> count; "" for calls on no server (local tools, refusals: nothing was sent).
    actions_by_outcome: dict[tuple[str, str], int]
    actions_in_flight: int
    swept_actions: int
    debits: int
    debited_credits: Decimal
    refunds: int
    refunded_credits: Decimal
    audit_appends: int


def business_totals() -> BusinessTotals:
    """Five aggregate queries; see the module docstring for their cost."""
    slugs = dict(UpstreamServer.objects.values_list("server_id", "slug"))
    by_outcome: dict[tuple[str, str], int] = {(o.value, slug): 0 for o in Outcome for slug in ("", *slugs.values())}
    swept = 0
    rows = (
        Receipt.objects.order_by()
        .values("outcome", "upstream_server_id")
        .annotate(n=Count("receipt_id"), swept=Count("receipt_id", filter=Q(reason_code=SWEPT_REASON)))
    )
    for row in rows:
        server_id = row["upstream_server_id"] or ""
        # A server record deleted since keeps its calls under its id (as bounded as the records were).
        key = (row["outcome"], slugs.get(server_id, server_id))
        by_outcome[key] = by_outcome.get(key, 0) + row["n"]
        swept += row["swept"]
    in_flight = Action.objects.filter(state=ActionState.DISPATCH_CLAIMED).count()
    ledger: dict[str, dict[str, Any]] = {
        row["kind"]: dict(row)
        for row in LedgerEntry.objects.filter(
            account=SystemAccount.REVENUE, kind__in=[LedgerKind.CHARGE, LedgerKind.REFUND]
        )
        .order_by()
        .values("kind")
        .annotate(n=Count("entry_id"), total=Sum("amount"))
    }
    charges = ledger.get(LedgerKind.CHARGE, {})
    refunds = ledger.get(LedgerKind.REFUND, {})
    appends = ChainHead.objects.aggregate(total=Sum("seq"))["total"] or 0
    return BusinessTotals(
        actions_by_outcome=by_outcome,
        actions_in_flight=in_flight,
        swept_actions=swept,
        debits=int(charges.get("n") or 0),
        # Charges credit the revenue account, refunds debit it.
        debited_credits=Decimal(charges.get("total") or 0),
        refunds=int(refunds.get("n") or 0),
        refunded_credits=-Decimal(refunds.get("total") or 0),
        audit_appends=int(appends),
    )


# --- Families ---------------------------------------------------------------------------------------


def _business_families(totals: BusinessTotals) -> list[Family]:
    actions = Family(
        "tollgate_governed_actions_total",
        "counter",
        "Governed actions finished, by receipt outcome and upstream server slug (PostgreSQL; exact across "
        'processes; server "": a local tool, or a refusal, which is sent nowhere).',
    )
    for (outcome, server), n in sorted(totals.actions_by_outcome.items()):
        actions.add(n, (("outcome", outcome), ("server", server)))
    return [
        actions,
        Family(
            "tollgate_governed_actions_in_flight",
            "gauge",
            "Governed actions claimed for dispatch and not yet finished (PostgreSQL).",
        ).add(totals.actions_in_flight),
        Family(
            "tollgate_sweeper_swept_actions_total",
            "counter",
            "Claimed actions the sweeper settled as delivery_uncertain (PostgreSQL).",
        ).add(totals.swept_actions),
        Family("tollgate_ledger_debits_total", "counter", "Charge transactions posted (PostgreSQL).").add(
            totals.debits
        ),
        Family(
            "tollgate_ledger_debited_credits_total", "counter", "Credits charged to wallets, in credits (PostgreSQL)."
        ).add(totals.debited_credits),
        Family("tollgate_ledger_refunds_total", "counter", "Refund transactions posted (PostgreSQL).").add(
            totals.refunds
        ),
        Family(
            "tollgate_ledger_refunded_credits_total", "counter", "Credits refunded to wallets, in credits (PostgreSQL)."
        ).add(totals.refunded_credits),
        Family(
            "tollgate_audit_appends_total", "counter", "Events appended to the audit chains, all chains (PostgreSQL)."
        ).add(totals.audit_appends),
    ]


def _store_info() -> Family:
    directory = multiprocess_dir()
    return Family(
        "tollgate_metrics_store_info",
        "gauge",
        "Where the process-side counters come from: every worker of this instance (multiprocess) or one process.",
    ).add(1, (("backend", "multiprocess" if directory else "process"), ("shared", "true" if directory else "false")))


def metrics_exposition() -> str:
    """The whole ``/metrics`` document."""
    build = Family("tollgate_build_info", "gauge", "Service version.").add(
        1, (("version", str(settings.SERVICE_VERSION)),)
    )
    return render([build, *_business_families(business_totals()), _store_info()]) + exposition()


# --- The view ---------------------------------------------------------------------------------------


class ScrapeClient:
    """The caller authenticated by ``METRICS_SCRAPE_TOKEN``: may read /metrics, nothing else."""

    is_authenticated = True


class ScrapeTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <METRICS_SCRAPE_TOKEN>``, compared in constant time. Otherwise no opinion."""

    def authenticate(self, request: Request) -> tuple[ScrapeClient, None] | None:
        return (ScrapeClient(), None) if scrape_token_matches(request._request) else None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="tollgate"'


class OperatorOrScraper(BasePermission):
    """An operator key or the scrape token; wallet keys are refused (403), anonymous callers 401."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if isinstance(user, ScrapeClient):
            return True
        if not isinstance(user, Principal):
            raise NotAuthenticated("An operator API key or the metrics scrape token is required.")
        if not user.is_operator:
            raise OperatorKeyRequired("Metrics need an operator key or the metrics scrape token.")
        return True


class FirstRenderer(BaseContentNegotiation):
    """Errors are JSON whatever the scraper accepts (Prometheus asks for text first)."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, str(renderer.media_type)


class MetricsView(APIView):
    authentication_classes = [ScrapeTokenAuthentication, APIKeyAuthentication]
    permission_classes = [OperatorOrScraper]
    content_negotiation_class = FirstRenderer

    @extend_schema(
        operation_id="metrics",
        tags=["operations"],
        summary="Prometheus metrics (text exposition format 0.0.4)",
        description=(
            "Operator key, or `Authorization: Bearer <METRICS_SCRAPE_TOKEN>`. Business totals (governed "
            "actions by outcome, credits debited and refunded, swept actions, audit appends) are read from "
            "PostgreSQL and exact across processes; requests by route and status, upstream latency and "
            "rate-limit refusals are summed over the instance's workers (Prometheus aggregates instances)."
        ),
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="Prometheus text format 0.0.4."),
            **error_responses(401, 403),
        },
    )
    def get(self, request: Request) -> HttpResponse:
        response = HttpResponse(metrics_exposition(), content_type=CONTENT_TYPE)
        response["Cache-Control"] = "no-store"
        return response


class ScrapeTokenScheme(OpenApiAuthenticationExtension):
    target_class = "metrics.views.ScrapeTokenAuthentication"
    name = "MetricsScrapeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The METRICS_SCRAPE_TOKEN setting, for Prometheus scrapers (GET /metrics only).",
        }
