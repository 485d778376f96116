"""The data steps migrations share (common.migration_helpers), on the historical models a migration sees."""

import pytest
from django.contrib.auth.models import Group
from django.db.migrations.loader import MigrationLoader

from common.migration_helpers import group_permissions_add, group_permissions_remove


@pytest.fixture(scope="module")
def historical_apps():
    return MigrationLoader(None, ignore_no_migrations=True).project_state().apps


@pytest.mark.django_db
def test_grants_go_to_existing_groups_only_and_come_back(historical_apps):
    group = Group.objects.create(name="Ledger clerks")
    grants = {"Ledger clerks": ["provision_credits", "fund_wallet"], "Deleted group": ["provision_credits"]}

    group_permissions_add(historical_apps, "billing", grants)

    held = set(group.permissions.values_list("content_type__app_label", "codename"))
    assert held == {("billing", "provision_credits"), ("billing", "fund_wallet")}
    assert not Group.objects.filter(name="Deleted group").exists()  # a deleted group is not created again

    group_permissions_remove(historical_apps, "billing", grants)

    assert not group.permissions.exists()
