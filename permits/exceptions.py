"""Authority failures, one class per domain failure."""

from __future__ import annotations

from common.errors import Conflict, NotFound, PermissionDeniedError


class PermitDenied(PermissionDeniedError):
    """Base for a tool call refused by its permit or a policy."""

    code = "permit_denied"
    message = "The permit does not authorize this call."


class PermitNotFound(PermitDenied):
    code = "permit_not_found"
    message = "No such permit for this wallet."


class PermitRevoked(PermitDenied):
    code = "permit_revoked"
    message = "The permit has been revoked."


class PermitExpired(PermitDenied):
    code = "permit_expired"
    message = "The permit has expired."


class PermitExhausted(PermitDenied):
    code = "permit_exhausted"
    message = "The permit's allowance cannot cover this call."


class PermitWalletMismatch(PermitDenied):
    code = "permit_wallet_mismatch"
    message = "The permit was issued for another wallet."


class PermitKeyMismatch(PermitDenied):
    code = "permit_key_mismatch"
    message = "The permit is bound to another API key."


class ToolNotPermitted(PermitDenied):
    code = "tool_not_permitted"
    message = "The permit does not allow this tool."


class ServerNotPermitted(PermitDenied):
    """The permit names the upstream servers it covers (``allowed_servers``) and the tool's is not one."""

    code = "server_not_permitted"
    message = "The permit does not allow the upstream server of this tool."


class PermitSignatureInvalid(PermitDenied):
    code = "permit_signature_invalid"
    message = "The permit's signature does not verify."


class PolicyDenied(PermitDenied):
    code = "policy_denied"
    message = "A policy bundle denies this call."


class PolicyReadOnly(PermissionDeniedError):
    code = "policy_read_only"
    message = (
        "This policy was set above the caller's level and binds it: only the operator or a key "
        "at or above the level that set it may change it."
    )


class HumanApprovalRequired(PermissionDeniedError):
    code = "human_approval_required"
    message = (
        "A policy requires human approval for permits of this wallet: ask through POST /v1/permit-requests instead."
    )


class IssuerNotAllowed(PermissionDeniedError):
    code = "issuer_not_allowed"
    message = "The issuer must be the subject wallet or a wallet above it."


class RequestAlreadyDecided(Conflict):
    code = "permit_request_decided"
    message = "This permit request has already been decided."


class RequestTermsChanged(Conflict):
    code = "permit_request_changed"
    message = "This permit request's terms changed after the page was shown: review it again before approving."


class RequestExpired(Conflict):
    code = "permit_request_expired"
    message = "This permit request has expired and can no longer be approved."


class PermitRequestLimitReached(Conflict):
    """The wallet line has ``PERMIT_REQUESTS_PENDING_PER_WALLET`` pending requests awaiting the approvers."""

    code = "permit_request_limit_reached"
    message = (
        "The wallet has as many permit requests awaiting a decision as it may have: wait for the approvers "
        "to decide one, or for one to expire."
    )


class QuoteUnavailable(Conflict):
    code = "quote_unavailable"
    message = "The quote is not active (consumed, expired or for another wallet or tool)."


class NotAnApprover(PermissionDeniedError):
    code = "not_an_approver"
    message = "You are not an approver for this tenant."


class ApprovalRelaxationNeedsConfirmation(Conflict):
    code = "approval_relaxation_needs_confirmation"
    message = (
        "This change relaxes human approval: it takes effect only as a proposal a second person "
        "confirms in the console (policy_change)."
    )


class ProposalNotFound(NotFound):
    code = "policy_proposal_not_found"
    message = "No such policy change proposal."


class ProposalDecided(Conflict):
    code = "policy_proposal_decided"
    message = "This proposal has already been confirmed, rejected or superseded by a later change."


class ProposalExpired(Conflict):
    code = "policy_proposal_expired"
    message = "This proposal has expired and can no longer be confirmed: propose the change again."


class ProposalStale(Conflict):
    code = "policy_proposal_stale"
    message = "The policy changed after this proposal was made: it can no longer be confirmed as shown."


class OwnProposal(PermissionDeniedError):
    code = "policy_proposal_own"
    message = (
        "A relaxation of human approval is confirmed by a second person: not its proposer, nor a console "
        "user who minted the proposing key."
    )


class ConfirmationNotAllowed(PermissionDeniedError):
    code = "policy_confirmation_not_allowed"
    message = "Confirming or rejecting a relaxation of human approval needs the 'confirm policy relaxation' permission."
