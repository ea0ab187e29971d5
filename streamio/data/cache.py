"""Node-local shard cache: filled while streaming, verified, atomic, bounded, shared by every process.

``ShardCache.open_range(store, shard, start, end)`` yields the bytes ``[start, end)`` of one shard
as they arrive. Three sources, chosen per call:

* **hit** — a committed, verified cache file: read from local disk, no network at all;
* **download** — nobody has the shard: this call becomes its *downloader*: it streams the shard
  from the store (``Store.iter_bytes``, which resumes on resets by ranged GET), writes every byte
  into a temp file beside the final name and yields the requested range as soon as its bytes have
  arrived; when the whole shard is there and its CRC32C matches ``shard.checksum`` the temp file is
  committed with one ``os.replace``;
* **follow** — another thread or process on the node is downloading the shard: this call reads the
  growing temp file behind it, guided by a progress record, and never opens a connection. If the
  downloader dies (its ``flock`` is released by the kernel) a follower takes the download over and
  continues from the last byte recorded.

Why whole shards, fetched range-first. The cache unit is the whole shard because the index has one
checksum per shard and because the other runs of the same shard (other DataLoader workers, other
ranks on the node) are then served locally. A downloader whose run starts mid-shard at byte ``A``
fetches ``[A, size)`` first and ``[0, A)`` last, so its first sample costs one request latency plus
that sample's bytes, exactly like a range-only read; only the *end* of the call waits for the rest
of the shard (in a prefetch thread, off the consumer's path). The progress record can describe two
valid intervals, ``[A, A + hi)`` and ``[0, lo)``, which is all this order ever produces.

Files in the cache directory (``KEY`` = a hash of store URL, shard path, size and checksum, so no
user-controlled string becomes a file name and a rewritten shard gets a new key):

* ``KEY.data`` — committed, verified shard. Only ever appears through ``os.replace``: a partial
  file is never visible under this name.
* ``KEY.part`` — download in progress; preallocated to the full shard size, so the usage counted
  from file sizes is exactly what the download will occupy.
* ``KEY.dl``   — the download lock (``flock`` exclusive, held by the downloader) and the progress /
  verification record (a small checksummed struct, rewritten with ``pwrite``).
* ``KEY.use``  — the reader lease: every reader holds it shared for the whole call; eviction takes
  it exclusive and non-blocking, so a shard being read is never evicted under its reader. Its
  mtime is the LRU clock.
* ``.lock``    — the directory lock, held briefly for reservations, eviction, discard and commit.

``flock`` locks belong to an open file description, so they work between threads of one process as
between processes, and the kernel drops them when a process dies (``kill -9`` included): there is
no lease to expire and no stale lock to clean. Lock files that eviction deletes are re-checked
after locking (inode of the fd == inode at the path), the standard pattern for deletable lock files.

Fsync policy. By default the cache does not fsync: a cache is re-creatable, and fsync of every
shard would throttle the download to the disk's write-back. Instead the verification stamp in the
record names the boot (``/proc/sys/kernel/random/boot_id``) and the file's inode, size and mtime:
after a reboot, or after anything wrote into the file, the stamp no longer matches and the file is
re-verified (full CRC32C) before it is served; a mismatch discards it with a warning and the shard is
fetched again. ``CacheConfig(fsync=True)`` fsyncs before commit for users who want committed files
to survive a power loss without that re-verification.

Bounds. Before a download, the directory lock is taken, the usage (sum of the sizes of every
regular file in the directory) and the free space are measured, least-recently-used committed
shards that no reader holds are evicted (then abandoned partial downloads), and the ``.part`` is
created at full size. If no room can be made (every shard is leased), the call *bypasses* the
cache: it streams from the store without writing, so a small cache shared by many processes never
deadlocks and never exceeds its limit. :meth:`ShardCache.require` raises
:class:`~streamio.errors.CacheTooSmallError` up front when a limit cannot even hold what one
process's prefetch depth needs.

Safety. The directory is created ``0700``; an existing one must be a real directory owned by this
user and not writable by others. Every file is opened relative to a directory file descriptor with
``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a planted FIFO cannot block an open); a symlink or
non-regular file found under a cache name (``.lock`` included) is removed, never followed, and one
that cannot be (a directory) raises :class:`~streamio.errors.CacheError` naming it.
Nothing is ever unpickled from the cache.

Fork/spawn safety: a ``ShardCache`` holds only its :class:`CacheConfig` until first use in a
process; the directory descriptor is opened lazily per process id, and the cache pickles as its
config.

Call order: ``cache = ShardCache(CacheConfig(dir, max_bytes))`` -> (optional) ``cache.require(n)``
-> ``for chunk in cache.open_range(store, shard, start, end)`` (close the generator to stop early;
a download stopped early stays resumable) -> ``cache.stats``. A prefetcher calls
``cache.fetch(store, shard, start)`` in a background thread first: it downloads into the cache
without handing bytes over, and the consumer's ``open_range`` then follows that download.

What the cache does *not* catch: bit rot that leaves a committed file's size and mtime unchanged
within one boot is served (the stamp matches); the per-sample CRC32C check of
``samples.iter_samples`` catches it, and ``cache.invalidate(store, shard)`` discards the file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from streamio.checksum import Crc32c, crc32c, format_checksum, parse_checksum
from streamio.data.index import ShardInfo
from streamio.errors import CacheError, CacheTooSmallError, CorruptDataError
from streamio.storage import Store

log = logging.getLogger(__name__)

__all__ = ["CacheConfig", "ReadStats", "ShardCache"]

_DIR_LOCK = ".lock"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a planted FIFO must not block (no effect on files)
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK

# progress / verification record kept in KEY.dl
_MAGIC = b"SIOC"
_REC = struct.Struct("<4sB3xQQQQqQQ")  # magic, state, ino, split, hi, lo, mtime_ns, size, boot
_REC_SIZE = _REC.size + 4  # + crc32c of the packed record
_EMPTY, _DOWNLOADING, _COMMITTED, _FAILED = 0, 1, 2, 3


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
        fsync: fsync each shard before committing it (see the module docstring for why the default
            is off and why that is safe).
        poll_interval: seconds between checks of another process's download progress.
    """

    directory: str | os.PathLike[str]
    max_bytes: int
    min_free_bytes: int = 1 << 30
    chunk_size: int = 4 << 20
    fsync: bool = False
    poll_interval: float = 0.005

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise CacheTooSmallError(f"cache {os.fspath(self.directory)!r}: max_bytes={self.max_bytes} must be positive")
        if self.chunk_size <= 0:
            raise ValueError(f"cache {os.fspath(self.directory)!r}: chunk_size={self.chunk_size} must be positive")


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


@dataclass
class _Record:
    state: int = _EMPTY
    ino: int = 0
    split: int = 0
    hi: int = 0
    lo: int = 0
    mtime_ns: int = 0
    size: int = 0
    boot: int = 0

    def pack(self) -> bytes:
        body = _REC.pack(_MAGIC, self.state, self.ino, self.split, self.hi, self.lo, self.mtime_ns, self.size, self.boot)
        return body + struct.pack("<I", crc32c(body))

    def available_end(self, pos: int) -> int | None:
        """End of the valid bytes starting at ``pos`` (None: ``pos`` has not arrived yet)."""
        if self.state == _COMMITTED:
            return self.size
        if self.state != _DOWNLOADING:
            return None
        if self.split <= pos < self.split + self.hi:
            return self.split + self.hi
        if pos < self.lo:
            return self.lo
        return None


def _boot_id() -> int:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return int.from_bytes(hashlib.sha256(f.read().strip()).digest()[:8], "little")
    except OSError:
        return 0


_BOOT = _boot_id()


class ShardCache:
    """The node-local shard cache; see the module docstring for the protocol.

    Args:
        config: where and how big.
    """

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.stats = ReadStats()
        self._dirname = os.fspath(config.directory)
        self._dfd = -1
        self._pid = -1
        self._init_lock = threading.Lock()

    # pickles as its config: nothing live crosses a fork or spawn
    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardCache, (self.config,))

    def __repr__(self) -> str:
        return f"ShardCache({self._dirname!r}, max_bytes={self.config.max_bytes})"

    # ------------------------------------------------------------------ public API
    def require(self, nbytes: int, *, why: str = "the prefetch depth") -> None:
        """Fail now if the limit cannot hold ``nbytes`` (what one process needs at once).

        Raises:
            CacheTooSmallError: naming the minimum size.
        """
        if self.config.max_bytes < nbytes:
            raise CacheTooSmallError(
                f"cache {self._dirname!r}: max_bytes={self.config.max_bytes} is below the {nbytes} bytes "
                f"that {why} needs; set CacheConfig(max_bytes >= {nbytes}) or lower the prefetch depth"
            )

    def open_range(
        self,
        store: Store,
        shard: ShardInfo,
        start: int = 0,
        end: int | None = None,
        *,
        stats: ReadStats | None = None,
    ) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` of ``shard`` as they arrive (see module docstring).

        Args:
            store: the dataset store ``shard.path`` is relative to.
            shard: the shard as the index records it (size and CRC32C are trusted).
            start: first byte wanted.
            end: end of the range (default: the end of the shard).
            stats: an extra counter object updated beside :attr:`stats` (a prefetcher's).

        Raises:
            CorruptDataError: the downloaded shard does not match its size or checksum (the partial
                file is discarded; the next call fetches it again).
            CacheError: the cache directory is unsafe or unusable.
            StorageError: from the store, after its retries.
        """
        end = shard.bytes if end is None else end
        if not 0 <= start <= end <= shard.bytes:
            raise ValueError(f"range [{start}, {end}) is outside shard {store.url(shard.path)!r} of {shard.bytes} bytes")
        return self._open_range(store, shard, start, end, _Counters(self.stats, stats))

    def fetch(
        self,
        store: Store,
        shard: ShardInfo,
        start: int = 0,
        *,
        stats: ReadStats | None = None,
        on_started: Callable[[], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> bool:
        """Make sure ``shard`` is cached or being cached, without handing any bytes over.

        What a prefetcher calls ahead of the consumer, whose own :meth:`open_range` then reads the
        committed file or follows the download in flight: the download never waits for the
        consumer (so other processes following it are never throttled by this one's consumer),
        and no prefetched byte is held in memory.

        Args:
            store: the dataset store.
            shard: the shard as the index records it.
            start: where the consumer will start reading: the download fetches ``[start, size)``
                first, then ``[0, start)``.
            stats: an extra counter object updated beside :attr:`stats`.
            on_started: called once the shard is cached, or its download (by this call or by
                another reader) is under way: from then on ``open_range`` serves it.
            cancelled: polled after each piece; when it returns True the download stops (and
                stays resumable).

        Returns:
            False when the cache has no room for the shard (every shard in it is being read):
            the caller must stream it without the cache.
        """
        counters = _Counters(self.stats, stats)
        started = on_started or (lambda: None)
        if shard.bytes + _REC_SIZE * 4 > self.config.max_bytes:
            return False
        key = self._key(store, shard)
        url = store.url(shard.path)
        lease = self._lock(key + ".use", shared=True, blocking=True)
        if lease is None:  # pragma: no cover - blocking locks always return an fd
            return False
        try:
            os.utime(lease)
            while True:
                if self._exists(key + ".data"):
                    started()
                    return True
                dl = self._lock(key + ".dl", shared=False, blocking=False)
                if dl is None:  # someone else downloads it: the consumer will follow them
                    started()
                    return True
                try:
                    if self._exists(key + ".data"):
                        continue
                    part = self._prepare_part(key, shard, dl, min(start, shard.bytes), url, counters)
                    if part is None:
                        return False
                    started()
                    part_fd, rec = part
                    try:
                        for _ in self._download(store, shard, url, key, dl, part_fd, rec, shard.bytes, shard.bytes, counters, cancelled):
                            pass  # pragma: no cover - nothing is yielded for an empty range
                    finally:
                        os.close(part_fd)
                    return True
                finally:
                    os.close(dl)
        finally:
            os.close(lease)

    def contains(self, store: Store, shard: ShardInfo) -> bool:
        """Whether a committed file exists for ``shard`` (not verified; for tests and tools)."""
        try:
            st = os.stat(self._key(store, shard) + ".data", dir_fd=self._dir(), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode)

    def invalidate(self, store: Store, shard: ShardInfo) -> None:
        """Discard the cached copy of ``shard`` (e.g. after a per-sample checksum failed on it)."""
        name = self._key(store, shard) + ".data"
        with self._dir_lock():
            self._unlink(name)

    def usage(self) -> int:
        """Bytes used by the cache directory now (all its regular files)."""
        return self._scan()[0]

    # ------------------------------------------------------------------ the protocol
    def _open_range(self, store: Store, shard: ShardInfo, start: int, end: int, counters: _Counters) -> Iterator[bytes]:
        url = store.url(shard.path)
        if shard.bytes + _REC_SIZE * 4 > self.config.max_bytes:
            log.warning("shard %s (%d bytes) is larger than cache %s can hold; streaming it uncached", url, shard.bytes, self._dirname)
            yield from self._bypass(store, shard, start, end, counters)
            return
        key = self._key(store, shard)
        lease = self._lock(key + ".use", shared=True, blocking=True)
        assert lease is not None
        try:
            os.utime(lease)  # LRU clock
            pos = start
            while True:
                data_fd = self._open_committed(key, shard, url)
                if data_fd is not None:
                    counters.add(hits=1)
                    try:
                        for chunk in self._read_file(data_fd, pos, end):
                            counters.add(bytes_from_cache=len(chunk))
                            yield chunk
                    finally:
                        os.close(data_fd)
                    return
                dl = self._lock(key + ".dl", shared=False, blocking=False)
                if dl is not None:
                    try:
                        if self._exists(key + ".data"):
                            continue  # committed between our check and the lock
                        part = self._prepare_part(key, shard, dl, pos, url, counters)
                        if part is None:
                            os.close(dl)
                            dl = None
                            yield from self._bypass(store, shard, pos, end, counters)
                            return
                        part_fd, rec = part
                        try:
                            yield from self._download(store, shard, url, key, dl, part_fd, rec, pos, end, counters)
                        finally:
                            os.close(part_fd)
                        return
                    finally:
                        if dl is not None:
                            os.close(dl)
                followed = False
                for chunk in self._follow(key, shard, url, pos, end, counters):
                    if not followed:
                        counters.add(follows=1)
                        followed = True
                    pos += len(chunk)
                    counters.add(bytes_from_cache=len(chunk))
                    yield chunk
                if pos >= end:
                    return
                # the downloader went away (or committed): look again
        finally:
            os.close(lease)

    def _bypass(self, store: Store, shard: ShardInfo, start: int, end: int, counters: _Counters) -> Iterator[bytes]:
        counters.add(bypasses=1)
        got = start
        for chunk in store.iter_bytes(shard.path, start, end, chunk_size=self.config.chunk_size):
            got += len(chunk)
            counters.add(bytes_from_network=len(chunk))
            yield chunk
        if got != end:
            raise CorruptDataError(
                f"shard {store.url(shard.path)!r} ended after {got} bytes; the index says {shard.bytes}. "
                f"Re-run `streamio verify` on the dataset."
            )

    def _open_committed(self, key: str, shard: ShardInfo, url: str) -> int | None:
        """An fd of the verified committed file, or None (absent, or found bad and discarded)."""
        dfd = self._dir()
        name = key + ".data"
        try:
            fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise CacheError(f"cannot open cache file {self._path(name)!r} for {url}: {exc}") from exc
            log.warning("cache %s: %s is a symlink; removed, never followed", self._dirname, name)
            self._discard(name, None, url, counted=False)
            return None
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif st.st_size != shard.bytes:
            problem = f"has {st.st_size} bytes, the index says {shard.bytes}"
        else:
            rec = self._read_record_at(key)
            stamped = (
                rec is not None
                and rec.state == _COMMITTED
                and (rec.ino, rec.mtime_ns, rec.size, rec.boot) == (st.st_ino, st.st_mtime_ns, st.st_size, _BOOT)
            )
            if not stamped:
                value = self._crc_of(fd, shard.bytes)
                if value != parse_checksum(shard.checksum):
                    problem = f"has checksum {format_checksum(value)}, the index says {shard.checksum}"
                else:
                    self._stamp(key, st)
        if problem is None:
            return fd
        log.warning("cache file %s of %s %s: discarded, fetching the shard again", self._path(name), url, problem)
        self._discard(name, st.st_ino, url)
        os.close(fd)
        return None

    def _prepare_part(
        self, key: str, shard: ShardInfo, dl: int, split: int, url: str, counters: _Counters
    ) -> tuple[int, _Record] | None:
        """Under the download lock: resume a partial download or reserve room for a new one."""
        dfd = self._dir()
        name = key + ".part"
        rec = self._read_record(dl) or _Record()
        try:
            fd = os.open(name, os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            fd = -1
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise CacheError(f"cannot open cache file {self._path(name)!r} for {url}: {exc}") from exc
            self._unlink(name)
            fd = -1
        if fd >= 0:
            st = os.fstat(fd)
            if (
                stat.S_ISREG(st.st_mode)
                and rec.state == _DOWNLOADING
                and rec.ino == st.st_ino
                and rec.size == shard.bytes == st.st_size
            ):
                counters.add(resumes=1, misses=1)
                log.debug("resuming download of %s at %d+%d / %d", url, rec.split, rec.hi, rec.lo)
                return fd, rec
            os.close(fd)
            self._unlink(name)  # a partial file that no record describes: nothing read it
        with self._dir_lock():
            if not self._make_room(shard.bytes + 4 * _REC_SIZE, url):
                log.debug("cache %s full of leased shards; streaming %s uncached", self._dirname, url)
                return None
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                if shard.bytes:
                    try:
                        os.posix_fallocate(fd, 0, shard.bytes)
                    except OSError:  # filesystems without fallocate: a sparse file of the right size
                        os.ftruncate(fd, shard.bytes)
            except BaseException:
                os.close(fd)
                self._unlink(name)
                raise
        rec = _Record(_DOWNLOADING, os.fstat(fd).st_ino, split, 0, 0, 0, shard.bytes, _BOOT)
        if split == shard.bytes:
            rec.split = 0
        self._write_record(dl, rec)
        counters.add(misses=1)
        return fd, rec

    def _download(
        self,
        store: Store,
        shard: ShardInfo,
        url: str,
        key: str,
        dl: int,
        part_fd: int,
        rec: _Record,
        pos: int,
        end: int,
        counters: _Counters,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[bytes]:
        """Fetch the missing intervals into ``part_fd``, yield ``[pos, end)`` as it arrives, commit.

        ``cancelled`` (polled after each piece) stops the download uncommitted and resumable.
        """
        fresh = rec.hi == 0 and rec.lo == 0 and rec.split == 0
        crc = Crc32c() if fresh else None
        # already-valid bytes first (a resumed download)
        for chunk in self._serve(part_fd, rec, pos, end):
            pos += len(chunk)
            yield chunk
        segments = [(rec.split + rec.hi, shard.bytes, "hi"), (rec.lo, rec.split, "lo")]
        for seg_start, seg_end, which in segments:
            at = seg_start
            if at >= seg_end:
                continue
            for chunk in store.iter_bytes(shard.path, at, seg_end, chunk_size=self.config.chunk_size):
                n = len(chunk)
                if at + n > seg_end:
                    raise CorruptDataError(f"shard {url!r} returned more bytes than asked for [{seg_start}, {seg_end})")
                _pwrite_all(part_fd, chunk, at)
                if crc is not None:
                    crc.update(chunk)
                counters.add(bytes_from_network=n)
                if which == "hi":
                    rec.hi += n
                else:
                    rec.lo += n
                self._write_record(dl, rec)
                if at <= pos < at + n and pos < end:
                    piece = chunk if (pos == at and at + n <= end) else chunk[pos - at : min(end, at + n) - at]
                    pos += len(piece)
                    yield piece
                at += n
                for more in self._serve(part_fd, rec, pos, end):
                    pos += len(more)
                    yield more
                if cancelled is not None and cancelled():
                    log.debug("download of %s stopped at %d+%d / %d; resumable", url, rec.split, rec.hi, rec.lo)
                    return
            if at != seg_end:
                raise CorruptDataError(
                    f"shard {url!r} ended after {at} bytes; the index says {shard.bytes}. "
                    f"Re-run `streamio verify` on the dataset."
                )
        for more in self._serve(part_fd, rec, pos, end):
            pos += len(more)
            yield more
        self._commit(key, shard, url, dl, part_fd, rec, crc)

    def _serve(self, fd: int, rec: _Record, pos: int, end: int) -> Iterator[bytes]:
        """Yield the bytes of ``[pos, end)`` that the record says are valid, from the file."""
        while pos < end:
            avail = rec.available_end(pos)
            if avail is None or avail <= pos:
                return
            for chunk in self._read_file(fd, pos, min(avail, end)):
                pos += len(chunk)
                yield chunk

    def _commit(self, key: str, shard: ShardInfo, url: str, dl: int, part_fd: int, rec: _Record, crc: Crc32c | None) -> None:
        value = crc.value if crc is not None else self._crc_of(part_fd, shard.bytes)
        if value != parse_checksum(shard.checksum):
            rec.state = _FAILED
            self._write_record(dl, rec)
            with self._dir_lock():
                self._unlink(key + ".part")
            raise CorruptDataError(
                f"shard {url!r} arrived with checksum {format_checksum(value)}, the index says {shard.checksum}; "
                f"the download was discarded and is fetched again on the next read (if this repeats, run "
                f"`streamio verify` on the dataset)"
            )
        if self.config.fsync:
            os.fsync(part_fd)
        st = os.fstat(part_fd)
        rec.state, rec.mtime_ns, rec.boot = _COMMITTED, st.st_mtime_ns, _BOOT
        with self._dir_lock():
            self._write_record(dl, rec)
            os.replace(key + ".part", key + ".data", src_dir_fd=self._dir(), dst_dir_fd=self._dir())
        log.debug("cached %s (%d bytes) as %s.data", url, shard.bytes, key)

    def _follow(self, key: str, shard: ShardInfo, url: str, pos: int, end: int, counters: _Counters) -> Iterator[bytes]:
        """Read behind another reader's download; return early if it stops or commits.

        Time spent waiting for the download to progress is counted as ``stall_s``.
        """
        dfd = self._dir()
        delay = self.config.poll_interval
        start = pos
        try:
            fd = os.open(key + ".part", os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, dir_fd=dfd)
        except OSError:
            # not created yet, or committed/removed meanwhile: let the caller look again
            if not self._exists(key + ".data") and self._download_locked(key):
                time.sleep(delay)
                counters.add(stall_s=delay)
            return
        try:
            ino = os.fstat(fd).st_ino
            idle = 0.0
            yielded = False
            while pos < end:
                rec = self._read_record_at(key)
                if rec is None or rec.ino != ino or rec.state in (_EMPTY, _FAILED):
                    if yielded:
                        # the file we read from was discarded (checksum failure) under us
                        raise CorruptDataError(
                            f"shard {url!r}: the download this reader followed failed its checksum and was "
                            f"discarded after {pos - start} bytes were read; read the shard again"
                        )
                    time.sleep(delay)  # a download being set up, or one that just failed: look again
                    counters.add(stall_s=delay)
                    return
                moved = False
                for chunk in self._serve(fd, rec, pos, end):
                    pos += len(chunk)
                    moved = yielded = True
                    yield chunk
                if pos >= end:
                    return
                if moved:
                    idle = 0.0
                    continue
                if not self._download_locked(key):
                    # the downloader is gone (killed, or stopped early): one last look, then take over
                    rec = self._read_record_at(key)
                    if rec is not None and rec.ino == ino and rec.available_end(pos) is not None:
                        continue
                    return
                nap = min(delay * (1 + idle * 20), 0.05)
                time.sleep(nap)
                counters.add(stall_s=nap)
                idle += delay
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ space
    def _make_room(self, need: int, url: str) -> bool:
        """Under the directory lock: evict LRU unleased shards until ``need`` more bytes fit."""
        usage, free, entries = self._scan()
        limit = self.config.max_bytes
        floor = self.config.min_free_bytes

        def fits() -> bool:
            return usage + need <= limit and free - need >= floor

        # lock files of shards that were never cached (streamed uncached) or already evicted
        orphans = [e["key"] for e in entries.values() if e["data"] is None and e["part"] is None]
        for key in orphans[:64]:
            self._evict(key)
        if fits():
            return True
        data = sorted((e for e in entries.values() if e["data"] is not None), key=lambda e: e["used"])
        parts = [e for e in entries.values() if e["data"] is None and e["part"] is not None]
        for entry in data + parts:
            freed = self._evict(entry["key"])
            if freed:
                usage -= freed
                free += freed
                self.stats.add(evictions=1)
                log.debug("evicted %s (%d bytes) from %s to fit %s", entry["key"], freed, self._dirname, url)
                if fits():
                    return True
        return False

    def _evict(self, key: str) -> int:
        """Remove every file of ``key`` if nobody reads or downloads it; bytes freed (0: in use)."""
        lease = self._lock(key + ".use", shared=False, blocking=False)
        if lease is None:
            return 0
        try:
            dl = self._lock(key + ".dl", shared=False, blocking=False)
            if dl is None:
                return 0
            try:
                freed = 0
                for suffix in (".data", ".part"):
                    freed += self._unlink(key + suffix)
                freed += self._unlink(key + ".dl")
                self._unlink(key + ".use")
                return freed
            finally:
                os.close(dl)
        finally:
            os.close(lease)

    def _scan(self) -> tuple[int, int, dict[str, dict[str, Any]]]:
        dfd = self._dir()
        usage = 0
        entries: dict[str, dict[str, Any]] = {}
        with os.scandir(dfd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                usage += st.st_size
                key, dot, suffix = entry.name.partition(".")
                if not dot or not key:
                    continue
                e = entries.setdefault(key, {"key": key, "data": None, "part": None, "used": 0})
                if suffix in ("data", "part"):
                    e[suffix] = st.st_size
                    e["used"] = max(e["used"], st.st_mtime_ns)
                elif suffix == "use":
                    e["used"] = max(e["used"], st.st_mtime_ns)
        vfs = os.statvfs(dfd)
        return usage, vfs.f_bavail * vfs.f_frsize, entries

    # ------------------------------------------------------------------ files, locks, records
    def _dir(self) -> int:
        """The cache directory's fd in this process (opened, and the directory checked, on first use)."""
        if self._pid == os.getpid():
            return self._dfd
        with self._init_lock:
            if self._pid != os.getpid():
                self._dfd = self._open_dir()
                self._pid = os.getpid()
        return self._dfd

    def _open_dir(self) -> int:
        path = self._dirname
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create cache directory {path!r}: {exc}; choose a writable local path") from exc
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise CacheError(f"cache directory {path!r} is a symlink or not a directory; point CacheConfig at a real directory")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise CacheError(f"cache directory {path!r} belongs to uid {st.st_uid}, not to this user; use a directory of your own")
        if st.st_mode & 0o022:
            raise CacheError(
                f"cache directory {path!r} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); run `chmod 700 {path}`"
            )
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
        except OSError as exc:  # swapped for a symlink or removed since the check: refuse, never follow
            raise CacheError(f"cache directory {path!r} changed while being opened ({exc.strerror or exc}); retry") from exc
        if os.fstat(fd).st_ino != st.st_ino:
            os.close(fd)
            raise CacheError(f"cache directory {path!r} changed while being opened; retry")
        return fd

    def _path(self, name: str) -> str:
        return os.path.join(self._dirname, name)

    @staticmethod
    def _key(store: Store, shard: ShardInfo) -> str:
        ident = "\0".join((store.root_url, shard.path, str(shard.bytes), shard.checksum))
        return hashlib.sha256(ident.encode()).hexdigest()[:40]

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._dir(), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def _unlink(self, name: str) -> int:
        """Remove ``name`` (whatever it is, never following it); its size, 0 if it was absent."""
        try:
            size = os.stat(name, dir_fd=self._dir(), follow_symlinks=False).st_size
            os.unlink(name, dir_fd=self._dir())
        except FileNotFoundError:
            return 0
        return size

    def _discard(self, name: str, ino: int | None, url: str, *, counted: bool = True) -> None:
        """Remove a bad committed file, unless someone replaced it meanwhile."""
        with self._dir_lock():
            try:
                st = os.stat(name, dir_fd=self._dir(), follow_symlinks=False)
            except FileNotFoundError:
                return
            if ino is None or st.st_ino == ino:
                os.unlink(name, dir_fd=self._dir())
        if counted:
            self.stats.add(discarded=1)

    def _lock(self, name: str, *, shared: bool, blocking: bool) -> int | None:
        """flock ``name`` (created 0600 if missing, never through a symlink); the fd, or None if busy.

        A symlink or other non-regular file (FIFO, socket) under the name is removed, never used;
        one that cannot be removed or opened (a directory) raises :class:`CacheError` naming it.
        """
        dfd = self._dir()
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
        while True:
            try:
                fd = os.open(name, _LOCK_FLAGS, 0o600, dir_fd=dfd)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise CacheError(
                        f"cannot open lock file {self._path(name)!r}: {exc.strerror or exc}; remove it: the cache "
                        f"directory {self._dirname!r} must hold only the cache's own files"
                    ) from exc
                log.warning("cache %s: lock file %s is a symlink; removed, never followed", self._dirname, name)
                self._unlink(name)
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                log.warning("cache %s: lock file %s is not a regular file; removed, never used", self._dirname, name)
                self._unlink(name)
                continue
            try:
                fcntl.flock(fd, flags)
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                os.close(fd)
                continue
            if st.st_ino == os.fstat(fd).st_ino:
                return fd
            os.close(fd)  # deleted and re-created by an evictor meanwhile: lock the current file

    def _dir_lock(self) -> _DirLock:
        return _DirLock(self)

    def _download_locked(self, key: str) -> bool:
        fd = self._lock(key + ".dl", shared=False, blocking=False)
        if fd is None:
            return True
        os.close(fd)
        return False

    def _read_record_at(self, key: str) -> _Record | None:
        try:
            fd = os.open(key + ".dl", os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, dir_fd=self._dir())
        except OSError:
            return None
        try:
            return self._read_record(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)

    @staticmethod
    def _read_record(fd: int) -> _Record | None:
        for _ in range(100):  # a torn read of a concurrent pwrite fails the CRC: read again
            raw = os.pread(fd, _REC_SIZE, 0)
            if len(raw) < _REC_SIZE:
                return None
            body, (check,) = raw[: _REC.size], struct.unpack("<I", raw[_REC.size :])
            if crc32c(body) == check:
                magic, *values = _REC.unpack(body)
                return _Record(*values) if magic == _MAGIC else None
        return None

    @staticmethod
    def _write_record(fd: int, rec: _Record) -> None:
        os.pwrite(fd, rec.pack(), 0)

    def _stamp(self, key: str, st: os.stat_result) -> None:
        """Record that the committed file with this inode/size/mtime was verified in this boot."""
        dl = self._lock(key + ".dl", shared=False, blocking=False)
        if dl is None:
            return
        try:
            self._write_record(dl, _Record(_COMMITTED, st.st_ino, 0, st.st_size, 0, st.st_mtime_ns, st.st_size, _BOOT))
        finally:
            os.close(dl)

    def _read_file(self, fd: int, pos: int, end: int) -> Iterator[bytes]:
        size = self.config.chunk_size
        while pos < end:
            chunk = os.pread(fd, min(size, end - pos), pos)
            if not chunk:
                raise CacheError(f"cache file in {self._dirname!r} ended at byte {pos}, before {end}; it will be re-verified")
            pos += len(chunk)
            yield chunk

    def _crc_of(self, fd: int, size: int) -> int:
        value = 0
        for chunk in self._read_file(fd, 0, size):
            value = crc32c(chunk, value)
        return value


class _DirLock:
    """The directory lock (``.lock``), exclusive, as a context manager."""

    def __init__(self, cache: ShardCache) -> None:
        self._cache = cache
        self._fd = -1

    def __enter__(self) -> None:
        fd = self._cache._lock(_DIR_LOCK, shared=False, blocking=True)  # never through a symlink, as every lock
        if fd is None:  # pragma: no cover - blocking locks always return an fd
            raise CacheError(f"cannot lock {self._cache._path(_DIR_LOCK)!r}")
        self._fd = fd

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


class _Counters:
    """Updates the cache's stats and, if given, a caller's."""

    __slots__ = ("_targets",)

    def __init__(self, own: ReadStats, extra: ReadStats | None) -> None:
        self._targets = (own,) if extra is None or extra is own else (own, extra)

    def add(self, **deltas: float) -> None:
        for t in self._targets:
            t.add(**deltas)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
