"""The error catalogue: every domain failure's code and HTTP status as clients see them, rendered in the
one shape ``{"detail": {"error": code, "message": ...}}`` (docs/architecture.md, "HTTP contract").

A change to how the exception classes are declared (their bases, where they live) changes none of this;
a new failure is added here with its code and status.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from common.errors import ApplicationError, exception_handler

# The modules that declare failures (besides common.errors).
MODULES = (
    "access.exceptions",
    "audit.exceptions",
    "billing.exceptions",
    "mcpgateway.exceptions",
    "mcpgateway.services.upstreams",
    "mcpgateway.transports",
    "permits.exceptions",
    "permits.views",
    "receipts.services",
    "tlog.exceptions",
)

CATALOGUE = {
    "APIKeyLimitReached": ("api_key_limit_reached", 409),
    "AncestorKeyRotation": ("ancestor_key_rotation", 403),
    "SigningKeyRetired": ("signing_key_retired", 503),
    "SigningKeyUnavailable": ("signing_key_unavailable", 503),
    "BudgetExceeded": ("budget_exceeded", 403),
    "ChargePolicyDenied": ("policy_denied", 403),
    "DailyLimitExceeded": ("daily_limit_exceeded", 403),
    "InsufficientFunds": ("insufficient_funds", 402),
    "RefundExceedsCharge": ("refund_exceeds_charge", 409),
    "SpendRefused": ("spend_refused", 403),
    "VelocityLimitExceeded": ("wallet_frozen", 403),
    "WalletClosed": ("wallet_closed", 403),
    "WalletExpired": ("wallet_expired", 403),
    "WalletFrozen": ("wallet_frozen", 403),
    "WalletHasOpenCalls": ("wallet_has_open_calls", 409),
    "WalletHasOpenChildren": ("wallet_has_open_children", 409),
    "WalletLimitRaiseDenied": ("wallet_limit_raise_denied", 403),
    "WalletNotActive": ("wallet_not_active", 409),
    "Conflict": ("conflict", 409),
    "IdempotencyKeyInProgress": ("idempotency_key_in_progress", 409),
    "InternalError": ("internal_error", 500),
    "InvalidAPIKey": ("invalid_api_key", 401),
    "NotAuthenticated": ("not_authenticated", 401),
    "NotFound": ("not_found", 404),
    "OperatorKeyRequired": ("operator_key_required", 403),
    "PayloadTooLarge": ("payload_too_large", 413),
    "PermissionDeniedError": ("permission_denied", 403),
    "RateLimited": ("rate_limited", 429),
    "TransactionConflict": ("transaction_conflict", 409),
    "WalletAccessDenied": ("wallet_access_denied", 403),
    "WalletKeyRequired": ("wallet_key_required", 403),
    "ToolSchemaUnusable": ("tool_schema_unusable", 422),
    "UpstreamCredentialsMissing": ("upstream_credentials_missing", 403),
    "UpstreamCredentialsRejected": ("upstream_credentials_unavailable", 502),
    "UpstreamCredentialsUnavailable": ("upstream_credentials_unavailable", 503),
    "UpstreamServerConflict": ("upstream_server_conflict", 409),
    "UpstreamServerDisabled": ("upstream_server_disabled", 403),
    "UpstreamServerNotAllowed": ("upstream_server_not_allowed", 403),
    "UpstreamServerNotFound": ("upstream_server_not_found", 404),
    "UpstreamSyncFailed": ("upstream_sync_failed", 502),
    "MethodNotAllowed": ("method_not_allowed", 405),
    "OriginNotAllowed": ("origin_not_allowed", 403),
    "ApprovalRelaxationNeedsConfirmation": ("approval_relaxation_needs_confirmation", 409),
    "ConfirmationNotAllowed": ("policy_confirmation_not_allowed", 403),
    "HumanApprovalRequired": ("human_approval_required", 403),
    "IssuerNotAllowed": ("issuer_not_allowed", 403),
    "NotAnApprover": ("not_an_approver", 403),
    "OwnProposal": ("policy_proposal_own", 403),
    "PermitDenied": ("permit_denied", 403),
    "PermitExhausted": ("permit_exhausted", 403),
    "PermitExpired": ("permit_expired", 403),
    "PermitKeyMismatch": ("permit_key_mismatch", 403),
    "PermitNotFound": ("permit_not_found", 403),
    "PermitRequestLimitReached": ("permit_request_limit_reached", 409),
    "PermitRevoked": ("permit_revoked", 403),
    "PermitSignatureInvalid": ("permit_signature_invalid", 403),
    "PermitWalletMismatch": ("permit_wallet_mismatch", 403),
    "PolicyDenied": ("policy_denied", 403),
    "PolicyReadOnly": ("policy_read_only", 403),
    "ProposalDecided": ("policy_proposal_decided", 409),
    "ProposalExpired": ("policy_proposal_expired", 409),
    "ProposalNotFound": ("policy_proposal_not_found", 404),
    "ProposalStale": ("policy_proposal_stale", 409),
    "QuoteUnavailable": ("quote_unavailable", 409),
    "RequestAlreadyDecided": ("permit_request_decided", 409),
    "RequestExpired": ("permit_request_expired", 409),
    "RequestTermsChanged": ("permit_request_changed", 409),
    "ServerNotPermitted": ("server_not_permitted", 403),
    "ToolNotPermitted": ("tool_not_permitted", 403),
    "WalletNotFound": ("wallet_not_found", 404),
    "ReceiptTampered": ("receipt_statement_mismatch", 409),
    "ReconciliationDecided": ("reconciliation_decided", 409),
    "RefundNotOwed": ("refund_not_owed", 409),
    "LogNotFound": ("not_found", 404),
    "StatementNotLogged": ("not_found", 404),
    "TileNotFound": ("not_found", 404),
}


def _failures(cls: type[ApplicationError]) -> Iterator[type[ApplicationError]]:
    for sub in cls.__subclasses__():
        if not sub.__module__.startswith("tests."):
            yield sub
            yield from _failures(sub)


@pytest.fixture(scope="module")
def failures() -> dict[str, type[ApplicationError]]:
    for module in MODULES:
        importlib.import_module(module)
    return {cls.__name__: cls for cls in _failures(ApplicationError)}


def test_every_failure_keeps_its_code_and_status(failures: dict[str, type[ApplicationError]]) -> None:
    assert {name: (cls.code, cls.http_status) for name, cls in failures.items()} == CATALOGUE


def test_every_failure_renders_in_the_one_shape(failures: dict[str, type[ApplicationError]]) -> None:
    plain = [cls for cls in failures.values() if "__init__" not in vars(cls)]  # the ones built with no figures
    assert len(plain) > 60
    for cls in plain:
        response = exception_handler(cls(), {})
        assert (response.status_code, response.data) == (
            cls.http_status,
            {"detail": {"error": cls.code, "message": cls.message}},
        ), cls
        assert cls.message, cls
