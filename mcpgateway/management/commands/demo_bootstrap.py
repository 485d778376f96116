"""First-run demo set-up for the bundled demo upstream: prices, a demo tenant, an agent key and a permit.

Written once to an owner-only file; a later run finds the file and changes
nothing. Used by ``make run`` only when it started the bundled demo upstream.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from access.selectors import api_key_file_active
from access.services import api_key_create
from billing.selectors import tool_price
from billing.services import tool_price_set, wallet_create_agent, wallet_create_sponsor
from common.ids import new_id
from mcpgateway.models import Tool
from permits.services import PermitTerms, permit_issue

DEMO_PRICES = {
    "notes.append": Decimal("0.5"),
    "notes.list": Decimal("0.1"),
    "math.add": Decimal("0.1"),
    "clock.now": Decimal("0.05"),
    "demo.stats": Decimal("0.01"),
}


class Command(BaseCommand):
    help = "Price the demo upstream's tools and create a demo tenant with an agent key and a permit (once)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--credentials-file", default=str(Path(settings.BASE_DIR) / ".data" / "demo-credentials.json")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name, credits in DEMO_PRICES.items():
            if Tool.objects.filter(service_id=name).exists() and tool_price(name) is None:
                tool_price_set(tool=name, credits=credits, actor="demo_bootstrap")
        # What is callable now, as it is (an operator may have changed prices in the console since).
        for tool in Tool.objects.filter(enabled=True).order_by("service_id"):
            price = tool_price(tool.service_id)
            shown = "no price: not callable" if price is None else f"{price.normalize():f} credits per call"
            self.stdout.write(f"  tool {tool.service_id}: {shown}")
        path = Path(options["credentials_file"]).resolve()
        if path.exists():
            if api_key_file_active(path=path, field="agent_api_key"):
                self._refresh(path)
                self.stdout.write(f"Demo credentials already exist: {path}")
                return
            # The database was reset since: the file names a key it no longer has.
            path.replace(path.with_suffix(".stale.json"))
            self.stdout.write(f"Demo credentials in {path} no longer match the database; creating new ones.")
        sponsor = wallet_create_sponsor(name="demo sponsor", initial_credits=Decimal("1000"), actor="demo_bootstrap")
        agent = wallet_create_agent(parent=sponsor, name="demo agent", initial_balance=Decimal("100"))
        issued = api_key_create(wallet=agent, name="demo agent key")
        permit = permit_issue(
            terms=PermitTerms(
                wallet=agent,
                issuer_wallet=sponsor,
                allowed_tools=sorted(DEMO_PRICES),
                max_credits=Decimal("50"),
                max_calls=None,
                expires_at=timezone.now() + timedelta(days=30),
            ),
            idempotency_scope=sponsor.wallet_id,
            idempotency_key=new_id("demo"),
            request_hash="demo",
        ).permit
        payload = {
            "gateway": settings.PUBLIC_BASE_URL,
            "sponsor_wallet_id": sponsor.wallet_id,
            "agent_wallet_id": agent.wallet_id,
            "agent_api_key": issued.secret,
            "permit_id": permit.permit_id,
            **_demo_approver(sponsor),
        }
        _write_private(path, payload)
        self.stdout.write(self.style.SUCCESS(f"Demo tenant, agent key and permit written to {path} (mode 0600)."))

    def _refresh(self, path: Path) -> None:
        """Keep a reused file true: this run's gateway address, and an approver if it predates them."""
        payload = json.loads(path.read_text())
        changed = payload.get("gateway") != settings.PUBLIC_BASE_URL
        payload["gateway"] = settings.PUBLIC_BASE_URL
        if "approver_username" not in payload:
            from billing.models import Wallet

            sponsor = Wallet.objects.filter(wallet_id=payload.get("sponsor_wallet_id")).first()
            if sponsor is not None:
                payload.update(_demo_approver(sponsor))
                changed = True
        if changed:
            _write_private(path, payload)


def _demo_approver(sponsor: Any) -> dict[str, str]:
    """A user who approves the demo tenant's permit requests on /approvals/ (not staff: no console)."""
    import secrets

    from django.contrib.auth import get_user_model

    from permits.services import tenant_approver_add

    username = f"demo-approver-{sponsor.wallet_id[-6:].lower()}"
    password = secrets.token_urlsafe(18)
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first() or user_model(username=username)
    user.set_password(password)
    user.save()
    tenant_approver_add(user=user, tenant=sponsor, actor="demo_bootstrap")
    return {"approver_username": username, "approver_password": password}


def _write_private(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to an owner-only file, replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=2)
        fh.write("\n")
    tmp.replace(path)
