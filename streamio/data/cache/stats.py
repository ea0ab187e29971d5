"""Read counters: one :class:`ReadStats` per cache (per process) and one per prefetcher.

A read updates the cache's own counters and, when the caller passes one, the caller's too
(:class:`Counters`), so a prefetcher reports what *its* runs cost while the cache reports the whole
process. Eviction and discards are the cache's business and count on the cache's stats only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Counters", "ReadStats"]


@dataclass
class ReadStats:
    """Counters of one cache (per process) or one prefetcher; thread-safe through :meth:`add`.

    Attributes:
        hits: ranges served from a committed cache file.
        misses: downloads this process started (or took over).
        follows: ranges read (at least partly) while their download was in flight, from the file
            being filled (another process's download, or this process's prefetch thread).
        resumes: partial downloads (of a dead or stopped reader) continued from their last byte.
        bypasses: ranges streamed without caching (no room, or no cache configured).
        discarded: cache files found corrupt or of the wrong size and discarded.
        evictions: committed shards evicted to make room.
        bytes_from_network: bytes received from the store.
        bytes_from_cache: bytes read from local cache files (hits and follows).
        stall_s: seconds readers waited for data: a prefetcher's consumer waiting for a run to
            start, and readers waiting behind a download they follow.
        retries: transient-error retries, when the storage layer reports them (else None).
    """

    hits: int = 0
    misses: int = 0
    follows: int = 0
    resumes: int = 0
    bypasses: int = 0
    discarded: int = 0
    evictions: int = 0
    bytes_from_network: int = 0
    bytes_from_cache: int = 0
    stall_s: float = 0.0
    retries: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        """Add ``deltas`` to the named counters atomically."""
        with self._lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-safe snapshot."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __getstate__(self) -> dict[str, Any]:
        return self.as_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class Counters:
    """Updates the cache's stats and, if given, a caller's (each counted once if they are one object)."""

    __slots__ = ("_targets",)

    def __init__(self, own: ReadStats, extra: ReadStats | None = None) -> None:
        self._targets = (own,) if extra is None or extra is own else (own, extra)

    def add(self, **deltas: float) -> None:
        """Add ``deltas`` to every target."""
        for target in self._targets:
            target.add(**deltas)
