"""The cache's settings: one frozen value, pickled into every process that shares the directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from streamio.errors import CacheTooSmallError, ConfigError

__all__ = ["CacheConfig", "OnError"]

OnError = Literal["bypass", "raise"]
"""What a read does when the system refuses a cache write (see :class:`CacheConfig`)."""


@dataclass(frozen=True)
class CacheConfig:
    """Where the node-local cache lives and how big it may grow.

    Attributes:
        directory: cache directory on fast local disk (NVMe), created ``0700`` if missing. Every
            process on the node that uses the same directory shares its shards.
        max_bytes: upper bound of the directory's usage (all its files). Size it at least
            ``processes per node x prefetch workers x largest shard``; below that, some reads
            bypass the cache (correct, but downloaded more than once).
        min_free_bytes: free-disk floor: shards are evicted (or the cache bypassed) rather than let
            the filesystem's free space fall below this.
        chunk_size: bytes per network request piece / local read yielded to the caller.
        fsync: fsync each shard before committing it (see :mod:`streamio.data.cache.record` for why
            the default is off and why that is safe).
        poll_interval: seconds between checks of another process's download progress.
        on_error: when the system refuses a cache write (the process's file-size limit, a full
            disk or quota, a read-only filesystem, permissions, the directory removed while
            running): ``"bypass"`` (default) reads that shard from the store without the cache,
            correct but downloaded again, with one warning per cause and process saying what to
            fix; ``"raise"`` raises the :class:`~streamio.errors.CacheWriteError` (the dataset's
            fault handler may then skip the run). An unsafe directory (a symlink, another owner,
            writable by others) always raises.
    """

    directory: str | os.PathLike[str]
    max_bytes: int
    min_free_bytes: int = 1 << 30
    chunk_size: int = 4 << 20
    fsync: bool = False
    poll_interval: float = 0.005
    on_error: OnError = "bypass"

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise CacheTooSmallError(
                f"cache {os.fspath(self.directory)!r}: max_bytes={self.max_bytes} must be positive"
            )
        if self.on_error not in ("bypass", "raise"):
            raise ConfigError(
                f"cache {os.fspath(self.directory)!r}: on_error={self.on_error!r} is not 'bypass' or 'raise'"
            )
        if self.chunk_size <= 0:
            raise ConfigError(f"cache {os.fspath(self.directory)!r}: chunk_size={self.chunk_size} must be positive")
