"""The access app: who calls (API keys, the caller, authentication, rate limiting) and sign-in
throttling, below every app that authenticates a caller (docs/architecture.md, "The apps"). What it
reads of wallets, billing registers at start-up (``access.wallets``)."""

from __future__ import annotations

from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "access"
