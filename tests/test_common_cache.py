"""The one bounded per-process cache (common.cache) and the apps' caches built on it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from common.cache import BoundedCache, clear_all, registered


def test_a_full_cache_drops_its_oldest_entry_first():
    cache: BoundedCache[str, int] = BoundedCache("test.fifo", max_entries=3)
    for n, key in enumerate("abc"):
        cache.set(key, n)
    assert cache.get("a") == 0  # a hit does not make an entry younger (not LRU)
    cache.set("d", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), cache.get("d")) == (None, 1, 2, 3)
    assert len(cache) == 3


def test_replacing_a_cached_key_evicts_nothing():
    cache: BoundedCache[str, int] = BoundedCache("test.replace", max_entries=2)
    cache.set("a", 1)
    cache.set("b", 2)
    cache.set("a", 10)
    assert (cache.get("a"), cache.get("b"), len(cache)) == (10, 2, 2)


def test_get_pop_contains_and_defaults():
    cache: BoundedCache[str, bool] = BoundedCache("test.api", max_entries=4)
    cache.set("yes", True)
    cache.set("no", False)
    assert "no" in cache
    assert "yes" in cache
    assert "absent" not in cache
    assert cache.get("no") is False
    assert cache.get("absent", True) is True
    assert cache.pop("yes") is True
    assert cache.pop("yes") is None
    assert "yes" not in cache


def test_an_entry_older_than_the_ttl_is_a_miss():
    cache: BoundedCache[str, str] = BoundedCache("test.ttl", max_entries=2, ttl=2.0)
    cache.set("fresh", "x")
    cache.set("stale", "y", read_at=time.monotonic() - 2.5)  # read 2.5 s ago: expired on arrival
    assert cache.get("fresh") == "x"
    assert "fresh" in cache
    assert cache.get("stale") is None
    assert "stale" not in cache
    assert cache.pop("stale") is None


@pytest.mark.parametrize("bad", [{"max_entries": 0}, {"max_entries": 1, "ttl": 0}])
def test_a_cache_without_room_or_lifetime_is_refused(bad):
    with pytest.raises(ValueError):
        BoundedCache("test.bad", **bad)


def test_concurrent_writers_never_pass_the_bound():
    cache: BoundedCache[tuple[int, int], int] = BoundedCache("test.threads", max_entries=50)
    start = threading.Barrier(4)

    def write(worker: int) -> None:
        start.wait()
        for n in range(2_000):
            cache.set((worker, n), n)
            assert len(cache) <= 50

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 50


def test_clear_all_empties_every_cache_of_the_process():
    """Every per-process cache of the apps is a BoundedCache, and clear_all reaches each."""
    from audit import keystore, services, signing
    from billing.services import charge
    from mcpgateway.services import lookup
    from mcpgateway.upstream import validators

    apps: list[BoundedCache[Any, Any]] = [
        lookup._prices,
        lookup._permits,
        lookup._verdicts,
        validators.schema_validators,
        keystore._cache,
        signing._public_keys,
        signing._verified,
        services._active,
        charge._unbatched,
    ]
    mine: BoundedCache[str, int] = BoundedCache("test.clear_all", max_entries=1)
    live = registered()
    assert all(cache in live for cache in [*apps, mine])
    assert len({cache.name for cache in apps}) == len(apps)
    mine.set("k", 1)
    charge._unbatched.set("wallet", True)
    clear_all()
    assert len(mine) == 0
    assert "wallet" not in charge._unbatched


def test_the_output_validators_share_one_bounded_cache_keyed_by_canonical_json():
    from mcpgateway.upstream.validators import VALIDATOR_CACHE_LIMIT, output_schema_problem, schema_validators

    first = {"type": "object", "title": "first"}
    assert output_schema_problem(first) is None
    # The same schema written in another key order is the same entry.
    assert output_schema_problem({"title": "first", "type": "object"}) is None
    assert len(schema_validators) == 1
    for n in range(VALIDATOR_CACHE_LIMIT):
        output_schema_problem({"type": "object", "title": f"s{n}"})
    assert len(schema_validators) == VALIDATOR_CACHE_LIMIT
    # Past the bound only the oldest went (a full cache used to start again empty).
    assert ("output", '{"title":"first","type":"object"}') not in schema_validators
    assert ("output", '{"title":"s0","type":"object"}') in schema_validators
    reason = output_schema_problem({"type": 5})
    assert reason is not None  # an invalid schema's reason is cached too
    assert schema_validators.get(("output", '{"type":5}')) == f"invalid output_schema: {reason}"
