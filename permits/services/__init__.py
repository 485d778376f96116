"""Authority writes: permits, allowance reservations, permit requests, quotes, policies.

One module per entity: ``permits`` (issue, revoke, the signed statement's check at use, the
allowance reservation), ``authorization`` (``authorize``), ``permit_requests`` (requests, their
approvers and the human decision), ``quotes`` and ``policies``. This package names their public
services, so callers import from ``permits.services``.

Every service that changes state owns its transaction and writes its audit
event inside it as the last statement. The building blocks the gateway runs in
its own phase-1 transaction (``permit_reserve``, ``permit_release``,
``quote_consume``, ``authorize``) say so and take no transaction of their own.
"""

from permits.services.approval import human_approval_required
from permits.services.approval_record import (
    approval_statement_problem,
    permit_approval_of,
    permit_approval_problem,
    permit_approval_standing,
    permit_signed_approval,
)
from permits.services.authorization import (
    WILDCARD,
    DailyCap,
    Decision,
    PolicyVerdict,
    authorize,
    daily_caps_record,
    policy_daily_cap_refusal,
    policy_rule_refusal,
    policy_verdict_from_json,
    policy_verdict_read,
    policy_verdict_sql,
    tool_allowed,
)
from permits.services.notifications import (
    approver_reachability,
    tenant_notification_set,
    webhook_deliver_due,
    webhook_signature,
)
from permits.services.permit_requests import (
    PERMIT_REQUEST_LIFETIME,
    RequestCreate,
    approval_url,
    permit_request_create,
    permit_request_decide,
    permit_request_notify,
    permit_request_terms,
    tenant_approver_add,
    tenant_approver_remove,
    user_is_approver,
)
from permits.services.permits import (
    PERMIT_SIGNED_FIELDS,
    PermitIssue,
    PermitTerms,
    permit_issue,
    permit_release,
    permit_reservation_record,
    permit_reserve,
    permit_reserve_refusal,
    permit_revoke,
    permit_statement_problem,
)
from permits.services.policies import (
    POLICY_FIELDS,
    PolicyChange,
    approval_relaxation,
    policy_change,
    policy_create,
    policy_proposal_confirm,
    policy_proposal_reject,
    policy_update,
)
from permits.services.quotes import (
    QUOTE_LIFETIME,
    quote_check,
    quote_consume,
    quote_consumption_record,
    quote_create,
    quote_statement_problem,
)

__all__ = [
    "PERMIT_REQUEST_LIFETIME",
    "PERMIT_SIGNED_FIELDS",
    "POLICY_FIELDS",
    "QUOTE_LIFETIME",
    "WILDCARD",
    "DailyCap",
    "Decision",
    "PermitIssue",
    "PermitTerms",
    "PolicyChange",
    "PolicyVerdict",
    "RequestCreate",
    "approval_relaxation",
    "approval_statement_problem",
    "approval_url",
    "approver_reachability",
    "authorize",
    "daily_caps_record",
    "human_approval_required",
    "permit_approval_of",
    "permit_approval_problem",
    "permit_approval_standing",
    "permit_issue",
    "permit_release",
    "permit_request_create",
    "permit_request_decide",
    "permit_request_notify",
    "permit_request_terms",
    "permit_reservation_record",
    "permit_reserve",
    "permit_reserve_refusal",
    "permit_revoke",
    "permit_signed_approval",
    "permit_statement_problem",
    "policy_change",
    "policy_create",
    "policy_daily_cap_refusal",
    "policy_proposal_confirm",
    "policy_proposal_reject",
    "policy_rule_refusal",
    "policy_update",
    "policy_verdict_from_json",
    "policy_verdict_read",
    "policy_verdict_sql",
    "quote_check",
    "quote_consume",
    "quote_consumption_record",
    "quote_create",
    "quote_statement_problem",
    "tenant_approver_add",
    "tenant_approver_remove",
    "tenant_notification_set",
    "tool_allowed",
    "user_is_approver",
    "webhook_deliver_due",
    "webhook_signature",
]
