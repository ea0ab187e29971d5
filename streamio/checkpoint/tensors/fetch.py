"""Reading a checkpoint's parts, verified: the tensors a restore needs, and byte spans of the ranks' streams.

:func:`load_tensors` reads the parts holding the tensors a restore needs (concurrent GETs: whole
parts, or with block checksums only the blocks holding them) and returns them as verified views,
nothing copied yet. A restore onto another sharding needs a few spans of each saved rank's stream (the rows of the
chunks that overlap the boxes this rank now holds), not whole parts. :func:`fetch_spans` maps
each span onto the parts that hold it, widens it to the part's checksummed *blocks*
(``FileEntry.blocks``, written for every save with sharded state), merges what touches within a
part, reads each merged range with one ranged GET (concurrently, under the store's retry policy)
and checks every block's CRC32C in the reading thread before anything is returned. A part
without blocks (compressed, or written without them) is read whole and checked against its
part checksum, as a replicated restore does. Bytes that do not verify are read once more before
the part is judged damaged (:func:`read_confirmed`): a byte flipped on the way is not the store's.

The result is a map ``rank -> {stream offset: bytes}`` of verified pieces, readable with
:class:`~.serialize.StreamReader`: pieces never overlap and each span lies inside consecutive pieces.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from streamio import threads
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.entries import FileEntry, TensorEntry
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.tensors.copies import VerifiedTensor
from streamio.checkpoint.tensors.serialize import StreamReader, decode_part, verify_file
from streamio.checksum import crc32c, format_checksum
from streamio.errors import CorruptDataError, StreamioError, TransientStorageError
from streamio.metrics.catalog import CHECKPOINT_BYTES
from streamio.pool import gather, run_parallel
from streamio.storage import Store

__all__ = ["Places", "Read", "Received", "Span", "check_raw", "fetch_spans", "load_tensors", "places_of",
           "plan_reads", "read_confirmed", "read_nearest", "read_raw", "tensor_spans", "verify_blocks"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Places:
    """The stores a save's parts may be read from, nearest first.

    A part is read from the local tier's copy of the rank that wrote it when ``local`` has one
    (that rank's local root: this rank's own, or a sibling's on the same node), else from
    ``root``; a local copy that is missing, fails its checksum or cannot be read (a failing
    disk, a directory or FIFO in its place) falls back to the root, never loads (docs/design.md
    "Local tier").

    Attributes:
        root: the durable root (what messages name).
        local: the local root holding ``rank``'s parts, or None (no tier, another node).
    """

    root: Store
    local: Callable[[int], Store | None] | None = None

    def of(self, file: FileEntry) -> list[Store]:
        """Where ``file`` may be read, nearest first."""
        near = self.local(file.rank) if self.local is not None else None
        return [near, self.root] if near is not None else [self.root]


def places_of(store: Store | Places) -> Places:
    """``store`` as :class:`Places` (a plain store: its parts are read there alone)."""
    return store if isinstance(store, Places) else Places(store)


@dataclass(frozen=True)
class Received:
    """A request's stored bytes as another rank read, verified and sent them (:mod:`.fanout`).

    Attributes:
        data: the bytes received.
        rank: the rank that sent them (what a message names when they do not verify here).
    """

    data: bytes | memoryview
    rank: int


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of rank ``rank``'s stream."""

    rank: int
    start: int
    end: int


@dataclass(frozen=True)
class Read:
    """One request: bytes ``[start, end)`` of part ``file`` (raw offsets; whole: the whole object)."""

    file: FileEntry
    start: int
    end: int
    whole: bool

    @property
    def key(self) -> tuple[str, int, int]:
        """What names this request on every rank: the part's path and the raw range."""
        return (self.file.path, self.start, self.end)

    @property
    def size(self) -> int:
        """Bytes this request reads from the store (a whole part: its stored size)."""
        return self.file.size if self.whole else self.end - self.start


def plan_reads(files: Sequence[FileEntry], spans: Iterable[Span]) -> list[Read]:
    """The requests that cover ``spans``: per part, block-aligned and merged (whole parts where
    the part has no blocks).

    Raises:
        CorruptDataError: a span lies outside its rank's parts (the manifest lists too few).
    """
    by_rank: dict[int, list[FileEntry]] = {}
    for f in sorted(files, key=lambda f: (f.rank, f.start)):
        by_rank.setdefault(f.rank, []).append(f)
    starts = {rank: [f.start for f in parts] for rank, parts in by_rank.items()}
    wanted: dict[str, tuple[FileEntry, list[tuple[int, int]]]] = {}
    for span in spans:
        if span.end <= span.start:
            continue
        parts = by_rank.get(span.rank, [])
        covered = span.start
        for f in parts[max(0, bisect.bisect_right(starts.get(span.rank, []), span.start) - 1):]:
            lo, hi = max(span.start, f.start), min(span.end, f.start + f.raw_size)
            if lo >= hi:
                if f.start >= span.end:
                    break
                continue
            if lo != covered:
                break
            covered = hi
            a, b = lo - f.start, hi - f.start
            if f.block_size:
                a, b = a // f.block_size * f.block_size, min(-(-b // f.block_size) * f.block_size, f.raw_size)
            else:
                a, b = 0, f.raw_size
            wanted.setdefault(f.path, (f, []))[1].append((a, b))
        if covered != span.end:
            raise CorruptDataError(
                f"bytes [{span.start}, {span.end}) of rank {span.rank}'s stream are not in the parts the manifest "
                f"lists: a part is missing from the manifest"
            )
    reads = []
    for f, ranges in wanted.values():
        for a, b in _merge(ranges):
            reads.append(Read(f, a, b, whole=not f.block_size or (a == 0 and b == f.raw_size)))
    return reads


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def verify_blocks(data: bytes | memoryview, f: FileEntry, start: int, url: str) -> None:
    """Check raw bytes ``[start, start + len(data))`` of part ``f`` (``start`` on a block boundary,
    the end on one or at the part's end) against its block checksums.

    Raises:
        CorruptDataError: a block differs from its recorded checksum, or the range is misaligned.
    """
    size, end = f.block_size, start + len(data)
    if not size or start % size or (end % size and end != f.raw_size) or end > f.raw_size:
        raise CorruptDataError(f"{url}: bytes [{start}, {end}) are not whole checksummed blocks of the part")
    view = memoryview(data)
    for i in range(start // size, -(-end // size)):
        lo, hi = i * size - start, min((i + 1) * size, f.raw_size) - start
        got = format_checksum(crc32c(view[lo:hi]))
        if got != f.blocks[i]:
            raise CorruptDataError(
                f"{url}: block {i} (bytes [{i * size}, {i * size + hi - lo})) has checksum {got}, the manifest says "
                f"{f.blocks[i]}: the object is corrupt"
            )


def fetch_spans(
    store: Store | Places, files: Sequence[FileEntry], spans: Iterable[Span], *, place: layout.Placement,
    concurrency: int = 8, fetched: Mapping[tuple[str, int, int], Received] | None = None,
) -> dict[int, dict[int, bytes | memoryview]]:
    """Read and verify what ``spans`` need; returns ``rank -> {stream offset: raw bytes}``.

    Args:
        store: the root the parts are in, or the :class:`Places` they may be read from,
            nearest first.
        files: the manifest's parts.
        place: where the save's parts are below the root (:meth:`~..format.manifest.Manifest.place`).
        spans: the byte spans wanted.
        concurrency: parallel GETs (each verifies its own blocks, in its own thread).
        fetched: the stored bytes of some requests (:attr:`Read.key`), already read by another
            rank: verified here like a read; read here only when they do not verify (the rank
            that sent them verified them, so the store is not to blame).

    Raises:
        CorruptDataError: a block or part differs from its checksum, or a span is not covered.
        ObjectNotFoundError: a part is missing (as for any read).
    """
    places = places_of(store)
    fetched = fetched or {}

    def fetch(r: Read) -> bytes | memoryview:
        path = place.path(r.file.rank, r.file.path)
        url = places.root.url(path)
        sent = fetched.get(r.key)
        if sent is not None:  # read by another rank, exchanged over the group (:mod:`.fanout`)
            try:
                return check_raw(sent.data, r, url)
            except CorruptDataError as exc:  # that rank verified them: the store is not to blame
                log.warning("the bytes of %s that rank %d read and sent do not verify here (%s): they were damaged "
                            "on that rank or on the way, not in the store; reading them here", url, sent.rank, exc)
        return _decode(read_nearest(places, path, r), r, url)

    reads = plan_reads(files, spans)
    got = run_parallel(fetch, reads, concurrency=concurrency, name="streamio-ckpt-range")
    pieces: dict[int, dict[int, bytes | memoryview]] = {}
    for r, data in zip(reads, got, strict=True):
        start = 0 if r.whole else r.start
        pieces.setdefault(r.file.rank, {})[r.file.start + start] = data
    return pieces


def read_nearest(places: Places, path: str, r: Read) -> bytes | memoryview:
    """The stored bytes of request ``r`` of the part at ``path`` (below the save directory's
    parent), from the nearest of ``places`` that has them intact, verified (not decoded).

    Raises:
        CorruptDataError, ObjectNotFoundError: the root's copy, when no nearer one verified.
    """
    stores = places.of(r.file)
    for near in stores[:-1]:
        try:
            data = read_raw(near, path, r)
            _verify(data, r, near.url(path))
            return data
        except FileNotFoundError:
            continue
        except (StreamioError, OSError) as exc:  # damaged, unreadable, not a file: the next copy, never the end
            log.warning("the local copy %s is damaged or cannot be read (%s); reading the root's", near.url(path), exc)
    return read_confirmed(stores[-1], path, r)


def read_confirmed(store: Store, path: str, r: Read) -> bytes | memoryview:
    """The stored bytes of request ``r`` of the part at ``path`` in ``store``, verified; bytes
    that do not verify are read again before the object is judged.

    A flipped byte in transit comes back with no error from any layer (docs/design.md
    "Restore"), so one bad read says nothing about the stored object: a second read that
    verifies is used; a second read that returns the same damaged bytes confirms the object
    is damaged; one that returns other damaged bytes blames the transfer.

    Raises:
        CorruptDataError: both reads returned the same bytes, which do not verify (the stored
            object is damaged).
        TransientStorageError: the two reads returned different bytes, neither verifying (the
            transfer damages them; nothing is said of the stored object).
        ObjectNotFoundError: the part is missing (as for any read).
    """
    url = store.url(path)
    first = read_raw(store, path, r)
    try:
        _verify(first, r, url)
        return first
    except CorruptDataError as exc:
        damaged = exc
    again = read_raw(store, path, r)
    try:
        _verify(again, r, url)
    except CorruptDataError as exc:
        if again == first:
            raise CorruptDataError(f"{exc} (read twice, the same bytes both times)") from exc
        raise TransientStorageError(
            f"{url}: two reads of bytes [{r.start}, {r.end}) returned different bytes, neither matching the "
            f"manifest ({damaged}; then: {exc}): they are damaged on the way, not in the store, so the checkpoint "
            f"is not judged; retry the restore, and check the network path to the store if this repeats"
        ) from exc
    log.warning("a read of %s returned bytes that do not verify (%s); a second read verified: they were damaged on "
                "the way, not in the store", url, damaged)
    return again


def read_raw(store: Store, path: str, r: Read) -> bytes | memoryview:
    """The stored bytes of request ``r`` of the part at ``path``, unchecked (the one place parts are
    read from a store: ``streamio_checkpoint_bytes_total{direction="read"}`` counts them here)."""
    data = store.read_view(path) if r.whole else store.read(path, r.start, r.end)
    CHECKPOINT_BYTES.add(len(data), "read")
    return data


def check_raw(data: bytes | memoryview, r: Read, url: str) -> bytes | memoryview:
    """``data``, the stored bytes of request ``r``, verified (size and CRC32C of the part, or of
    every block) and decoded (a compressed part).

    Raises:
        CorruptDataError: ``data`` is not what the manifest says.
    """
    _verify(data, r, url)
    return _decode(data, r, url)


def _verify(data: bytes | memoryview, r: Read, url: str) -> None:
    if r.whole:
        verify_file(data, r.file, url)
    else:
        verify_blocks(data, r.file, r.start, url)


def _decode(data: bytes | memoryview, r: Read, url: str) -> bytes | memoryview:
    return decode_part(data, r.file, url) if r.whole else data


def tensor_spans(wanted: Mapping[str, TensorEntry]) -> list[Span]:
    """The stream spans holding ``wanted``."""
    return [Span(e.rank, e.offset, e.offset + e.nbytes) for e in wanted.values() if e.nbytes]


def load_tensors(
    store: Store | Places, manifest: Manifest, wanted: Mapping[str, TensorEntry], *, concurrency: int = 8,
    sdir: str | None = None, fetched: Mapping[tuple[str, int, int], Received] | None = None,
) -> dict[str, VerifiedTensor]:
    """Read the parts holding ``wanted`` concurrently, verify every size and CRC32C.

    Nothing is returned unless every file and tensor verified; the bytes are copied into tensors
    only when loaded (``decode_tree``).

    Args:
        sdir: the save directory (default: the step's own directory).
        fetched: requests another rank read (see :func:`fetch_spans`).
    """
    sdir = sdir if sdir is not None else layout.step_dir(manifest.step)
    # verified in the reading threads: checksums overlap the other GETs (CRC32C drops the GIL);
    # whole parts (local: mapped, verified and copied from the page cache), or with block
    # checksums (saves with sharded state) only the blocks holding ``wanted``
    parts = fetch_spans(store, manifest.files, tensor_spans(wanted), place=manifest.place(sdir),
                        concurrency=concurrency, fetched=fetched)
    url = places_of(store).root.url(sdir)
    readers = {r: StreamReader(p, r, url) for r, p in parts.items()}

    def check(item: tuple[str, TensorEntry]) -> VerifiedTensor:
        key, e = item
        if e.nbytes == 0:
            return StreamReader({}, e.rank, url).tensor(key, e)
        if e.rank not in readers:
            raise CorruptDataError(
                f"tensor {key!r} of step {manifest.step} lives in rank {e.rank}'s parts, "
                f"which the manifest does not list"
            )
        # Every part holding this tensor passed its size and CRC32C check in fetch(), and the
        # tensor checksums were taken from the same snapshot bytes as the part checksums, so a
        # second pass over the bytes here would only re-prove it (it cost ~10% of a local
        # restore). The tensor's span is still checked against the parts (segments());
        # verify_checkpoint (``streamio ckpt verify``) checks both levels.
        return readers[e.rank].tensor(key, e, check=False)

    items = list(wanted.items())
    with threads.executor(concurrency, "streamio-ckpt-crc") as pool:
        verified = gather(pool, check, items)
    return {key: v for (key, _), v in zip(items, verified, strict=True)}
