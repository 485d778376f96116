"""Routes of the discovery documents, health, readiness check, dashboard and (when enabled) proof surfaces.

Included from the root URLconf with ``path("", include("publicsite.urls"))``.
The proof surfaces are mounted only when ``ENABLE_PROOF_SURFACES`` is true when
this module is imported; :func:`site_urlpatterns` builds either variant.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import URLPattern, path

from publicsite import site


def site_urlpatterns(*, proof_surfaces: bool) -> list[URLPattern]:
    patterns = [
        path(".well-known/agent.json", site.AgentManifestView.as_view(), name="agent-manifest"),
        path("llms.txt", site.llms_txt, name="llms-txt"),
        path("llm.txt", site.llm_txt, name="llm-txt"),
        path("WEDGE.md", site.wedge_md, name="wedge-md"),
        path("SECURITY_LIMITATIONS.md", site.security_limitations_md, name="security-limitations-md"),
        path("v1/discover", site.DiscoverView.as_view(), name="discover"),
        path("v1/launch/preflight", site.LaunchPreflightView.as_view(), name="launch-preflight"),
        path("health/dependencies", site.HealthDependenciesView.as_view(), name="health-dependencies"),
        path("health/ready", site.HealthReadyView.as_view(), name="health-ready"),
        path("", site.landing, name="landing"),
        path("favicon.ico", site.favicon, name="favicon"),
        path("dashboard", site.dashboard, name="dashboard"),
        path("dashboard/evidence/<str:receipt_id>", site.dashboard_evidence, name="dashboard-evidence"),
        path("dashboard/portable/<str:receipt_id>", site.dashboard_portable, name="dashboard-portable"),
    ]
    if proof_surfaces:
        patterns.append(path("proof/", site.ProofSurfaceIndexView.as_view(), name="proof-index"))
    return patterns


urlpatterns = site_urlpatterns(proof_surfaces=settings.ENABLE_PROOF_SURFACES)
