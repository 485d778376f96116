"""Data-migration steps that several apps' migrations share (docs/decisions.md, Foundation).

Migrations import these, so what a function does must not change once a migration that calls it is
applied: a different step is a new function. They take the historical ``apps`` registry and use only
its models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def permissions_create(apps: Any, app_label: str) -> None:
    """Create the permissions of ``app_label``'s models now: Django creates them only after ``migrate``,
    and a migration that grants them to groups needs them before."""
    from django.contrib.auth.management import create_permissions

    app_config = apps.get_app_config(app_label)
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None


def group_permissions_add(apps: Any, app_label: str, grants: Mapping[str, Iterable[str]]) -> None:
    """Give each group named in ``grants`` its codenames of ``app_label`` (created first when missing).

    A group that does not exist (deleted by a superuser) is left alone: no group is created here.
    """
    permissions_create(apps, app_label)
    for group, permissions in _groups_and_permissions(apps, app_label, grants):
        group.permissions.add(*permissions)


def group_permissions_remove(apps: Any, app_label: str, grants: Mapping[str, Iterable[str]]) -> None:
    """The reverse of :func:`group_permissions_add`: take the codenames back from each group that exists."""
    for group, permissions in _groups_and_permissions(apps, app_label, grants):
        group.permissions.remove(*permissions)


def _groups_and_permissions(
    apps: Any, app_label: str, grants: Mapping[str, Iterable[str]]
) -> Iterable[tuple[Any, Any]]:
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in grants.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            yield group, Permission.objects.filter(content_type__app_label=app_label, codename__in=list(codenames))


def content_types_move(apps: Any, *, models: Iterable[str], source: str, target: str) -> None:
    """Move the content types of ``models`` from app ``source`` to app ``target`` (a model moved in state
    only), and so every permission on them and every grant of one to a group or a user.

    A database that never had the content type is left alone (``post_migrate`` creates it). When both
    exist (a ``post_migrate`` ran in between), each grant is carried over and the old type dropped.
    """
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    User = apps.get_model("auth", "User")
    for model in models:
        old = ContentType.objects.filter(app_label=source, model=model).first()
        if old is None:
            continue
        new = ContentType.objects.filter(app_label=target, model=model).first()
        if new is None:
            old.app_label = target
            old.save(update_fields=["app_label"])
            continue
        for permission in Permission.objects.filter(content_type=old):
            moved, _ = Permission.objects.get_or_create(
                content_type=new, codename=permission.codename, defaults={"name": permission.name}
            )
            for group in Group.objects.filter(permissions=permission):
                group.permissions.add(moved)
            for user in User.objects.filter(user_permissions=permission):
                user.user_permissions.add(moved)
        old.delete()
