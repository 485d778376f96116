"""Shared building blocks that import no app (docs/decisions.md, Foundation); apps import them, never the reverse."""
