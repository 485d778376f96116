"""The access app: who calls (API-key secrets) and sign-in throttling, below every app that
authenticates a caller (docs/architecture.md, "The apps")."""

from __future__ import annotations

from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "access"
