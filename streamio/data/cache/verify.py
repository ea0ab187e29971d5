"""A committed file is served only once proven intact: by its stamp, or by a full CRC32C.

``KEY.data`` is served when its record (:mod:`streamio.data.cache.record`) stamps this inode, size
and mtime in this boot; otherwise (after a reboot, or after anything wrote into the file) it is
re-verified against the index's checksum and stamped. A file of the wrong size or checksum, or one
that is not a regular file, is discarded with a warning and the object is fetched again.

What is not caught: bit rot that leaves a committed file's size and mtime unchanged within one boot
is served (the stamp matches); the per-sample CRC32C check of ``samples.iter_samples`` catches it,
and ``ShardCache.invalidate`` discards the file.
"""

from __future__ import annotations

import logging
import os
import stat

from streamio.checksum import format_checksum, parse_checksum
from streamio.data.cache.directory import CacheDirectory, crc_of
from streamio.data.cache.record import Record, read_record_at, write_record
from streamio.data.cache.source import Source
from streamio.data.cache.stats import ReadStats
from streamio.flocks import release

log = logging.getLogger(__name__)

__all__ = ["open_verified"]


def open_verified(directory: CacheDirectory, src: Source, stats: ReadStats, *, chunk_size: int) -> int | None:
    """An fd of the verified committed file of ``src``, or None (absent, or found bad and discarded).

    Raises:
        CacheError: the file exists but cannot be opened (other than being a symlink, which is removed).
    """
    name = src.key + ".data"
    fd = directory.open_file(name, os.O_RDONLY, what=src.url)
    if fd is None:
        return None
    st = os.fstat(fd)
    problem = _problem(directory, src, fd, st, chunk_size)
    if problem is None:
        return fd
    log.warning("cache file %s of %s %s: discarded, fetching the shard again", directory.where(name), src.url, problem)
    if directory.discard(name, st.st_ino):
        stats.add(discarded=1)
    os.close(fd)
    return None


def _problem(directory: CacheDirectory, src: Source, fd: int, st: os.stat_result, chunk_size: int) -> str | None:
    """What is wrong with the committed file ``fd`` (None: nothing; a valid file gets stamped)."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size != src.size:
        return f"has {st.st_size} bytes, the index says {src.size}"
    rec = read_record_at(directory, src.key)
    if rec is not None and rec.stamps(st):
        return None
    value = crc_of(fd, src.size, chunk_size=chunk_size, where=directory.path)
    if value != parse_checksum(src.checksum):
        return f"has checksum {format_checksum(value)}, the index says {src.checksum}"
    _stamp(directory, src.key, st)
    return None


def _stamp(directory: CacheDirectory, key: str, st: os.stat_result) -> None:
    """Record that the committed file ``st`` was verified in this boot (skipped if someone holds the record)."""
    dl = directory.lock(key + ".dl", shared=False, blocking=False)
    if dl is None:
        return
    try:
        write_record(dl, Record.stamp_of(st))
    finally:
        release(dl)
