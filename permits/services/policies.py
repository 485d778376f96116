"""Policy bundles: creating and changing them (each owns its transaction and is audited); one that
starts requiring human approval revokes the permits no human approved (``approval``). A change that
relaxes human approval (``approval_relaxation``) is a proposal a second person confirms in the console
(``policy_change``, ``policy_proposal_confirm``): docs/decisions.md, "Operator console".

A policy applies to the wallet it is attached to and every wallet below it. What authorization
reads of the policies, and how, is ``permits.services.authorization``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from access.models import APIKey
from audit.models import AuditEvent
from billing.exceptions import money
from billing.models import ServiceCategory, Wallet
from common.errors import RequestValidationError
from common.ids import new_id
from common.jsonbody import check_storable
from permits.exceptions import (
    ApprovalRelaxationNeedsConfirmation,
    ConfirmationNotAllowed,
    OwnProposal,
    ProposalDecided,
    ProposalExpired,
    ProposalNotFound,
    ProposalStale,
)
from permits.models import POLICY_FIELDS, PolicyBundle, PolicyChangeProposal, ProposalStatus
from permits.selectors import check_policy_level
from permits.services.approval import approval_lock, requires_approval, revoke_unapproved
from permits.services.rows import wallet_row_audit

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
    if "allowed_servers" in rules:
        problems += _list_problems(rules["allowed_servers"], "allowed_servers", nullable=True, item="server slug")
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
    *,
    wallet: Wallet,
    actor_key_id: str = "",
    actor_wallet_id: str = "",
    actor: str = "",
    endpoint: str = "/v1/policies",
    **rules: Any,
) -> PolicyBundle:
    """Attach a policy bundle to ``wallet``; it applies to the wallet and every wallet below it.

    ``endpoint`` is where the change came from, as audited (the console passes its own page's path).

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
    wallet_row_audit(
        "policy.created",
        policy,
        key_id=actor_key_id or None,
        actor=actor,
        endpoint=endpoint,
        detail={
            "policy_id": policy.policy_id,
            "rules": _policy_snapshot(policy),
            **({"permits_revoked": revoked} if revoked else {}),
        },
    )
    return policy


_CREDIT_FIELDS = ("max_credits_per_call", "max_daily_credits")


def approval_relaxation(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """The rules whose change from ``before`` to ``after`` relaxes human approval; empty when none does.

    ``before`` and ``after`` are a policy's rules (``POLICY_FIELDS``); ``before`` is None for a policy
    being created. The one rule for every path that changes a policy (``policy_update``,
    ``policy_change``, ``policy_proposal_confirm``; the API and the console call these).

    A policy that requires human approval (``human_approval_required`` on an enabled policy) is the
    rule a human's approval was meant to gate: while it binds a wallet's line, no wallet key issues that
    wallet a permit (``permits.services.approval.human_approval_required``), and its limits bound what
    even an approved permit may do. A change to such a policy relaxes approval when it

    - stops requiring it: ``human_approval_required`` off, or the policy disabled;
    - raises its threshold: a higher ``max_credits_per_call`` or ``max_daily_credits``, or one removed;
    - widens its tools, categories or servers: ``allowed_tools``, ``allowed_categories`` or
      ``allowed_servers`` gaining a name or removed (null: any), ``denied_tools`` losing a name.

    Those are the names returned. A policy that does not require approval before the change relaxes
    nothing (turning approval on, and any change made together with it, tightens). A new policy never
    relaxes: every enabled policy of the line binds, so one created below (or anywhere) cannot lift one
    above. No path deletes a policy or moves it to another wallet.
    """
    if before is None:
        return []

    def requires(rules: Mapping[str, Any]) -> bool:
        return bool(rules.get("enabled")) and bool(rules.get("human_approval_required"))

    if not requires(before):
        return []
    relaxed = [
        name
        for name in ("enabled", "human_approval_required")
        if not requires(after) and before.get(name) != after.get(name)
    ]
    for name in _CREDIT_FIELDS:
        old, new = before.get(name), after.get(name)
        if old is not None and (new is None or Decimal(str(new)) > Decimal(str(old))):
            relaxed.append(name)
    for name in ("allowed_tools", "allowed_categories", "allowed_servers"):
        old, new = before.get(name), after.get(name)
        if old is not None and (new is None or not set(new) <= set(old)):
            relaxed.append(name)
    if not set(before.get("denied_tools") or ()) <= set(after.get("denied_tools") or ()):
        relaxed.append("denied_tools")
    return relaxed


@dataclass(frozen=True)
class PolicyChange:
    """What ``policy_change`` did: ``policy`` as it is now, and ``proposal`` when the change relaxes
    human approval (the policy is then unchanged until a second person confirms it)."""

    policy: PolicyBundle
    proposal: PolicyChangeProposal | None


def _rules(policy: PolicyBundle) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in POLICY_FIELDS}


def _json_rules(rules: Mapping[str, Any]) -> dict[str, Any]:
    return {name: money(value) if isinstance(value, Decimal) else value for name, value in rules.items()}


def _lock_policy(policy_id: str, changes: Mapping[str, Any]) -> PolicyBundle:
    """The policy's row, locked; before it, the tenant's approval lock whenever the change may start
    requiring approval: the order every approval-lock holder takes (``permit_issue`` holds no policy
    row). Whether the change does start requiring it is judged on the locked row."""
    if changes.get("human_approval_required") is True or changes.get("enabled") is True:
        tenant_id = PolicyBundle.objects.filter(policy_id=policy_id).values_list("tenant_id", flat=True).first()
        if tenant_id is not None:
            approval_lock(tenant_id, shared=False)
    return PolicyBundle.objects.select_for_update(no_key=True).get(policy_id=policy_id)


def _lock_for_change(
    policy_id: str, changes: Mapping[str, Any], *, actor_wallet_id: str
) -> tuple[PolicyBundle, dict[str, Any], dict[str, Any], list[str]]:
    """The first steps of ``policy_update`` and ``policy_change``: the changed rules checked
    (``policy_rules_check``, before any lock), the policy's row locked (``_lock_policy``), the
    changer's level checked on it when ``actor_wallet_id`` is a wallet's (403 ``policy_read_only``).
    Returns the locked policy, its rules before the change, the changed rules and what the change
    relaxes (``approval_relaxation``, judged on the locked row)."""
    rules = {k: v for k, v in changes.items() if k in POLICY_FIELDS}
    policy_rules_check(rules)
    policy = _lock_policy(policy_id, changes)
    if actor_wallet_id:
        check_policy_level(policy, actor_wallet_id)
    before = _rules(policy)
    return policy, before, rules, approval_relaxation(before, {**before, **rules})


def _apply_locked(
    policy: PolicyBundle,
    changes: Mapping[str, Any],
    *,
    actor_key_id: str,
    actor_wallet_id: str,
    actor: str,
    proposal: PolicyChangeProposal | None = None,
    endpoint: str = "/v1/policies/{policy_id}",
) -> PolicyBundle:
    """Write ``changes`` to ``policy`` (its row locked by the caller, its level checked) and audit it.

    A policy that starts requiring approval revokes the unapproved permits of its subtree; the
    policy's other pending proposals are superseded (they were made against the rules this replaces).
    """
    required_before = requires_approval(policy)
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
    pending = PolicyChangeProposal.objects.filter(policy=policy, status=ProposalStatus.PENDING)
    if proposal is not None:
        pending = pending.exclude(pk=proposal.pk)
    superseded = sorted(pending.values_list("proposal_id", flat=True))
    if superseded:
        pending.update(status=ProposalStatus.SUPERSEDED, decided_at=timezone.now())
    wallet_row_audit(
        "policy.updated",
        policy,
        key_id=actor_key_id or None,
        actor=actor,
        endpoint=endpoint,
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
            **({"proposal_id": proposal.proposal_id, "proposed_by": proposal.proposed_by} if proposal else {}),
            **({"proposals_superseded": superseded} if superseded else {}),
        },
    )
    return policy


@transaction.atomic(durable=True)
def policy_update(
    *,
    policy_id: str,
    actor_key_id: str = "",
    actor_wallet_id: str = "",
    actor: str = "",
    endpoint: str = "/v1/policies/{policy_id}",
    **changes: Any,
) -> PolicyBundle:
    """Change some rules of a policy bundle; bumps its version. Locks the row first.

    ``actor_wallet_id`` is the wallet of the changing key (empty for the operator and the console),
    which the caller has checked may change it (``permits.selectors.policy_for_change``: the
    policy's level or above). The policy's level becomes the changer's: a sponsor that tightens a
    policy its agent set on itself takes it over, and the agent can no longer undo the change. The
    level is checked again on the locked row (403 ``policy_read_only``): a change from above that
    committed while this one waited for the lock stands. The changed rules are checked before the
    lock (``policy_rules_check``).

    A change that relaxes human approval (``approval_relaxation``, judged on the locked row) is
    refused (409 ``approval_relaxation_needs_confirmation``, nothing written): it is made through
    ``policy_change`` (a proposal) and ``policy_proposal_confirm`` (a second person).
    """
    policy, _, _, relaxes = _lock_for_change(policy_id, changes, actor_wallet_id=actor_wallet_id)
    if relaxes:
        raise ApprovalRelaxationNeedsConfirmation(policy_id=policy.policy_id, relaxes=relaxes)
    return _apply_locked(
        policy, changes, actor_key_id=actor_key_id, actor_wallet_id=actor_wallet_id, actor=actor, endpoint=endpoint
    )


def _console_users_behind_key(key_id: str) -> list[str]:
    """The usernames of the console users who minted ``key_id`` or a key above it in its line (the
    keys that minted it, through ``created_by_key_id``): read from the audit chain's
    ``api_key.created`` / ``api_key.operator_created`` events, whose ``actor`` is ``admin:<username>``.
    Whoever holds such a key, its minter saw the secret; they cannot be the second person."""
    line: list[str] = []
    current = key_id
    while current and current not in line and len(line) < 64:
        line.append(current)
        current = APIKey.objects.filter(key_id=current).values_list("created_by_key_id", flat=True).first() or ""
    actors = AuditEvent.objects.filter(
        event__in=["api_key.created", "api_key.operator_created"], detail__new_key_id__in=line
    ).values_list("detail__actor", flat=True)
    return sorted({a.removeprefix("admin:") for a in actors if isinstance(a, str) and a.startswith("admin:")})


@transaction.atomic(durable=True)
def policy_change(
    *,
    policy_id: str,
    actor_key_id: str = "",
    actor_wallet_id: str = "",
    actor: str = "",
    user: Any = None,
    endpoint: str = "/v1/policies/{policy_id}",
    **changes: Any,
) -> PolicyChange:
    """Change some rules of a policy bundle, as ``policy_update`` does, unless the change relaxes
    human approval: then record a ``PolicyChangeProposal`` (nothing else changes) that a second
    person confirms in the console (``policy_proposal_confirm``). The API and the console call this.

    The proposer is ``user`` (a console user; ``actor`` is then ``admin:<username>``) or the key
    ``actor_key_id`` of wallet ``actor_wallet_id``. The decision is made on the locked row, after the
    level check, so the policy a proposal names is the one its version records. The proposal holds
    every rule the change alters, tightening ones included: the confirmer confirms the change as a
    whole. The same proposer asking for the same change of the same version again gets the pending
    proposal back (a retried request makes no second one). Audited ``policy.relaxation_proposed``.
    """
    policy, before, rules, relaxes = _lock_for_change(policy_id, changes, actor_wallet_id=actor_wallet_id)
    if not relaxes:
        applied = _apply_locked(
            policy, changes, actor_key_id=actor_key_id, actor_wallet_id=actor_wallet_id, actor=actor, endpoint=endpoint
        )
        return PolicyChange(policy=applied, proposal=None)
    altered = {k: v for k, v in rules.items() if v != before[k]}
    proposed_by = actor if user is not None else actor_key_id
    now = timezone.now()
    existing = (
        PolicyChangeProposal.objects.filter(
            policy=policy,
            status=ProposalStatus.PENDING,
            expires_at__gt=now,
            proposed_by=proposed_by,
            policy_version=policy.version,
            changes=_json_rules(altered),
        )
        .order_by("created_at")
        .first()
    )
    if existing is not None:
        return PolicyChange(policy=policy, proposal=existing)
    excluded = _console_users_behind_key(actor_key_id) if actor_key_id else []
    if user is not None:
        excluded = sorted({*excluded, user.get_username()})
    proposal = PolicyChangeProposal.objects.create(
        proposal_id=new_id("pcp"),
        tenant_id=policy.tenant_id,
        policy=policy,
        changes=_json_rules(altered),
        before=_json_rules({k: before[k] for k in altered}),
        relaxes=relaxes,
        policy_version=policy.version,
        proposed_by=proposed_by,
        proposed_by_user=user,
        proposed_by_key_id=actor_key_id,
        proposer_wallet_id=actor_wallet_id,
        excluded_confirmers=excluded,
        created_at=now,
        expires_at=now + timedelta(hours=settings.POLICY_PROPOSAL_TTL_HOURS),
    )
    wallet_row_audit(
        "policy.relaxation_proposed",
        policy,
        key_id=actor_key_id or None,
        actor=actor,
        endpoint=endpoint,
        detail={
            "policy_id": policy.policy_id,
            "proposal_id": proposal.proposal_id,
            "policy_version": policy.version,
            "relaxes": relaxes,
            "before": proposal.before,
            "changes": proposal.changes,
            "expires_at": proposal.expires_at.isoformat(),
        },
    )
    return PolicyChange(policy=policy, proposal=proposal)


def _proposal_for_decision(
    proposal_id: str, user: Any, *, proposer_may: bool
) -> tuple[PolicyChangeProposal, PolicyBundle]:
    """The proposal and its policy, both locked (the policy first, as every policy write takes it),
    once ``user`` may decide it: 404 unknown, 403 without the permission (unless ``proposer_may`` and
    ``user`` proposed it), 409 no longer pending."""
    found = (
        PolicyChangeProposal.objects.filter(proposal_id=proposal_id)
        .values_list("policy_id", "changes", "proposed_by_user_id")
        .first()
    )
    if found is None:
        raise ProposalNotFound(proposal_id=proposal_id)
    policy_id, changes, proposer_pk = found
    own = proposer_pk is not None and proposer_pk == user.pk
    if not user.has_perm("permits.confirm_policy_relaxation") and not (proposer_may and own):
        raise ConfirmationNotAllowed(proposal_id=proposal_id)
    policy = _lock_policy(policy_id, changes)
    proposal = PolicyChangeProposal.objects.select_for_update(no_key=True).get(proposal_id=proposal_id)
    if proposal.status != ProposalStatus.PENDING:
        raise ProposalDecided(proposal_id=proposal_id, status=proposal.status)
    return proposal, policy


def _proposal_decided(
    proposal: PolicyChangeProposal,
    policy: PolicyBundle,
    status: ProposalStatus,
    *,
    event: str,
    user: Any,
    actor: str,
    now: datetime,
    detail: dict[str, Any],
) -> None:
    """Record ``user``'s decision (``status``) on the locked ``proposal``, audited ``event`` with
    ``detail`` after the proposal's names (the confirmation's and the rejection's last steps)."""
    proposal.status = status
    proposal.decided_at = now
    proposal.decided_by = user
    proposal.save(update_fields=["status", "decided_at", "decided_by"])
    wallet_row_audit(
        event,
        policy,
        endpoint="/admin/permits/policychangeproposal/",
        detail={
            "policy_id": policy.policy_id,
            "proposal_id": proposal.proposal_id,
            "proposed_by": proposal.proposed_by,
            **detail,
            "actor": actor,
        },
    )


def _proposed_rules(proposal: PolicyChangeProposal) -> dict[str, Any]:
    return {
        name: Decimal(value) if name in _CREDIT_FIELDS and value is not None else value
        for name, value in proposal.changes.items()
    }


@transaction.atomic(durable=True)
def policy_proposal_confirm(*, proposal_id: str, user: Any, actor: str) -> PolicyBundle:
    """Apply a pending proposal relaxing human approval: the second person's step.

    Guarantees, checked under the policy's and the proposal's row locks: ``user`` holds
    ``permits.confirm_policy_relaxation`` (403 ``policy_confirmation_not_allowed``) and is neither
    the proposer nor a console user who minted the proposing key's line (403 ``policy_proposal_own``,
    superusers included); the proposal is pending (409 ``policy_proposal_decided``) and not expired
    (409 ``policy_proposal_expired``); the policy is still at the version proposed and the change
    still relaxes what was proposed (409 ``policy_proposal_stale``): the confirmer confirms what
    they were shown. The change is then written as ``policy_update`` writes one (the same locked
    steps, the proposer's key and level, ``actor`` the confirmer) and audited
    ``policy.relaxation_confirmed``.
    """
    proposal, policy = _proposal_for_decision(proposal_id, user, proposer_may=False)
    if proposal.proposed_by_user_id == user.pk or user.get_username() in proposal.excluded_confirmers:
        raise OwnProposal(proposal_id=proposal_id)
    now = timezone.now()
    if proposal.expires_at <= now:
        raise ProposalExpired(proposal_id=proposal_id, expires_at=proposal.expires_at.isoformat())
    changes = _proposed_rules(proposal)
    before = _rules(policy)
    still_relaxes = approval_relaxation(before, {**before, **changes})
    if policy.version != proposal.policy_version or still_relaxes != list(proposal.relaxes):
        raise ProposalStale(proposal_id=proposal_id, policy_version=policy.version)
    if proposal.proposer_wallet_id:
        check_policy_level(policy, proposal.proposer_wallet_id)
    _apply_locked(
        policy,
        changes,
        actor_key_id=proposal.proposed_by_key_id,
        actor_wallet_id=proposal.proposer_wallet_id,
        actor=actor,
        proposal=proposal,
        endpoint="/admin/permits/policychangeproposal/",
    )
    _proposal_decided(
        proposal,
        policy,
        ProposalStatus.CONFIRMED,
        event="policy.relaxation_confirmed",
        user=user,
        actor=actor,
        now=now,
        detail={"relaxes": proposal.relaxes, "changes": proposal.changes},
    )
    return policy


@transaction.atomic(durable=True)
def policy_proposal_reject(*, proposal_id: str, user: Any, actor: str) -> PolicyChangeProposal:
    """Reject a pending proposal (the policy stays as it is). Needs the confirmation permission
    (403); the proposer may reject their own (withdrawing relaxes nothing). 409 when it is no longer
    pending. Audited ``policy.relaxation_rejected``."""
    proposal, policy = _proposal_for_decision(proposal_id, user, proposer_may=True)
    _proposal_decided(
        proposal,
        policy,
        ProposalStatus.REJECTED,
        event="policy.relaxation_rejected",
        user=user,
        actor=actor,
        now=timezone.now(),
        detail={},
    )
    return proposal
