"""Identifiers: prefix, 22 base62 characters, every character reachable in every position."""

from __future__ import annotations

import re
from collections import Counter

from common.ids import BASE62, new_id, random_base62


def test_format_and_uniqueness() -> None:
    ids = {new_id("act") for _ in range(20_000)}
    assert len(ids) == 20_000
    assert all(re.fullmatch(r"act_[0-9A-Za-z]{22}", i) for i in ids)


def test_every_position_spreads_over_the_alphabet() -> None:
    samples = [random_base62(22) for _ in range(6_200)]
    for position in (0, 11, 21):
        counts = Counter(s[position] for s in samples)
        assert set(counts) == set(BASE62), position
        # 100 expected per character; a biased or stuck position shows far outside this band.
        assert min(counts.values()) > 40, (position, counts.most_common()[-3:])
        assert max(counts.values()) < 180, (position, counts.most_common(3))


def test_other_lengths() -> None:
    assert len(random_base62(1)) == 1
    assert len(random_base62(40)) == 40


def test_each_character_has_exactly_four_source_bytes() -> None:
    from common import ids

    kept = [b for b in range(256) if b not in ids._DROPPED]
    counts = Counter(ids._TABLE[b] for b in kept)
    assert set(counts) == set(BASE62.encode())
    assert set(counts.values()) == {4}


def test_dropped_bytes_are_read_again(monkeypatch) -> None:
    from common import ids

    reads: list[int] = []
    stream = iter([b"\xff" * 20 + b"\x00\x3e", b"\xf8" * 5 + bytes(range(40))])

    def urandom(n: int) -> bytes:
        reads.append(n)
        return next(stream)[:n]

    monkeypatch.setattr(ids.os, "urandom", urandom)
    # 22 bytes read, 20 dropped: "00" kept (0 and 62 both map to "0"), then 20 more characters.
    assert random_base62(22) == "00" + BASE62[:20]
    assert reads == [38, 36]
