"""Make sure an evidence signing key is active and usable here (``make run`` calls this on every start).

First run: activates ``SIGNING_KEY_PRIVATE`` if set, else generates a key into
the key file (``SIGNING_KEY_FILE``, mode 0600). Later runs change nothing. If
the active key's private part is missing on this machine, rotates to a new key
(the old one stays published, so what it signed still verifies).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit import keystore
from audit.services import signing_key_ensure


class Command(BaseCommand):
    help = "Activate an evidence signing key if none is active (generating one into the key file)."

    def handle(self, *args: Any, **options: Any) -> None:
        key = signing_key_ensure(repair=True, actor="manage.py ensure_signing_key")
        source = "SIGNING_KEY_PRIVATE" if (env := keystore.env_key()) and env.kid == key.key_id else "key file"
        self.stdout.write(f"Active signing key: {key.key_id} (private key from {source}: {keystore.key_file_path()})")
