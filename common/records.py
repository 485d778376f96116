"""Records passed to database functions as one ``jsonb`` argument each.

Apps pass what they own to each other's database functions as named records, never as slices of
another app's positional arguments (docs/decisions.md, "Records between apps"): each shape has one
constructor in the app that owns it (``billing.services.ledger.DebitCall.record``,
``audit.services.PreparedEvent.record_in``, ``permits.services.permit_reservation_record``...) and is
read by that app's SQL function. ``record_json`` writes one: decimals as strings and times in ISO
8601 with their offset, so nothing is rounded or shifted on the way (as ``common.fastsql.json_row``
writes a row); bytes in hex (``decode(x, 'hex')`` in SQL); tuples as arrays.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"a record cannot hold {type(value).__name__}")


_encode = json.JSONEncoder(default=_plain, separators=(",", ":")).encode


def record_json(fields: Mapping[str, Any] | list[Any]) -> str:
    """``fields`` as the JSON text of one ``jsonb`` record argument."""
    return _encode(fields)
