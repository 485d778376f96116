"""The two steps every permits service takes on the row it writes: signing its statement onto it
(permits, quotes, approvals) and auditing the change against the row's tenant and wallet.

Neither takes a transaction of its own: the caller's service holds it, and the audit append is
its last statement (``audit.services.audit_record``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypedDict, Unpack

from audit.services import audit_record
from audit.signing import SignedStatement, sign_statement


class SignedRow(Protocol):
    """A row that stores its own signed statement (``Permit``, ``Quote``, ``PermitApproval``)."""

    signed_statement: Any
    signature: str
    key_id: str


class WalletRow(Protocol):
    """A row of one tenant's wallet (a ``Wallet`` itself, or a row that belongs to one)."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def wallet_id(self) -> str: ...


def signed_row_fill(row: SignedRow, statement: Mapping[str, Any]) -> SignedStatement:
    """Sign ``statement`` (``audit.signing.sign_statement``) and set it, its signature and its key id on
    ``row`` (not saved). Returns the signed statement."""
    signed = sign_statement(statement)
    row.signed_statement = signed.statement
    row.signature = signed.signature
    row.key_id = signed.kid
    return signed


class RowEventFields(TypedDict, total=False):
    """The fields of a row's audit event that the caller may give besides its detail
    (``audit.services.EventFields``; the tenant and the wallet are the row's)."""

    key_id: str | None
    tool: str | None
    endpoint: str | None


def wallet_row_audit(
    event: str,
    row: WalletRow,
    *,
    detail: dict[str, Any],
    ok: bool = True,
    actor: str = "",
    **fields: Unpack[RowEventFields],
) -> None:
    """Append ``event`` to the audit chain of ``row``'s tenant, naming its wallet, in the caller's
    transaction (``audit_record``). ``key_id``: the acting API key (None: the operator or a console
    user); ``actor`` (``admin:<username>``), when given, is added to ``detail``."""
    audit_record(
        event=event,
        ok=ok,
        tenant_id=row.tenant_id,
        wallet_id=row.wallet_id,
        detail={**detail, **({"actor": actor} if actor else {})},
        **fields,
    )
