"""The progress / verification record of one cached object, kept at the start of ``KEY.dl``.

A small fixed-size struct followed by its CRC32C, rewritten in place with one ``pwrite``; a reader
that catches a concurrent write half-done sees a CRC mismatch and reads again. Fields:

* ``state`` — :data:`EMPTY`, :data:`DOWNLOADING`, :data:`COMMITTED` or :data:`FAILED` (checksum
  mismatch: followers stop, the next reader fetches again);
* ``ino`` — the inode of the ``KEY.part`` being filled (and, once committed, of ``KEY.data``:
  ``os.replace`` keeps the inode), so a record never describes a file it was not written for;
* ``split``, ``hi``, ``lo`` — the valid bytes of a download fetched range-first: ``[split,
  split + hi)`` then ``[0, lo)``. A download that starts at byte ``A`` fetches ``[A, size)`` first and
  ``[0, A)`` last, so these two intervals describe every state it can be in;
* ``mtime_ns``, ``size``, ``boot`` — the verification stamp of a committed file.

Fsync policy. By default the cache does not fsync: a cache is re-creatable, and fsync of every
shard would throttle the download to the disk's write-back. Instead the stamp names the boot
(``/proc/sys/kernel/random/boot_id``) and the file's inode, size and mtime: after a reboot, or after
anything wrote into the file, the stamp no longer matches and the file is re-verified (full CRC32C)
before it is served (:mod:`streamio.data.cache.verify`); a mismatch discards it with a warning and
the object is fetched again. ``CacheConfig(fsync=True)`` fsyncs before commit for users who want
committed files to survive a power loss without that re-verification.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamio.checksum import crc32c

if TYPE_CHECKING:
    from streamio.data.cache.directory import CacheDirectory

__all__ = [
    "BOOT", "COMMITTED", "DOWNLOADING", "EMPTY", "FAILED", "RECORD_SIZE", "Record",
    "read_record", "read_record_at", "write_record",
]

_MAGIC = b"SIOC"
_STRUCT = struct.Struct("<4sB3xQQQQqQQ")  # magic, state, ino, split, hi, lo, mtime_ns, size, boot
RECORD_SIZE = _STRUCT.size + 4  # + crc32c of the packed record
EMPTY, DOWNLOADING, COMMITTED, FAILED = 0, 1, 2, 3
_TORN_READ_RETRIES = 100


def _boot_id() -> int:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return int.from_bytes(hashlib.sha256(f.read().strip()).digest()[:8], "little")
    except OSError:
        return 0


BOOT = _boot_id()
"""This boot, as a number (0 where the kernel does not say): part of every verification stamp."""


@dataclass
class Record:
    """The decoded record; see the module docstring for the fields."""

    state: int = EMPTY
    ino: int = 0
    split: int = 0
    hi: int = 0
    lo: int = 0
    mtime_ns: int = 0
    size: int = 0
    boot: int = 0

    @classmethod
    def stamp_of(cls, st: os.stat_result) -> Record:
        """The record saying the committed file with this inode/size/mtime was verified in this boot."""
        return cls(COMMITTED, st.st_ino, 0, st.st_size, 0, st.st_mtime_ns, st.st_size, BOOT)

    def stamps(self, st: os.stat_result) -> bool:
        """Whether this record vouches for the committed file ``st`` (no re-verification needed)."""
        return self.state == COMMITTED and (self.ino, self.mtime_ns, self.size, self.boot) == (
            st.st_ino, st.st_mtime_ns, st.st_size, BOOT,
        )

    def pack(self) -> bytes:
        """The on-disk bytes: the struct and its CRC32C."""
        body = _STRUCT.pack(
            _MAGIC, self.state, self.ino, self.split, self.hi, self.lo, self.mtime_ns, self.size, self.boot
        )
        return body + struct.pack("<I", crc32c(body))

    def available_end(self, pos: int) -> int | None:
        """End of the valid bytes starting at ``pos`` (None: ``pos`` has not arrived yet)."""
        if self.state == COMMITTED:
            return self.size
        if self.state != DOWNLOADING:
            return None
        if self.split <= pos < self.split + self.hi:
            return self.split + self.hi
        if pos < self.lo:
            return self.lo
        return None


def read_record(fd: int) -> Record | None:
    """The record at the start of ``fd``; None if it is missing, torn for good, or not ours."""
    for _ in range(_TORN_READ_RETRIES):  # a torn read of a concurrent pwrite fails the CRC: read again
        raw = os.pread(fd, RECORD_SIZE, 0)
        if len(raw) < RECORD_SIZE:
            return None
        body, (check,) = raw[: _STRUCT.size], struct.unpack("<I", raw[_STRUCT.size :])
        if crc32c(body) == check:
            magic, *values = _STRUCT.unpack(body)
            return Record(*values) if magic == _MAGIC else None
    return None


def write_record(fd: int, rec: Record) -> None:
    """Replace the record at the start of ``fd`` (one ``pwrite``)."""
    os.pwrite(fd, rec.pack(), 0)


def read_record_at(directory: CacheDirectory, key: str) -> Record | None:
    """The record of ``key`` without locking it (None if there is none, or ``KEY.dl`` is not a file)."""
    fd = directory.open_regular(key + ".dl")
    if fd is None:
        return None
    try:
        return read_record(fd)
    finally:
        os.close(fd)
