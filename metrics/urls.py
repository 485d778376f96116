"""Route of ``GET /metrics``; included from the root URLconf with ``path("", include("metrics.urls"))``."""

from django.urls import path

from metrics.middleware import METRICS_PATH
from metrics.views import MetricsView

urlpatterns = [
    path(METRICS_PATH.lstrip("/"), MetricsView.as_view(), name="metrics"),
]
