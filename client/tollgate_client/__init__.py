"""Typed Python client for Tollgate, the transaction-integrity gateway for MCP tool calls made by agents.

    from tollgate_client import TollgateClient

    with TollgateClient("https://gateway.example", api_key) as tg:
        permit = tg.permits.issue(agent_wallet_id, ["notes.*"], "5")
        ...

See ``client/README.md`` for the whole tour.
"""

from tollgate_client.client import MCP_PROTOCOL_VERSION, Amount, TollgateClient
from tollgate_client.errors import (
    AuthenticationError,
    Conflict,
    DecisionTimeout,
    InsufficientFunds,
    NotFound,
    PermissionDenied,
    PermitRequestNotApproved,
    ProtocolError,
    RateLimited,
    ServerError,
    TollgateError,
    TransportError,
    ValidationError,
)
from tollgate_client.models import (
    ApiKey,
    Authority,
    EmergencyRevocation,
    Evidence,
    JSONObject,
    KeyRotation,
    Page,
    Permit,
    PermitRequest,
    PermitVerification,
    Policy,
    PolicyChangeProposal,
    PortableVerification,
    Quote,
    Receipt,
    ReceiptVerification,
    Tool,
    ToolCallResult,
    ToolManifest,
    Wallet,
)
from tollgate_client.verify import verify_portable_offline, verify_portable_standalone

__version__ = "1.3.0"

__all__ = [
    "MCP_PROTOCOL_VERSION",
    "Amount",
    "ApiKey",
    "AuthenticationError",
    "Authority",
    "Conflict",
    "DecisionTimeout",
    "EmergencyRevocation",
    "Evidence",
    "InsufficientFunds",
    "JSONObject",
    "KeyRotation",
    "NotFound",
    "Page",
    "PermissionDenied",
    "Permit",
    "PermitRequest",
    "PermitRequestNotApproved",
    "PermitVerification",
    "Policy",
    "PolicyChangeProposal",
    "PortableVerification",
    "ProtocolError",
    "Quote",
    "RateLimited",
    "Receipt",
    "ReceiptVerification",
    "ServerError",
    "TollgateClient",
    "TollgateError",
    "Tool",
    "ToolCallResult",
    "ToolManifest",
    "TransportError",
    "ValidationError",
    "Wallet",
    "__version__",
    "verify_portable_offline",
    "verify_portable_standalone",
]
