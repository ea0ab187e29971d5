"""Filling the cache: one downloader per object on the node, any number of followers behind it.

**Download.** The reader that takes ``KEY.dl`` (``flock`` exclusive, non-blocking) becomes the
downloader: it resumes the ``KEY.part`` its record describes, or reserves room and creates one at
full size (so the usage counted from file sizes is what the download will occupy). It fetches the
missing intervals, writes every byte into the ``.part`` with ``pwrite`` and records progress after
each piece, yielding the caller's range as soon as its bytes are there. A run that starts mid-object
at byte ``A`` fetches ``[A, size)`` first and ``[0, A)`` last, so its first bytes cost one request
latency, as a range-only read would; only the *end* of the call waits for the rest (in a prefetch
thread, off the consumer's path). When every byte is there and the CRC32C matches, ``.part`` becomes
``.data`` with one ``os.replace``: a partial file is never visible under the committed name. A
mismatch marks the record failed, removes the ``.part`` and raises: nothing corrupt is committed.

**Follow.** A reader that finds ``KEY.dl`` locked reads the growing ``.part`` behind the downloader,
guided by the record, and never opens a connection. When the downloader goes away (killed: the
kernel drops its lock; or stopped early) the follower returns, and its caller takes the lock and
continues the download from the last byte recorded (a *resume*), never from byte 0.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Generator, Iterator

from streamio.checksum import Crc32c, format_checksum, parse_checksum
from streamio.data.cache.config import CacheConfig
from streamio.data.cache.directory import O_CLOEXEC, O_NOFOLLOW, CacheDirectory, crc_of, pwrite_all, read_chunks
from streamio.data.cache.record import (
    BOOT,
    COMMITTED,
    DOWNLOADING,
    EMPTY,
    FAILED,
    RECORD_SIZE,
    Record,
    read_record,
    read_record_at,
    write_record,
)
from streamio.data.cache.source import Source
from streamio.data.cache.stats import Counters
from streamio.errors import CorruptDataError
from streamio.flocks import release

log = logging.getLogger(__name__)

__all__ = ["RESERVE", "Download", "Follower", "serve"]

RESERVE = 4 * RECORD_SIZE
"""Bytes reserved beside each object for its lock and record files."""
_MAX_NAP = 0.05  # seconds: the longest a follower sleeps between looks at an idle download
_NAP_GROWTH = 20  # a follower's nap grows by this many poll intervals per poll interval idle


def serve(fd: int, rec: Record, pos: int, end: int, *, chunk_size: int, where: str) -> Iterator[bytes]:
    """Yield the bytes of ``[pos, end)`` that ``rec`` says are valid, from ``fd``; stop at the first gap."""
    while pos < end:
        avail = rec.available_end(pos)
        if avail is None or avail <= pos:
            return
        for chunk in read_chunks(fd, pos, min(avail, end), chunk_size=chunk_size, where=where):
            pos += len(chunk)
            yield chunk


class Download:
    """This call's download of one object into ``KEY.part``.

    Call order: ``Download(...)`` (takes ownership of the download lock ``dl``) ->
    :meth:`prepare` -> :meth:`run` (a generator; drain it) -> :meth:`close` (or use as a context
    manager). A download that is not run to its end stays resumable.

    Args:
        directory: the cache directory.
        config: chunk size and fsync policy.
        src: the object.
        dl: an fd of ``KEY.dl`` locked exclusively by the caller; closed by :meth:`close`.
        counters: where misses, resumes and network bytes are counted.
    """

    def __init__(
        self, directory: CacheDirectory, config: CacheConfig, src: Source, dl: int, counters: Counters
    ) -> None:
        self.directory, self.config, self.src, self.dl, self.counters = directory, config, src, dl, counters
        self.part_fd = -1
        self.record = Record()
        self._crc: Crc32c | None = None
        self._end = 0
        self._cancelled: Callable[[], bool] | None = None

    def __enter__(self) -> Download:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the ``.part`` and release the download lock."""
        if self.part_fd >= 0:
            os.close(self.part_fd)
        if self.dl >= 0:
            release(self.dl)
        self.part_fd = self.dl = -1

    # ------------------------------------------------------------------ reserve or resume
    def prepare(self, split: int, make_room: Callable[[int], bool]) -> bool:
        """Resume the partial download the record describes, or reserve room for a new one.

        Args:
            split: where a new download starts (it fetches ``[split, size)`` first).
            make_room: called under the directory lock with the bytes needed; True if they fit.

        Returns:
            False when there is no room: the caller streams the object uncached.
        """
        src, name = self.src, self.src.key + ".part"
        rec = read_record(self.dl) or Record()
        fd = self.directory.open_file(name, os.O_RDWR, what=src.url)
        if fd is not None:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and rec.state == DOWNLOADING and rec.ino == st.st_ino and (
                rec.size == src.size == st.st_size
            ):
                self.counters.add(resumes=1, misses=1)
                log.debug("resuming download of %s at %d+%d / %d", src.url, rec.split, rec.hi, rec.lo)
                self.part_fd, self.record = fd, rec
                return True
            os.close(fd)
            self.directory.unlink(name)  # a partial file that no record describes: nothing read it
        with self.directory.locked():
            if not make_room(src.size + RESERVE):
                log.debug("cache %s full of leased shards; streaming %s uncached", self.directory.path, src.url)
                return False
            self.part_fd = self._create(name)
        split = 0 if split == src.size else split
        self.record = Record(DOWNLOADING, os.fstat(self.part_fd).st_ino, split, 0, 0, 0, src.size, BOOT)
        write_record(self.dl, self.record)
        self.counters.add(misses=1)
        return True

    def _create(self, name: str) -> int:
        """A new ``.part`` preallocated to the full size (under the directory lock)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=self.directory.fd())
        try:
            if self.src.size:
                try:
                    os.posix_fallocate(fd, 0, self.src.size)
                except OSError:  # filesystems without fallocate: a sparse file of the right size
                    os.ftruncate(fd, self.src.size)
        except BaseException:
            os.close(fd)
            self.directory.unlink(name)
            raise
        return fd

    # ------------------------------------------------------------------ fetch, tee, commit
    def run(self, pos: int, end: int, cancelled: Callable[[], bool] | None = None) -> Iterator[bytes]:
        """Fetch the missing intervals, yield ``[pos, end)`` as it arrives, then verify and commit.

        ``cancelled`` (polled after each piece) stops the download uncommitted and resumable.

        Raises:
            CorruptDataError: the object is shorter or longer than its size, or fails its checksum.
        """
        rec = self.record
        fresh = rec.hi == 0 and rec.lo == 0 and rec.split == 0
        self._crc = Crc32c() if fresh else None  # else: bytes arrive out of order; CRC the file at the end
        self._end, self._cancelled = end, cancelled
        pos = yield from self._ready(pos)  # already-valid bytes first (a resumed download)
        for seg_start, seg_end, hi in ((rec.split + rec.hi, self.src.size, True), (rec.lo, rec.split, False)):
            if seg_start < seg_end:
                reached = yield from self._fetch(seg_start, seg_end, hi, pos)
                if reached is None:
                    return
                pos = reached
        yield from self._ready(pos)
        self._commit()

    def _ready(self, pos: int) -> Generator[bytes, None, int]:
        """Yield what is already valid of the caller's window from ``pos``; return the new position."""
        where = self.directory.path
        for chunk in serve(self.part_fd, self.record, pos, self._end, chunk_size=self.config.chunk_size, where=where):
            pos += len(chunk)
            yield chunk
        return pos

    def _fetch(self, seg_start: int, seg_end: int, hi: bool, pos: int) -> Generator[bytes, None, int | None]:
        """Fetch ``[seg_start, seg_end)`` into the ``.part``, teeing the caller's window out of it.

        Returns:
            The caller's position after the segment; None when ``cancelled`` stopped the download.
        """
        rec, src, at, end, cancelled = self.record, self.src, seg_start, self._end, self._cancelled
        for chunk in src.fetch(seg_start, seg_end):
            n = len(chunk)
            if at + n > seg_end:
                raise CorruptDataError(f"shard {src.url!r} returned more bytes than asked for [{seg_start}, {seg_end})")
            pwrite_all(self.part_fd, chunk, at)
            if self._crc is not None:
                self._crc.update(chunk)
            self.counters.add(bytes_from_network=n)
            if hi:
                rec.hi += n
            else:
                rec.lo += n
            write_record(self.dl, rec)
            if at <= pos < at + n and pos < end:
                piece = chunk if (pos == at and at + n <= end) else chunk[pos - at : min(end, at + n) - at]
                pos += len(piece)
                yield piece
            at += n
            pos = yield from self._ready(pos)
            if cancelled is not None and cancelled():
                log.debug("download of %s stopped at %d+%d / %d; resumable", src.url, rec.split, rec.hi, rec.lo)
                return None
        if at != seg_end:
            raise CorruptDataError(
                f"shard {src.url!r} ended after {at} bytes; the index says {src.size}. "
                f"Re-run `streamio verify` on the dataset."
            )
        return pos

    def _commit(self) -> None:
        src, rec, directory = self.src, self.record, self.directory
        if self._crc is not None:
            value = self._crc.value
        else:
            value = crc_of(self.part_fd, src.size, chunk_size=self.config.chunk_size, where=directory.path)
        if value != parse_checksum(src.checksum):
            rec.state = FAILED
            write_record(self.dl, rec)
            with directory.locked():
                directory.unlink(src.key + ".part")
            raise CorruptDataError(
                f"shard {src.url!r} arrived with checksum {format_checksum(value)}, the index says {src.checksum}; "
                f"the download was discarded and is fetched again on the next read (if this repeats, run "
                f"`streamio verify` on the dataset)"
            )
        if self.config.fsync:
            os.fsync(self.part_fd)
        st = os.fstat(self.part_fd)
        rec.state, rec.mtime_ns, rec.boot = COMMITTED, st.st_mtime_ns, BOOT
        with directory.locked():
            write_record(self.dl, rec)
            dfd = directory.fd()
            os.replace(src.key + ".part", src.key + ".data", src_dir_fd=dfd, dst_dir_fd=dfd)
        log.debug("cached %s (%d bytes) as %s.data", src.url, src.size, src.key)


# ---------------------------------------------------------------------- follow
class Follower:
    """Reads behind another reader's download of one object, from its growing ``KEY.part``.

    Args:
        directory: the cache directory.
        config: chunk size and poll interval.
        src: the object.
        counters: where ``follows``, ``bytes_from_cache`` and ``stall_s`` are counted.
        wait: ``wait(seconds)`` sleeps and returns the seconds it slept (counted as ``stall_s``).
    """

    def __init__(
        self,
        directory: CacheDirectory,
        config: CacheConfig,
        src: Source,
        counters: Counters,
        wait: Callable[[float], float],
    ) -> None:
        self.directory, self.config, self.src, self.counters, self.wait = directory, config, src, counters, wait

    def read(self, pos: int, end: int) -> Generator[bytes, None, int]:
        """Yield ``[pos, end)`` as the download provides it; return the position reached.

        Returns early when the download is not (or no longer) in flight: not set up yet, committed,
        failed before this reader got a byte, or its downloader went away; the caller looks again and
        may take the download over. Counts ``follows`` once, if a byte was read.

        Raises:
            CorruptDataError: the download this reader was reading from failed its checksum.
        """
        start, key = pos, self.src.key
        fd = self.directory.open_regular(key + ".part")
        if fd is None:
            # not created yet, or committed/removed meanwhile: let the caller look again
            if not self.directory.exists(key + ".data") and self.directory.is_locked(key + ".dl"):
                self._nap(self.config.poll_interval)
            return pos
        try:
            for chunk in self._behind(fd, pos, end):
                if pos == start:
                    self.counters.add(follows=1)
                pos += len(chunk)
                self.counters.add(bytes_from_cache=len(chunk))
                yield chunk
        finally:
            os.close(fd)
        return pos

    def _nap(self, seconds: float) -> None:
        self.counters.add(stall_s=self.wait(seconds))

    def _behind(self, fd: int, pos: int, end: int) -> Iterator[bytes]:
        directory, src = self.directory, self.src
        ino, start, delay, idle = os.fstat(fd).st_ino, pos, self.config.poll_interval, 0.0
        while pos < end:
            rec = read_record_at(directory, src.key)
            if rec is None or rec.ino != ino or rec.state in (EMPTY, FAILED):
                if pos > start:  # the file we read from was discarded (checksum failure) under us
                    raise CorruptDataError(
                        f"shard {src.url!r}: the download this reader followed failed its checksum and was "
                        f"discarded after {pos - start} bytes were read; read the shard again"
                    )
                self._nap(delay)  # a download being set up, or one that just failed: look again
                return
            before = pos
            for chunk in serve(fd, rec, pos, end, chunk_size=self.config.chunk_size, where=directory.path):
                pos += len(chunk)
                yield chunk
            if pos >= end:
                return
            if pos > before:
                idle = 0.0
                continue
            if not directory.is_locked(src.key + ".dl"):
                # the downloader is gone (killed, or stopped early): one last look, then let the caller take over
                rec = read_record_at(directory, src.key)
                if rec is not None and rec.ino == ino and rec.available_end(pos) is not None:
                    continue
                return
            self._nap(min(delay * (1 + idle * _NAP_GROWTH), _MAX_NAP))
            idle += delay
