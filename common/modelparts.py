"""Model declarations several apps share (docs/decisions.md, Foundation). Django-only: no app is imported here."""

from __future__ import annotations

from django.db import models


class WrittenOnce(models.Model):
    """A model whose rows are written once and never changed (audit events, receipts): ``save`` refuses
    to overwrite a stored row. The table's trigger, where it has one, refuses UPDATE in the database too."""

    class Meta:
        abstract = True

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise RuntimeError(f"{self._meta.verbose_name_plural} are immutable")
        super().save(*args, **kwargs)  # type: ignore[arg-type]
