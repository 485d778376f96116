"""Re-encrypt every stored upstream credential under the current UPSTREAM_SECRETS_KEY (key rotation).

Run it after setting the new key as ``UPSTREAM_SECRETS_KEY`` and the old one in
``UPSTREAM_SECRETS_PREVIOUS_KEYS`` on every instance; then remove the previous key. All or nothing:
a credential no configured key decrypts stops it with nothing changed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from mcpgateway.services.upstreams import upstream_secrets_rotate
from mcpgateway.upstream.secrets import SecretUnreadable


class Command(BaseCommand):
    help = "Re-encrypt every upstream credential under UPSTREAM_SECRETS_KEY (after a key rotation)."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rotation = upstream_secrets_rotate(actor="manage.py rotate_upstream_secrets")
        except SecretUnreadable as exc:
            raise CommandError(f"Nothing changed: {exc}.") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"re-encrypted {rotation.reencrypted} credential(s) under the current key; "
                f"{rotation.current} already were. UPSTREAM_SECRETS_PREVIOUS_KEYS can now be removed."
            )
        )
