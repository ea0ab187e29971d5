"""Local files as sample members: which entries of a source tree may be packed, and reading them safely.

``streamio shard DIR`` packs whatever a directory holds into shards that are then uploaded, and a
tree comes from anywhere (an extracted archive, a shared disk), so what is read is decided here,
from ``lstat``/``stat`` alone, before any file is opened:

* **Regular files only.** A FIFO, socket or device is refused and never opened: opening a FIFO
  for reading waits for a writer, for ever; a device can be endless.
* **Links stay inside the source.** A symbolic link to a regular file whose target resolves inside
  the source tree is read (the target's bytes, under the link's name: what ``cp -rL`` would give).
  One whose target resolves outside it is refused unless the caller allows it
  (``--follow-symlinks``): a link planted in a tree (to ``~/.aws/credentials``) would otherwise be
  packed and uploaded. Links to directories are never followed (cycles, samples packed twice);
  dangling links are refused.
* **Sizes before bytes.** :class:`LocalFile` records the size ``stat`` gave; a sample over the
  readers' bound is refused on it before a byte is read (:mod:`streamio.data.write.sources`).

Reading re-checks what listing decided: a file is opened by
:func:`~streamio.storage.backends.local.open_regular` (``O_NONBLOCK``: a FIFO swapped in meanwhile
cannot block the open; ``O_NOFOLLOW`` on its resolved path; then ``fstat``-ed), the one opener of
every local reader of streamio: not a regular file any more, or a size that changed, is an error
naming the file. A :class:`LocalFile`
is read in pieces of :data:`CHUNK` bytes (:meth:`LocalFile.chunks`), so the writer streams it into
the shard being filled: memory is one piece, whatever the file's size.

Refusals are :class:`~streamio.errors.SourceError` (``streamio shard`` exits 2: the source, not
the data, is what the user must change); a file that cannot be read is a
:class:`~streamio.errors.DatasetError`.
"""

from __future__ import annotations

import logging
import os
import stat
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from streamio.errors import DatasetError, NotRegularFileError, SourceError
from streamio.storage import Store
from streamio.storage.backends import is_file_url
from streamio.storage.backends.local import file_kind, open_regular

__all__ = ["CHUNK", "LocalFile", "entry_problem", "local_file", "refuse_special_shards", "tree_files"]

log = logging.getLogger(__name__)

#: Bytes read at a time from a local file.
CHUNK = 4 << 20


@dataclass(frozen=True)
class LocalFile:
    """The bytes of a regular local file, read when the writer packs them.

    Attributes:
        path: the file opened (a link's target, resolved).
        size: its size when it was listed; reading it finds exactly that many bytes or fails.
        name: how messages name it (the path given, e.g. the link's).
    """

    path: str
    size: int
    name: str

    def chunks(self, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """The file's bytes in pieces of at most ``chunk_size``.

        Raises:
            SourceError: it is no longer a regular file (swapped for a FIFO, a link, a device).
            DatasetError: it cannot be read, or its size changed since it was listed.
        """
        fd = self._open()
        try:
            left = self.size
            while left > 0:
                piece = os.read(fd, min(chunk_size, left))
                if not piece:
                    break
                left -= len(piece)
                yield piece
            if left or os.read(fd, 1):
                raise DatasetError(
                    f"{self.name} changed while it was read: it had {self.size} bytes when listed. Shard a source "
                    f"that no one is writing to."
                )
        finally:
            os.close(fd)

    def read(self) -> bytes:
        """The whole file (what a caller that wants ``bytes`` gets)."""
        return b"".join(self.chunks())

    def _open(self) -> int:
        try:
            return open_regular(self.path, name=self.name, follow_symlinks=False)
        except NotRegularFileError as exc:  # swapped in since it was listed
            raise SourceError(str(exc)) from exc
        except OSError as exc:
            raise DatasetError(
                f"cannot read {self.name}: {exc.strerror or exc}. Fix it or remove it from the source."
            ) from exc


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def entry_problem(path: str, root: str | None, *, follow_symlinks: bool) -> tuple[str | None, LocalFile | None]:
    """Whether the entry ``path`` may be packed: ``(why not, None)`` or ``(None, the file to read)``.

    Decided from ``lstat``/``stat`` alone: nothing is opened. ``root`` is the source tree's real
    path (links must stay inside it), or None where any target may be read (``follow_symlinks``
    allows that too).

    Raises:
        DatasetError: the entry cannot even be examined (permission denied on it).
    """
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return None, LocalFile(path, st.st_size, path)
        if not stat.S_ISLNK(st.st_mode):
            return f"{path} is {file_kind(st.st_mode)}", None
        target = os.path.realpath(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return f"{path} is a symbolic link to {target}, which does not exist", None
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}. Fix it or remove it from the source.") from exc
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is a symbolic link to {target}, {file_kind(st.st_mode)}", None
    if root is not None and not follow_symlinks and not _inside(target, root):
        return f"{path} is a symbolic link to {target}, outside the source {root}", None
    return None, LocalFile(target, st.st_size, path)


def local_file(path: str) -> LocalFile:
    """The regular file ``path`` (a link is followed wherever it points: the caller named it).

    Raises:
        SourceError: not a regular file (a FIFO, a device, a directory, a dangling link).
        DatasetError: it cannot be examined.
    """
    problem, found = entry_problem(path, None, follow_symlinks=True)
    if found is None:
        raise SourceError(f"{problem}: only regular files are packed. Name a regular file instead.")
    return found


def refuse_special_shards(store: Store, paths: Iterable[str]) -> None:
    """Refuse, before any is read, the shards of a local ``store`` that are not regular files (a FIFO
    named ``data-000009.tar`` would otherwise stop the whole read); nothing to check elsewhere.

    Raises:
        SourceError: one of ``paths`` is a FIFO, socket, device, directory or dangling link.
        DatasetError: one cannot be examined.
    """
    if not is_file_url(store.root_url):
        return
    for path in paths:
        url = store.url(path)
        problem, _ = entry_problem(urllib.parse.urlsplit(url).path if "://" in url else url, None, follow_symlinks=True)
        if problem is not None:
            raise SourceError(
                f"{problem}: only regular files are read as shards. Remove it, or name the shards with a pattern "
                f"that leaves it out."
            )


def tree_files(root: str, *, follow_symlinks: bool) -> Iterator[tuple[str, LocalFile]]:
    """Every file below ``root`` that may be packed: ``(its path below root, "/"-separated; the file)``, sorted.

    Hidden entries (``.name``) are skipped. Every entry that may not be packed (see the module
    docstring) is collected while walking and all are named in one error at the end, so one run
    lists everything to fix.

    Raises:
        SourceError: entries that are never packed: FIFOs, sockets, devices, links to directories,
            dangling links, links leaving ``root`` (unless ``follow_symlinks``).
        DatasetError: a directory or an entry that cannot be examined.
    """
    real_root = os.path.realpath(root)
    refused: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_walk_error):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not _linked_dir(dirpath, d, refused))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if name.startswith("."):
                log.info("skipping hidden file %s", full)
                continue
            problem, found = entry_problem(full, real_root, follow_symlinks=follow_symlinks)
            if found is None:
                refused.append(str(problem))
            else:
                yield os.path.relpath(full, root).replace(os.sep, "/"), found
    if refused:
        raise SourceError(_refusal(root, refused))


def _walk_error(exc: OSError) -> None:
    raise DatasetError(
        f"cannot list {exc.filename}: {exc.strerror or exc}. Fix it or remove it from the source."
    ) from exc


def _linked_dir(dirpath: str, name: str, refused: list[str]) -> bool:
    """Whether ``dirpath/name`` is a link to a directory (refused: links to directories are not followed)."""
    path = os.path.join(dirpath, name)
    if not os.path.islink(path):
        return False
    refused.append(f"{path} is a symbolic link to the directory {os.path.realpath(path)} (not followed)")
    return True


def _refusal(root: str, refused: list[str], shown: int = 5) -> str:
    more = f"; ... (+{len(refused) - shown} more)" if len(refused) > shown else ""
    return (
        f"{root} holds {len(refused)} entr{'y' if len(refused) == 1 else 'ies'} `streamio shard` does not pack: "
        f"{'; '.join(refused[:shown])}{more}. Only regular files are read, and symbolic links only to regular "
        f"files inside the source (follow_symlinks / --follow-symlinks also reads links leaving it). Remove them, "
        f"or shard a directory without them."
    )
