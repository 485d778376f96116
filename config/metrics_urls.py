"""Route of ``GET /metrics``; included from the root URLconf with ``path("", include("config.metrics_urls"))``."""

from django.urls import path

from config.metrics import METRICS_PATH
from config.metrics_views import MetricsView

urlpatterns = [
    path(METRICS_PATH.lstrip("/"), MetricsView.as_view(), name="metrics"),
]
