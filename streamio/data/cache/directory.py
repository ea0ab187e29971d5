"""The cache directory: checked once per process, every file opened relative to it, never followed.

Safety. The directory is created ``0700``; an existing one must be a real directory owned by this
user and not writable by others. Every file is opened relative to a directory file descriptor with
``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a planted FIFO cannot block an open); a symlink or
non-regular file found under a cache name (``.lock`` included) is removed, never followed, and one
that cannot be (a directory) raises :class:`~streamio.errors.CacheError` naming it.

Locks. ``flock`` locks belong to an open file description, so they work between threads of one
process as between processes, and the kernel drops them when a process dies (``kill -9``
included): there is no lease to expire and no stale lock to clean. Lock files that eviction deletes
are re-checked after locking (inode of the fd == inode at the path), the standard pattern for
deletable lock files. ``.lock`` is the directory lock, held briefly for reservations, eviction,
discard and commit; a process that holds a shard's ``KEY.dl`` may take it, never the reverse.

Writes refused (:func:`write_refused`). The kernel can refuse a cache write for reasons that are
not the data's: the process's file-size limit (``ulimit -f``: ``EFBIG``; the kernel's ``SIGXFSZ``
is ignored by Python from start-up, so it arrives as an error, not a kill), a full disk or quota,
a read-only filesystem, permissions, or the directory removed while the job runs. Each becomes a
:class:`~streamio.errors.CacheWriteError` whose advice fits its cause; the cache's error policy
(``CacheConfig.on_error``) decides whether the read then goes on without the cache.

Fork/spawn safety: the descriptor is opened lazily per process id, so an object that crossed a
fork opens its own.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import resource
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from streamio.checksum import crc32c
from streamio.errors import CacheError, CacheWriteError
from streamio.flocks import release

log = logging.getLogger(__name__)

__all__ = ["DIR_LOCK", "REFUSALS", "CacheDirectory", "crc_of", "pwrite_all", "read_chunks", "write_refused"]

DIR_LOCK = ".lock"
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a planted FIFO must not block (no effect on files)
_SAFE = O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | _SAFE
REFUSALS = frozenset({errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT})
"""``errno`` values of a write the system refused (not the data's fault): see :func:`write_refused`."""


def write_refused(exc: OSError, path: str, what: str) -> CacheWriteError | None:
    """The :class:`CacheWriteError` for ``exc`` (writing ``what`` in the cache directory ``path``), with
    the advice of its cause; None when ``exc`` is not a refused write.
    """
    code = exc.errno
    if code not in REFUSALS:
        return None
    if code == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        shown = "unlimited" if limit == resource.RLIM_INFINITY else f"{limit} bytes"
        why = (f"the file-size limit of this process (RLIMIT_FSIZE, `ulimit -f`: {shown}) refuses it; raise the "
               "limit (`ulimit -f unlimited`) or write smaller shards")
    elif code in (errno.ENOSPC, errno.EDQUOT):
        why = ("its filesystem is full (or your quota is): free space there, or lower CacheConfig(max_bytes=...) "
               "/ raise min_free_bytes")
    elif code == errno.ENOENT:
        why = ("the directory was removed while this process was using it: recreate it (`mkdir -m 700`) "
               "or restart the job")
    else:
        kind = "it is on a read-only filesystem" if code == errno.EROFS else "this user may not write there"
        why = f"{kind}: point CacheConfig(directory=...) at a writable local directory of your own"
    return CacheWriteError(f"cache {path!r} cannot write {what} ({exc.strerror or exc}): {why}")


class CacheDirectory:
    """One cache directory, as seen from this process.

    Args:
        path: the directory (created ``0700`` on first use if missing).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._pid = -1
        self._init_lock = threading.Lock()

    def fd(self) -> int:
        """The directory's fd in this process (opened, and the directory checked, on first use)."""
        if self._pid == os.getpid():
            return self._fd
        with self._init_lock:
            if self._pid != os.getpid():
                self._fd = self._open()
                self._pid = os.getpid()
        return self._fd

    def _open(self) -> int:
        path = self.path
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            refused = write_refused(exc, path, "its directory")
            if refused is not None:
                raise refused from exc
            raise CacheError(f"cannot create cache directory {path!r}: {exc}; choose a writable local path") from exc
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise CacheError(
                f"cache directory {path!r} is a symlink or not a directory; point CacheConfig at a real directory"
            )
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise CacheError(
                f"cache directory {path!r} belongs to uid {st.st_uid}, not to this user; use a directory of your own"
            )
        if st.st_mode & 0o022:
            raise CacheError(
                f"cache directory {path!r} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                f"run `chmod 700 {path}`"
            )
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        except OSError as exc:  # swapped for a symlink or removed since the check: refuse, never follow
            raise CacheError(
                f"cache directory {path!r} changed while being opened ({exc.strerror or exc}); retry"
            ) from exc
        if os.fstat(fd).st_ino != st.st_ino:
            os.close(fd)
            raise CacheError(f"cache directory {path!r} changed while being opened; retry")
        return fd

    def where(self, name: str) -> str:
        """The full path of ``name``, for messages."""
        return os.path.join(self.path, name)

    # ------------------------------------------------------------------ files
    def exists(self, name: str) -> bool:
        """Whether anything (not followed) is at ``name``."""
        try:
            os.stat(name, dir_fd=self.fd(), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def is_file(self, name: str) -> bool:
        """Whether a regular file (not followed) is at ``name``."""
        try:
            st = os.stat(name, dir_fd=self.fd(), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode)

    def open_file(self, name: str, flags: int, *, what: str) -> int | None:
        """Open ``name`` never through a symlink, never blocking; None if it is absent.

        A symlink under the name is removed (with a warning) and reported as absent.

        Raises:
            CacheError: any other failure to open it, naming the file and ``what`` it holds.
        """
        try:
            return os.open(name, flags | _SAFE, dir_fd=self.fd())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise self._unusable(name, f"cache file ({what})", exc) from exc
        log.warning("cache %s: %s is a symlink; removed, never followed", self.path, name)
        self.discard(name, None)
        return None

    def open_regular(self, name: str) -> int | None:
        """A read-only fd of the regular file ``name``, or None (absent, unreadable or not a file)."""
        try:
            fd = os.open(name, os.O_RDONLY | _SAFE, dir_fd=self.fd())
        except OSError:
            return None
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
        return None

    def unlink(self, name: str) -> int:
        """Remove ``name`` (whatever it is, never following it); its size, 0 if it was absent.

        Raises:
            CacheError: it cannot be removed (a directory), naming it.
        """
        try:
            size = os.stat(name, dir_fd=self.fd(), follow_symlinks=False).st_size
        except FileNotFoundError:
            return 0
        return size if self._remove(name) else 0

    def discard(self, name: str, ino: int | None) -> bool:
        """Under the directory lock, remove ``name`` unless it was replaced meanwhile (inode != ``ino``).

        Returns:
            False if nothing was at ``name``.

        Raises:
            CacheError: it cannot be removed (a directory), naming it.
        """
        with self.locked():
            try:
                st = os.stat(name, dir_fd=self.fd(), follow_symlinks=False)
            except FileNotFoundError:
                return False
            if ino is None or st.st_ino == ino:
                self._remove(name)
        return True

    def _remove(self, name: str) -> bool:
        """``unlink`` ``name``; False if it was gone already."""
        try:
            os.unlink(name, dir_fd=self.fd())
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise CacheError(
                f"cannot remove {self.where(name)!r}: {exc.strerror or exc}; remove it: the cache directory "
                f"{self.path!r} must hold only the cache's own files"
            ) from exc
        return True

    def entries(self) -> Iterator[tuple[str, os.stat_result]]:
        """Name and ``lstat`` of every regular file in the directory (entries removed meanwhile skipped)."""
        with os.scandir(self.fd()) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield entry.name, st

    def free_bytes(self) -> int:
        """Free space of the filesystem, as an unprivileged user may use it."""
        vfs = os.statvfs(self.fd())
        return vfs.f_bavail * vfs.f_frsize

    # ------------------------------------------------------------------ locks
    def lock(self, name: str, *, shared: bool, blocking: bool) -> int | None:
        """flock ``name`` (created 0600 if missing, never through a symlink); the fd, or None if busy.

        A symlink or other non-regular file (FIFO, socket) under the name is removed, never used;
        one that cannot be removed or opened (a directory) raises :class:`CacheError` naming it.
        """
        dfd = self.fd()
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
        while True:
            fd = self._open_lock_file(name)
            if fd is None:
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

    def _unusable(self, name: str, kind: str, exc: OSError) -> CacheError:
        """The error for a cache name this cache cannot open: a refused write (:func:`write_refused`),
        or something there it cannot open (not a symlink)."""
        refused = write_refused(exc, self.path, f"{kind} {name!r}")
        if refused is not None:
            return refused
        return CacheError(
            f"cannot open {kind} {self.where(name)!r}: {exc.strerror or exc}; remove it: the "
            f"cache directory {self.path!r} must hold only the cache's own files"
        )

    def _open_lock_file(self, name: str) -> int | None:
        """An fd of the regular lock file ``name``; None after removing something hostile there."""
        try:
            fd = os.open(name, _LOCK_FLAGS, 0o600, dir_fd=self.fd())
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise self._unusable(name, "lock file", exc) from exc
            log.warning("cache %s: lock file %s is a symlink; removed, never followed", self.path, name)
            self.unlink(name)
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            log.warning("cache %s: lock file %s is not a regular file; removed, never used", self.path, name)
            self.unlink(name)
            return None
        return fd

    def is_locked(self, name: str) -> bool:
        """Whether someone holds ``name`` (probed with a non-blocking exclusive lock)."""
        fd = self.lock(name, shared=False, blocking=False)
        if fd is None:
            return True
        release(fd)
        return False

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory lock (``.lock``, exclusive) for the ``with`` block."""
        fd = self.lock(DIR_LOCK, shared=False, blocking=True)  # never through a symlink, as every lock
        if fd is None:  # pragma: no cover - blocking locks always return an fd
            raise CacheError(f"cannot lock {self.where(DIR_LOCK)!r}")
        try:
            yield
        finally:
            release(fd)


# ---------------------------------------------------------------------- descriptor I/O
def read_chunks(fd: int, pos: int, end: int, *, chunk_size: int, where: str) -> Iterator[bytes]:
    """Yield ``[pos, end)`` of ``fd`` in pieces of at most ``chunk_size``.

    Raises:
        CacheError: the file ends before ``end`` (``where`` names its directory).
    """
    while pos < end:
        chunk = os.pread(fd, min(chunk_size, end - pos), pos)
        if not chunk:
            raise CacheError(f"cache file in {where!r} ended at byte {pos}, before {end}; it will be re-verified")
        pos += len(chunk)
        yield chunk


def crc_of(fd: int, size: int, *, chunk_size: int, where: str) -> int:
    """CRC32C of the first ``size`` bytes of ``fd``."""
    value = 0
    for chunk in read_chunks(fd, 0, size, chunk_size=chunk_size, where=where):
        value = crc32c(chunk, value)
    return value


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
