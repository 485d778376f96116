"""Quotes: a tool's price frozen for one call in a signed quote, checked and spent exactly once.

``quote_create`` owns its transaction and writes its audit event inside it as the last statement.
``quote_consume`` is a building block the gateway runs in its own phase-1 transaction; it takes no
transaction of its own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.signing import statement_problem
from billing.exceptions import money
from billing.models import Wallet
from billing.selectors import tool_price
from common.canonical import iso_utc
from common.errors import RequestValidationError
from common.ids import new_id
from common.records import record_json
from permits import exceptions as exc
from permits.models import Quote, QuoteStatus
from permits.services.rows import signed_row_fill, wallet_row_audit

QUOTE_LIFETIME = timedelta(seconds=600)


def _quote_statement(quote: Quote) -> dict[str, Any]:
    return {
        "type": "quote",
        "quote_id": quote.quote_id,
        "tenant_id": quote.tenant_id,
        "wallet_id": quote.wallet_id,
        "tool": quote.tool,
        "quoted_credits": money(quote.quoted_credits),
        "created_at": iso_utc(quote.created_at),
        "expires_at": iso_utc(quote.expires_at),
    }


def quote_statement_problem(quote: Quote) -> str | None:
    """Why ``quote``'s columns (price, tool, wallet, expiry) disagree with its signed statement, or None."""
    return statement_problem(
        quote.signed_statement, quote.signature, expected_type="quote", columns=_quote_statement(quote)
    )


@transaction.atomic(durable=True)
def quote_create(*, wallet: Wallet, tool: str, requested_by_key_id: str = "") -> Quote:
    """Freeze the tool's current price for one call by ``wallet`` in a signed quote.

    Quoting is free: no ledger entry, no reservation, no change to the wallet.
    A tool without a price cannot be quoted (422).
    """
    price = tool_price(tool)
    if price is None:
        raise RequestValidationError.single(
            ["body", "tool"], "This tool has no price set and cannot be quoted or called.", "tool_price_not_set"
        )
    now = timezone.now()
    quote = Quote(
        quote_id=new_id("qt"),
        tenant_id=wallet.tenant_id,
        wallet=wallet,
        tool=tool,
        quoted_credits=price,
        created_at=now,
        expires_at=now + QUOTE_LIFETIME,
        requested_by_key_id=requested_by_key_id,
    )
    signed_row_fill(quote, _quote_statement(quote))
    quote.save(force_insert=True)
    wallet_row_audit(
        "quote.created",
        wallet,
        key_id=requested_by_key_id or None,
        tool=tool,
        endpoint="/v1/quotes",
        detail={"quote_id": quote.quote_id, "quoted_credits": money(price)},
    )
    return quote


def quote_check(*, quote: Quote | None, quote_id: str, wallet: Wallet, tool: str, now: datetime) -> Quote:
    """The quote a call may spend, checked without writing: the wallet's, for ``tool``, active, and signed.

    Raises ``QuoteUnavailable`` otherwise. The price charged comes from this row, so every column
    must be what was signed. Spending it is ``permits_quote_consume`` (``quote_consume``, or the
    governed call's claim), which re-checks all of it under the row lock.
    """
    if (
        quote is None
        or quote.wallet_id != wallet.wallet_id
        or quote.tool != tool
        or quote.effective_status(now) != QuoteStatus.ACTIVE
    ):
        raise exc.QuoteUnavailable(quote_id=quote_id)
    problem = quote_statement_problem(quote)
    if problem is not None:
        raise exc.QuoteUnavailable(quote_id=quote_id, reason="quote_signature_invalid", problem=problem)
    return quote


_QUOTE_CONSUME_SQL = (
    "SELECT permits_quote_consume(%s, %s, %s, %s, %s, %s, %s, %s)"  # permits/sql/permits_quote_consume.sql
)


def quote_consumption_record(*, quote: Quote, wallet_id: str, tool: str, action_id: str, now: datetime) -> str:
    """Spending ``quote`` on ``action_id`` as permits' quote consumption record (JSON text), what
    ``permits_quote_consume_in`` (permits/sql/permits_quote_consume.sql) takes from other apps' database
    functions: the quote, the caller's wallet and tool, the verified price and signature, the action,
    the time. The one constructor of the shape."""
    return record_json(
        {
            "quote_id": quote.quote_id,
            "wallet_id": wallet_id,
            "tool": tool,
            "credits": quote.quoted_credits,
            "signature": quote.signature,
            "action_id": action_id,
            "now": now,
        }
    )


def quote_consume(*, quote_id: str, wallet: Wallet, tool: str, action_id: str, now: datetime | None = None) -> Quote:
    """Spend an active quote exactly once. Caller holds the transaction.

    ``quote_check``, then ``permits_quote_consume``: a conditional UPDATE from ``active`` to
    ``consumed`` at the verified price, so of two concurrent calls with one quote, one succeeds
    and the other gets ``quote_unavailable``.
    """
    now = now or timezone.now()
    quote = quote_check(
        quote=Quote.objects.filter(quote_id=quote_id).first(), quote_id=quote_id, wallet=wallet, tool=tool, now=now
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _QUOTE_CONSUME_SQL,
            [wallet.tenant_id, quote_id, wallet.wallet_id, tool, quote.quoted_credits, quote.signature, action_id, now],
        )
        consumed = bool(cursor.fetchone()[0])
    if not consumed:
        raise exc.QuoteUnavailable(quote_id=quote_id)
    quote.status, quote.consumed_at, quote.consumed_by = QuoteStatus.CONSUMED, now, action_id
    return quote
