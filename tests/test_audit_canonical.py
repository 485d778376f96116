"""The fast canonicalizers produce exactly the RFC 8785 bytes of the reference implementation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from common.canonical import (
    audit_event_bytes,
    audit_event_payload,
    canonical_bytes,
    canonical_bytes_fast,
    event_bytes,
    fast_text,
    iso_utc,
)

# Characters that stress the escaping and key-order rules: controls, quotes,
# backslash, DEL, U+2028, BMP above U+E000 and supplementary characters.
tricky = st.sampled_from(["\x00", "\x1f", '"', "\\", "\x7f", "\u2028", "\ue000", "\ufb33", "\uffff", "\U0001f600", "é"])
text = st.text(st.one_of(st.characters(), tricky), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53) - 5, max_value=2**53 + 5),
    st.integers(min_value=-1000, max_value=1000),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(text, children, max_size=5)),
    max_leaves=25,
)


def _reference(value):
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:  # lone surrogates
        return type(exc)


def _fast(value):
    try:
        return canonical_bytes_fast(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:
        return type(exc)


@settings(max_examples=300, deadline=None, database=None)
@given(json_values)
def test_fast_canonical_equals_rfc8785(value):
    assert _fast(value) == _reference(value)


optional_text = st.one_of(st.none(), text)


@settings(max_examples=200, deadline=None, database=None)
@given(
    event_id=text,
    chain=text,
    seq=st.integers(min_value=0, max_value=2**53 + 2),
    event=text,
    tenant_id=optional_text,
    wallet_id=optional_text,
    key_id=optional_text,
    tool=optional_text,
    endpoint=optional_text,
    policy_decision_id=optional_text,
    request_id=optional_text,
    ok=st.booleans(),
    detail=json_values,
    created_at=text,
)
def test_audit_event_bytes_equal_rfc8785(**fields):
    expected = _reference(audit_event_payload(**fields))
    got: Any
    try:
        got = audit_event_bytes(**fields)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:
        got = type(exc)
    assert got == expected


def test_event_bytes_with_unexpected_types_falls_back():
    fields: dict[str, Any] = dict(
        chain=None, seq=1, event_id=1, event="e", tenant_id=2, wallet_id=None, key_id=None, tool=None,
        endpoint=None, policy_decision_id=None, request_id=None, ok=1, detail={"a": 1.5}, created_at="t",
    )  # fmt: skip
    payload = audit_event_payload(**fields)
    assert event_bytes(*fields.values()) == canonical_bytes(payload)


@pytest.mark.parametrize(
    "value",
    [{1: "a"}, {"a": 1, 2: "b"}, [{"x": 1.0}, {"y": {3: None}}], {"a": 1, "\ue000": 2}, {"\U0001f600": 1, "b": [2.0]}],
)
def test_keys_outside_the_fast_subset_take_the_reference_path_wherever_they_stand(value):
    """A key that is not text, or that may sort differently in UTF-16, sends the whole value to the reference
    path whether it is a dict's first key or its last, and whatever the items beside it hold."""
    assert fast_text(value) is None
    assert _fast(value) == _reference(value)


def test_lone_surrogates_raise_like_the_reference():
    with pytest.raises(rfc8785.CanonicalizationError):
        canonical_bytes_fast({"a": "\ud800"})


def test_iso_utc():
    moment = datetime(2026, 11, 21, 20, 51, 0, 123456, tzinfo=UTC)
    assert iso_utc(moment) == "2026-11-21T20:51:00.123456Z"
    assert iso_utc(moment.replace(microsecond=0)) == "2026-11-21T20:51:00Z"
    assert iso_utc(moment.astimezone(timezone(timedelta(hours=2)))) == "2026-11-21T20:51:00.123456Z"


# Floats at the edges of the fast path: integral and not, around 1e-4 and 2**53, signed zero, extremes.
edge_floats = st.sampled_from(
    [
        0.0,
        -0.0,
        3.0,
        -7.0,
        0.1,
        1 / 3,
        1e-4,
        -1e-4,
        9.999999999999999e-05,
        1.0000000000000002e-04,
        1e-7,
        2.0**53 - 1,
        -(2.0**53 - 1),
        2.0**53,
        2.0**53 + 2,
        4503599627370495.5,
        1e16,
        1e21,
        123456789.125,
        5e-324,
        1.7976931348623157e308,
    ]
)


@settings(max_examples=400, deadline=None, database=None)
@given(st.one_of(edge_floats, st.floats(allow_nan=False), st.floats(min_value=-1e7, max_value=1e7)))
def test_floats_on_the_fast_path_equal_rfc8785(value):
    assert _fast(value) == _reference(value)
    assert _fast([value, {"x": value, "y": [value]}]) == _reference([value, {"x": value, "y": [value]}])


def test_ordinary_floats_take_the_fast_path():
    assert fast_text(1.5) == "1.5"
    assert fast_text({"sum": 3.0, "parts": [1.0, 2.0]}) == '{"parts":[1,2],"sum":3}'
    assert fast_text(-0.0) == "0"
    assert fast_text(1e-5) is None  # repr writes 1e-05, ECMAScript 0.00001: the reference path
    assert fast_text(2.0**53) is None
    assert fast_text(float("nan")) is None
    value = {"a": [1.0]}
    fast_text(value)
    assert value == {"a": [1.0]}
    assert type(value["a"][0]) is float


def test_str_enums_take_the_fast_path_as_their_text():
    from receipts.models import Outcome

    value = {"outcome": Outcome.SUCCESS, "list": [Outcome.SUCCESS]}
    assert fast_text(value) == '{"list":["success"],"outcome":"success"}'
    assert canonical_bytes_fast(value) == rfc8785.dumps(value)
