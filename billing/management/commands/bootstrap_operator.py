"""First-run operator bootstrap: a Django superuser and an operator API key.

Both secrets are written once to a file only the owner can read; a later run
finds the file and changes nothing. Neither secret is printed or logged.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from access.selectors import api_key_file_active
from access.services import operator_key_create


class Command(BaseCommand):
    help = "Create the operator superuser and operator API key once; write them to an owner-only file."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--credentials-file",
            default=str(Path(settings.BASE_DIR) / ".data" / "operator-credentials.json"),
            help="Where to write the credentials (created with mode 0600; never overwritten).",
        )
        parser.add_argument("--username", default="operator")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["credentials_file"]).resolve()
        username = options["username"]
        User = get_user_model()
        if path.exists():
            if api_key_file_active(path=path, field="operator_api_key"):
                self.stdout.write(f"Operator credentials already exist: {path}")
                return
            # The database was reset since: the file names a key it no longer has.
            path.replace(path.with_suffix(".stale.json"))
            self.stdout.write(f"Operator credentials in {path} no longer match the database; creating new ones.")
        if User.objects.filter(username=username).exists():
            raise CommandError(
                f"User {username!r} exists but {path} does not; refusing to mint a second set of credentials. "
                "Create an operator key in the admin console instead."
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(24)
        with transaction.atomic():
            User.objects.create_superuser(username=username, email="", password=password)
        issued = operator_key_create(name="bootstrap operator")
        payload = {
            "admin_url": f"{settings.PUBLIC_BASE_URL}/admin/",
            "username": username,
            "password": password,
            "operator_key_id": issued.key.key_id,
            "operator_api_key": issued.secret,
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")
        self.stdout.write(self.style.SUCCESS(f"Operator credentials written to {path} (mode 0600)."))
