"""Default credits per unit for each service category (operators change them in the admin console)."""

from decimal import Decimal

from django.db import migrations

DEFAULT_PRICES = {
    "compute": Decimal("1.00000000"),
    "data": Decimal("0.50000000"),
    "search": Decimal("0.25000000"),
    "storage": Decimal("0.10000000"),
    "messaging": Decimal("0.20000000"),
    "payments": Decimal("2.00000000"),
    "content": Decimal("0.50000000"),
    "tooling": Decimal("0.10000000"),
    "other": Decimal("1.00000000"),
}


def seed(apps, schema_editor):
    ServicePrice = apps.get_model("billing", "ServicePrice")
    for category, price in DEFAULT_PRICES.items():
        ServicePrice.objects.get_or_create(category=category, defaults={"credits_per_unit": price})


def unseed(apps, schema_editor):
    apps.get_model("billing", "ServicePrice").objects.filter(category__in=list(DEFAULT_PRICES)).delete()


class Migration(migrations.Migration):
    dependencies = [("billing", "0003_ledger_triggers")]

    operations = [migrations.RunPython(seed, unseed)]
