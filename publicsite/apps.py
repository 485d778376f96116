"""The public site: discovery documents, health, the launch preflight, the landing page and the dashboard.

It sits above every other app (it reads the tool registry, the upstream's health, receipts and the
signing keys); no app imports it (docs/decisions.md, Foundation).
"""

from __future__ import annotations

from django.apps import AppConfig


class PublicsiteConfig(AppConfig):
    name = "publicsite"
    default_auto_field = "django.db.models.BigAutoField"
