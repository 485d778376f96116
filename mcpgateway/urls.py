from django.conf import settings
from django.urls import path

from mcpgateway import transports, views

urlpatterns = [
    path("mcp/tools.json", views.ToolManifestView.as_view(), name="mcp-tools-manifest"),
    path(".well-known/mcp/tools.json", views.WellKnownToolManifestView.as_view(), name="mcp-tools-well-known"),
    path("mcp/tools", views.ToolListView.as_view(), name="mcp-tools"),
    path("mcp/tools/<str:service_id>", views.ToolDetailView.as_view(), name="mcp-tool-detail"),
    path("mcp/tools/<str:service_id>/invoke", views.ToolInvokeView.as_view(), name="mcp-tool-invoke"),
    path("mcp/public", transports.mcp_public, name="mcp-public"),
    path("mcp/messages", transports.mcp_messages, name="mcp-messages"),
    path("v1/upstreams", views.UpstreamServerListView.as_view(), name="upstreams"),
    path("v1/upstreams/<slug:slug>", views.UpstreamServerDetailView.as_view(), name="upstream-detail"),
    path("v1/upstreams/<slug:slug>/credentials", views.UpstreamCredentialView.as_view(), name="upstream-credentials"),
    path("v1/upstreams/<slug:slug>/sync", views.UpstreamSyncView.as_view(), name="upstream-sync"),
    path("v1/upstreams/<slug:slug>/test", views.UpstreamTestView.as_view(), name="upstream-test"),
]

if settings.ENABLE_MCP_STREAMABLE_HTTP:
    urlpatterns.insert(0, path("mcp", transports.mcp_streamable, name="mcp"))  # first: the hot route
