"""Root URLconf. Each app owns its routes (included by name: config imports no app); a route exists
only when it works."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

admin.site.site_header = "Tollgate operator console"
admin.site.site_title = "Tollgate"
admin.site.index_title = "Operations"

# The hot routes first: Django tries patterns in order, and a governed call's /mcp
# otherwise walks past every admin, audit, billing, permits and receipts pattern.
urlpatterns = [
    path("", include("mcpgateway.urls")),
    path("", include("billing.urls")),
    path("", include("access.urls")),
    path("", include("publicsite.health_urls")),
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerSplitView.as_view(url_name="openapi"), name="docs"),
    path("redoc", SpectacularRedocView.as_view(url_name="openapi"), name="redoc"),
    path("admin/", admin.site.urls),
    path("", include("audit.urls")),
    path("", include("tlog.urls")),
    path("", include("permits.urls")),
    path("", include("receipts.urls")),
    path("", include("publicsite.urls")),
    path("", include("metrics.urls")),
]

handler400 = "common.errors.handler400"
handler403 = "common.errors.handler403"
handler404 = "common.errors.handler404"
handler500 = "common.errors.handler500"
