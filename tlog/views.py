"""The transparency log's public, read-only endpoints (docs/audit-chain.md, "The transparency log").

No credentials: a log is readable by anyone (docs/decisions.md, Evidence, "Who may read a log"); the
requests are charged to the caller's address like the JWKS (access.ratelimit.PUBLIC_PREFIXES) and
carry an ETag. Full tiles and entry bundles never change and are cached for good; the checkpoint
changes every few seconds and is revalidated.
"""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from access.authentication import AllowAnyone
from common.pagination import parse_query
from common.schema import error_responses
from tlog import selectors
from tlog.keys import gateway_name, log_verifiers, origin_of
from tlog.lib import note
from tlog.models import LogKey
from tlog.serializers import TlogConsistencyQuery

TLOG = ["transparency_log"]
TEXT = "text/plain; charset=utf-8"
IMMUTABLE = "public, max-age=31536000, immutable"
# A checkpoint is replaced every few seconds: a cache keeps it, but asks again (ETag) before using it.
REVALIDATE = "public, no-cache"


def _text(body: str | bytes, content_type: str = TEXT, cache_control: str = REVALIDATE) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = cache_control
    return response


class PublicLogView(APIView):
    """A log endpoint: readable by anyone; no authentication runs (a presented key is neither needed nor read)."""

    permission_classes = [AllowAnyone]
    authentication_classes: list[type] = []


class CheckpointView(PublicLogView):
    @extend_schema(
        operation_id="tlog_checkpoint",
        tags=TLOG,
        auth=[],
        responses={(200, "text/plain"): OpenApiTypes.STR, **error_responses(404)},
        summary="The latest checkpoint of a tenant's log (C2SP tlog-checkpoint in a signed note, with cosignatures)",
    )
    def get(self, request: Request, tenant_id: str) -> HttpResponse:
        return _text(selectors.cosigned_checkpoint(selectors.log_head(tenant_id)))


class LogKeyView(PublicLogView):
    @extend_schema(
        operation_id="tlog_log_key",
        tags=TLOG,
        auth=[],
        responses={(200, "text/plain"): OpenApiTypes.STR, **error_responses(404)},
        summary="The note verifier string(s) of a tenant's log key, one per line, newest first",
    )
    def get(self, request: Request, tenant_id: str) -> HttpResponse:
        return _text(
            "".join(f"{verifier}\n" for verifier in log_verifiers(tenant_id)), cache_control="public, max-age=300"
        )


class ProofView(PublicLogView):
    @extend_schema(
        operation_id="tlog_proof",
        tags=TLOG,
        auth=[],
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="A C2SP tlog-proof@v1 document"),
            202: OpenApiResponse(
                OpenApiTypes.OBJECT,
                description='Not in a checkpoint yet: {"status": "pending", "fetch": "<this URL>"}; ask again later',
            ),
            **error_responses(404),
        },
        summary="The inclusion proof of a statement (receipt, permit, quote or audit event id) in its tenant's log",
    )
    def get(self, request: Request, tenant_id: str, statement_id: str) -> HttpResponse:
        inclusion = selectors.statement_inclusion(tenant_id, statement_id)
        if inclusion.pending:
            response = JsonResponse(inclusion.transparency(), status=202)
            response["Retry-After"] = "2"
            response["Cache-Control"] = "no-store"
            return response
        return _text(inclusion.proof or "")


class ConsistencyView(PublicLogView):
    @extend_schema(
        operation_id="tlog_consistency",
        tags=TLOG,
        auth=[],
        parameters=[TlogConsistencyQuery],
        responses={(200, "text/plain"): OpenApiTypes.STR, **error_responses(404, 422)},
        summary="The consistency proof between two sizes of a tenant's log (base64 hashes, one per line)",
    )
    def get(self, request: Request, tenant_id: str) -> HttpResponse:
        sizes = parse_query(request, TlogConsistencyQuery)
        proof = selectors.consistency(tenant_id, sizes["old"], sizes["new"])
        return _text("".join(f"{note.b64encode(h)}\n" for h in proof), cache_control=IMMUTABLE)


class TileView(PublicLogView):
    @extend_schema(
        operation_id="tlog_tile",
        tags=TLOG,
        auth=[],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **error_responses(404)},
        summary="A C2SP tlog-tiles tile (tile/<L>/<N>[.p/<W>]) or entry bundle (tile/entries/<N>[.p/<W>])",
    )
    def get(self, request: Request, tenant_id: str, path: str) -> HttpResponse:
        data, full = selectors.tile(tenant_id, "tile/" + path)
        # Every tile path names content that never changes (a partial tile is replaced by a wider path).
        return _text(data, "application/octet-stream", IMMUTABLE if full else "public, max-age=3600")


class LogKeysView(PublicLogView):
    @extend_schema(
        operation_id="tlog_keys",
        tags=TLOG,
        auth=[],
        responses={200: OpenApiTypes.OBJECT, **error_responses()},
        summary="The transparency logs' note key: the origin format and the public key(s), beside the JWKS",
    )
    def get(self, request: Request) -> HttpResponse:
        keys = [
            {"public_key": public, "created_at": created.isoformat()}
            for public, created in LogKey.objects.order_by("-created_at").values_list("public_key", "created_at")
        ]
        return JsonResponse(
            {
                "origin_format": origin_of("TENANT").replace("TENANT", "{tenant_id}"),
                "gateway": gateway_name(),
                "algorithm": "Ed25519 signed-note key (type 0x01), named by the log's origin",
                "verifier_format": "<origin>+<key id>+base64(0x01 || public key); /tlog/<tenant id>/key lists them",
                "keys": keys,
            }
        )
