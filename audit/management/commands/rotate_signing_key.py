"""Retire the active evidence signing key and activate a newly generated one.

The new private key is written to the key file (``SIGNING_KEY_FILE``, mode
0600). Retired keys stay published at ``/v1/signing-keys/{key_id}`` and in the
JWKS, so statements they signed keep verifying.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit import keystore
from audit.services import signing_key_rotate


class Command(BaseCommand):
    help = "Retire the active signing key and activate a new one."

    def handle(self, *args: Any, **options: Any) -> None:
        key = signing_key_rotate(actor="manage.py rotate_signing_key")
        self.stdout.write(
            self.style.SUCCESS(f"Active signing key is now {key.key_id} (private key in {keystore.key_file_path()}).")
        )
        if keystore.env_key() is not None:
            self.stdout.write(
                self.style.WARNING(
                    "SIGNING_KEY_PRIVATE is set: it now holds a retired key; replace it with the new key "
                    "or unset it, or other servers will refuse to start signing with it."
                )
            )
