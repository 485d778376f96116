"""Test-only routes that fail on purpose, to check the error model's 500 path."""

from django.urls import include, path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.authentication import AllowAnyone


class Boom(APIView):
    permission_classes = [AllowAnyone]

    def get(self, request: Request) -> Response:
        raise RuntimeError("secret internal detail: /etc/passwd at line 42")


def plain_boom(request):
    raise RuntimeError("secret internal detail in a plain view")


urlpatterns = [
    path("boom", Boom.as_view()),
    path("plain-boom", plain_boom),
    path("", include("config.urls")),
]

handler500 = "common.errors.handler500"
