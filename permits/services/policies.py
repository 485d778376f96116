"""Policy bundles: creating and changing them (each owns its transaction and is audited); one that
starts requiring human approval revokes the permits no human approved (``approval``).

A policy applies to the wallet it is attached to and every wallet below it. What authorization
reads of the policies, and how, is ``permits.services.authorization``.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.db import transaction

from audit.services import audit_record
from billing.exceptions import money
from billing.models import ServiceCategory, Wallet
from common.errors import RequestValidationError
from common.ids import new_id
from common.jsonbody import check_storable
from permits.models import PolicyBundle
from permits.selectors import check_policy_level
from permits.services.approval import approval_lock, requires_approval, revoke_unapproved

POLICY_FIELDS = (
    "name",
    "enabled",
    "allowed_tools",
    "denied_tools",
    "max_credits_per_call",
    "max_daily_credits",
    "allowed_categories",
    "human_approval_required",
)


# The limits of the API's fields (``permits.serializers.PolicyRules``): a tool name or pattern is
# 1 to 200 characters; an amount has at most 8 decimal places and 12 whole digits (numeric(20, 8)).
TOOL_NAME_MAX_LENGTH = 200
POLICY_NAME_MAX_LENGTH = 200
_CREDITS_STEP = Decimal("0.00000001")
_CREDITS_LIMIT = Decimal(10) ** 12


def _text_problems(
    value: Any, loc: list[str | int], *, what: str, max_length: int, blank: bool
) -> list[dict[str, Any]]:
    if not isinstance(value, str):
        return [{"loc": loc, "msg": f"Expected {what} (a string).", "type": "string_type"}]
    try:
        check_storable(value, loc)
    except RequestValidationError as err:
        return list(err.errors)
    if not value and not blank:
        return [{"loc": loc, "msg": "This field may not be blank.", "type": "blank"}]
    if len(value) > max_length:
        return [
            {"loc": loc, "msg": f"Ensure this field has no more than {max_length} characters.", "type": "max_length"}
        ]
    return []


def _list_problems(value: Any, name: str, *, nullable: bool, item: str) -> list[dict[str, Any]]:
    if value is None and nullable:
        return []
    if not isinstance(value, list):
        null = " or null" if nullable else ""
        return [{"loc": [name], "msg": f"Expected a list of {item}s{null}.", "type": "list_type"}]
    problems: list[dict[str, Any]] = []
    for index, entry in enumerate(value):
        problems += _text_problems(entry, [name, index], what=item, max_length=TOOL_NAME_MAX_LENGTH, blank=False)
    return problems


def _credits_problems(value: Any, name: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, (Decimal, int)):
        return [{"loc": [name], "msg": "Expected an amount of credits, or null.", "type": "decimal_type"}]
    amount = Decimal(value)
    if not amount.is_finite():
        return [{"loc": [name], "msg": "Expected a finite amount of credits.", "type": "decimal_type"}]
    if amount < 0:
        return [{"loc": [name], "msg": "Ensure this value is greater than or equal to 0.", "type": "min_value"}]
    if amount >= _CREDITS_LIMIT or amount != amount.quantize(_CREDITS_STEP):
        msg = "Ensure there are no more than 12 digits before and 8 after the decimal point."
        return [{"loc": [name], "msg": msg, "type": "max_digits"}]
    return []


def policy_rules_problems(rules: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What is wrong with the policy rules in ``rules`` (only the keys present are checked), as
    HTTPValidationError items whose ``loc`` starts at the rule's name. Empty when they may be stored.

    The one rule for a policy's contents, for every path that writes one: the API's serializer,
    the console's form and ``policy_create``/``policy_update`` themselves. Authorization reads the
    stored rules at every governed call of the subtree, so a malformed one (``denied_tools: 5``,
    a tool list holding numbers) would break every call there rather than refuse one write.
    Tool lists hold tool names or patterns (``*``, ``prefix.*``), ``allowed_categories`` service
    categories; ``allowed_tools`` and ``allowed_categories`` may be null (any), ``denied_tools`` not.
    """
    problems: list[dict[str, Any]] = []
    if "name" in rules:
        problems += _text_problems(
            rules["name"], ["name"], what="a name", max_length=POLICY_NAME_MAX_LENGTH, blank=True
        )
    for name in ("enabled", "human_approval_required"):
        if name in rules and not isinstance(rules[name], bool):
            problems.append({"loc": [name], "msg": "Expected true or false.", "type": "bool_type"})
    if "allowed_tools" in rules:
        problems += _list_problems(rules["allowed_tools"], "allowed_tools", nullable=True, item="tool name")
    if "denied_tools" in rules:
        problems += _list_problems(rules["denied_tools"], "denied_tools", nullable=False, item="tool name")
    if "allowed_categories" in rules:
        categories = rules["allowed_categories"]
        shape = _list_problems(categories, "allowed_categories", nullable=True, item="service category")
        problems += shape
        if not shape and categories is not None:
            known = set(ServiceCategory.values)
            problems += [
                {
                    "loc": ["allowed_categories", index],
                    "msg": f"Unknown service category {category!r}: one of {', '.join(ServiceCategory.values)}.",
                    "type": "invalid_choice",
                }
                for index, category in enumerate(categories)
                if category not in known
            ]
    for name in ("max_credits_per_call", "max_daily_credits"):
        if name in rules:
            problems += _credits_problems(rules[name], name)
    return problems


def policy_rules_check(rules: Mapping[str, Any]) -> None:
    """422 (``loc: ["body", <rule>, ...]``) when ``policy_rules_problems`` finds anything in ``rules``."""
    problems = policy_rules_problems(rules)
    if problems:
        raise RequestValidationError([{**p, "loc": ["body", *p["loc"]]} for p in problems])


def _policy_snapshot(policy: PolicyBundle) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in POLICY_FIELDS:
        value = getattr(policy, name)
        out[name] = money(value) if isinstance(value, Decimal) else value
    return out


@transaction.atomic(durable=True)
def policy_create(
    *, wallet: Wallet, actor_key_id: str = "", actor_wallet_id: str = "", actor: str = "", **rules: Any
) -> PolicyBundle:
    """Attach a policy bundle to ``wallet``; it applies to the wallet and every wallet below it.

    ``actor_wallet_id`` is the wallet of the creating key (empty for the operator): it
    records the level the policy was set at, which decides who may change it later
    (``permits.selectors.policy_for_change``). The rules are checked first (``policy_rules_check``).
    """
    rules = {k: v for k, v in rules.items() if k in POLICY_FIELDS}
    policy_rules_check(rules)
    policy = PolicyBundle(
        policy_id=new_id("pol"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        created_by_key_id=actor_key_id,
        created_by_wallet_id=actor_wallet_id,
        authority_wallet_id=actor_wallet_id,
        **rules,
    )
    approval = requires_approval(policy)
    if approval:
        approval_lock(wallet.tenant_id, shared=False)
    policy.save(force_insert=True)
    revoked = revoke_unapproved(policy, actor_key_id=actor_key_id, actor=actor) if approval else []
    policy.permits_revoked = tuple(revoked)
    audit_record(
        event="policy.created",
        ok=True,
        tenant_id=wallet.tenant_id,
        wallet_id=wallet.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/policies",
        detail={
            "policy_id": policy.policy_id,
            "rules": _policy_snapshot(policy),
            **({"permits_revoked": revoked} if revoked else {}),
            **({"actor": actor} if actor else {}),
        },
    )
    return policy


@transaction.atomic(durable=True)
def policy_update(
    *, policy_id: str, actor_key_id: str = "", actor_wallet_id: str = "", actor: str = "", **changes: Any
) -> PolicyBundle:
    """Change some rules of a policy bundle; bumps its version. Locks the row first.

    ``actor_wallet_id`` is the wallet of the changing key (empty for the operator and the console),
    which the caller has checked may change it (``permits.selectors.policy_for_change``: the
    policy's level or above). The policy's level becomes the changer's: a sponsor that tightens a
    policy its agent set on itself takes it over, and the agent can no longer undo the change. The
    level is checked again on the locked row (403 ``policy_read_only``): a change from above that
    committed while this one waited for the lock stands. The changed rules are checked before the
    lock (``policy_rules_check``).
    """
    policy_rules_check({k: v for k, v in changes.items() if k in POLICY_FIELDS})
    if changes.get("human_approval_required") is True or changes.get("enabled") is True:
        # Before the policy's row lock: the order every approval-lock holder takes (permit_issue holds no
        # policy row). Taken whenever the change may start requiring approval; judged below.
        tenant_id = PolicyBundle.objects.filter(policy_id=policy_id).values_list("tenant_id", flat=True).first()
        if tenant_id is not None:
            approval_lock(tenant_id, shared=False)
    policy = PolicyBundle.objects.select_for_update(no_key=True).get(policy_id=policy_id)
    required_before = requires_approval(policy)
    if actor_wallet_id:
        check_policy_level(policy, actor_wallet_id)
    before = _policy_snapshot(policy)
    authority_before = policy.authority_wallet_id
    fields = [k for k in changes if k in POLICY_FIELDS]
    for name in fields:
        setattr(policy, name, changes[name])
    policy.authority_wallet_id = actor_wallet_id
    policy.version += 1
    policy.save(update_fields=[*fields, "authority_wallet_id", "version", "updated_at"])
    revoked = (
        revoke_unapproved(policy, actor_key_id=actor_key_id, actor=actor)
        if requires_approval(policy) and not required_before
        else []
    )
    policy.permits_revoked = tuple(revoked)
    audit_record(
        event="policy.updated",
        ok=True,
        tenant_id=policy.tenant_id,
        wallet_id=policy.wallet_id,
        key_id=actor_key_id or None,
        endpoint="/v1/policies/{policy_id}",
        detail={
            "policy_id": policy.policy_id,
            "before": before,
            "after": _policy_snapshot(policy),
            **(
                {"authority_before": authority_before, "authority_after": policy.authority_wallet_id}
                if policy.authority_wallet_id != authority_before
                else {}
            ),
            **({"permits_revoked": revoked} if revoked else {}),
            **({"actor": actor} if actor else {}),
        },
    )
    return policy
