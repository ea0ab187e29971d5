"""What the cache core knows of one object: a key, a URL for messages, its size, its checksum and a
``fetch(start, end)`` callable for its bytes.

The core never sees a :class:`~streamio.storage.Store` or an index entry: the facade
(:class:`~streamio.data.cache.ShardCache`) builds a :class:`Source` from them, the way fsspec's block
caches take a ``fetcher(start, end)``. Tests hand the core an in-memory fetcher instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Fetch", "Source"]

Fetch = Callable[[int, int], Iterable[bytes]]
"""``fetch(start, end)`` yields the bytes ``[start, end)`` of the object in order, as they arrive.

It may end early (an object shorter than its index entry says): the cache checks the count and the
checksum. Transient errors are the fetcher's to retry (``Store.iter_bytes`` resumes by ranged GET).
"""


@dataclass(frozen=True)
class Source:
    """One cacheable object.

    Attributes:
        key: the stem of its cache files (``KEY.data``, ...): a hash, never a user-controlled string,
            that changes when the object's identity (store, path, size, checksum) does.
        url: where it comes from, for messages only.
        size: its size in bytes, trusted (from the index).
        checksum: its ``"crc32c:..."`` checksum, trusted (from the index).
        fetch: how to get its bytes.
    """

    key: str
    url: str
    size: int
    checksum: str
    fetch: Fetch
