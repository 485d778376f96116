"""One bounded per-process cache for every hand-built cache in the apps (docs/decisions.md, Foundation).

``BoundedCache`` holds at most ``max_entries`` entries; when a new key would pass the bound, the
oldest entry (by insertion) goes. It is not LRU on purpose: a hit writes nothing and takes no lock,
so a read on the hot path costs one dict lookup, and the caches here hold rows and statements that
are re-checked at use, where the occasional miss costs one query. ``ttl`` (seconds, optional) makes
an entry a miss once it is older than that. Writes (``set``, ``pop``, ``clear``) hold the cache's
lock; reads rely on a dict lookup being atomic.

Every cache registers itself on creation; ``clear_all()`` empties all of them (tests call it between
tests, so that nothing cached outlives the rows it came from).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()
_registry: weakref.WeakSet[BoundedCache[Any, Any]] = weakref.WeakSet()
_registry_lock = threading.Lock()


class BoundedCache(Generic[K, V]):
    """A thread-safe map of at most ``max_entries`` entries, oldest out first, optionally expiring after ``ttl`` s."""

    def __init__(self, name: str, *, max_entries: int, ttl: float | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        self.name = name
        self.max_entries = max_entries
        self.ttl = ttl
        # With a ttl, each value is stored as (monotonic deadline, value).
        self._data: dict[K, Any] = {}
        self._lock = threading.Lock()
        if ttl is None:
            # Without a ttl a read is the dict's own lookup: no call frame of ours on the hot path.
            self.get = self._data.get  # type: ignore[method-assign,assignment]
        with _registry_lock:
            _registry.add(self)

    def __repr__(self) -> str:
        return f"BoundedCache({self.name!r}, max_entries={self.max_entries}, ttl={self.ttl}, len={len(self._data)})"

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: K) -> bool:
        entry: Any = self._data.get(key, _MISSING)
        if entry is _MISSING:
            return False
        return self.ttl is None or entry[0] > time.monotonic()

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value cached under ``key``, or ``default`` (also for an expired entry). Takes no lock."""
        if self.ttl is None:
            return self._data.get(key, default)
        entry = self._data.get(key)
        if entry is None or entry[0] <= time.monotonic():
            return default
        return entry[1]

    def set(self, key: K, value: V, *, read_at: float | None = None) -> None:
        """Cache ``value`` under ``key``; a new key past the bound first drops the oldest entry.

        ``read_at`` (a ``time.monotonic()`` instant, default now) is when ``value`` was read: with a
        ttl, the entry expires ``ttl`` seconds after it, so a slow read does not lengthen its life.
        """
        if self.ttl is None:
            stored: Any = value
        else:
            stored = ((read_at if read_at is not None else time.monotonic()) + self.ttl, value)
        with self._lock:
            data = self._data
            if key not in data:
                while len(data) >= self.max_entries:
                    del data[next(iter(data))]
            data[key] = stored

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Drop ``key``; its value if it was cached (and not expired), else ``default``."""
        with self._lock:
            entry = self._data.pop(key, None)
        if entry is None:
            return default
        if self.ttl is None:
            return entry
        return entry[1] if entry[0] > time.monotonic() else default

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()


def clear_all() -> None:
    """Empty every ``BoundedCache`` of the process."""
    with _registry_lock:
        caches = list(_registry)
    for cache in caches:
        cache.clear()


def registered() -> list[BoundedCache[Any, Any]]:
    """Every live ``BoundedCache`` of the process (a test checks that the apps' caches are among them)."""
    with _registry_lock:
        return list(_registry)
