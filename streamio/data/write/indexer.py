"""Indexing existing shards: scan each one once, and build the :class:`DatasetIndex` of a set.

What ``streamio index URL`` runs. :func:`build_index` expands the patterns
(:mod:`streamio.data.format.patterns`), checks that every path can be named in an index, and scans the
shards ``concurrency`` at a time; :func:`scan_shard` streams one shard once and records its size,
whole CRC32C, the offset and CRC32C of every sample, the member extensions it holds and, for a
field that is a 1-D integer ``.npy`` in every sample, each document's token count (read from the
member's first :data:`~streamio.data.format.tokens.NPY_HEAD` bytes, as a writer records it).

* ``.tar`` from any writer (webdataset, ``tar``, ...): the tar records are parsed by
  :func:`streamio.data.format.tar.iter_members` without keeping member data, and each sample's CRC32C is
  computed over its byte range as the bytes pass through a tee.
* ``.tar.zst`` only with one zstd frame per sample (as ``streamio shard --compress zstd`` writes
  them), since offsets must point at frame starts: the stream is cut into frames by their headers
  (:func:`streamio.data.format.zstdframes.split_frames`), each frame must decompress to exactly one sample,
  and the largest decompressed sample is recorded as the layout's ``max_sample_bytes``.

Shards are foreign, untrusted input: memory is bounded by ``max_sample_bytes`` (a sample spanning
more, decompressed, is refused) whatever the headers or frames declare. The result is not
written: pass it to :func:`streamio.data.format.index.write_index`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import as_completed
from contextlib import closing
from typing import NamedTuple

import zstandard

from streamio import threads
from streamio.checksum import Crc32c, crc32c
from streamio.data.format import zstdframes
from streamio.data.format.index import DatasetIndex, make_index
from streamio.data.format.layout import (
    MAX_SAMPLE_BYTES,
    WRITING_NAME,
    SampleLayout,
    ShardInfo,
    gzip_advice,
    gzip_glob,
    is_gzip_shard,
    shard_path_problem,
)
from streamio.data.format.marker import read_marker
from streamio.data.format.patterns import expand_patterns, gzip_shards
from streamio.data.format.samples import group_samples
from streamio.data.format.tar import MemberHead, iter_members
from streamio.data.format.tokens import NPY_HEAD, token_fields
from streamio.data.write.localfiles import refuse_special_shards
from streamio.errors import DatasetError, ObjectNotFoundError, ShardFormatError
from streamio.storage import Store

__all__ = ["ShardScan", "build_index", "index_of_scans", "scan_chunks", "scan_shard", "scan_shards", "shard_paths"]

_WHOLE_FRAME = 16 << 20  # a scanned frame declaring up to this is decompressed in one call, larger ones in pieces


class ShardScan(NamedTuple):
    """What one scan of a shard found: its :class:`ShardInfo`, its samples' layout, the member
    extensions it holds and its documents' token counts by field (``{}``: no token field)."""

    info: ShardInfo
    layout: SampleLayout
    keys: set[str]
    tokens: dict[str, list[int]]


def _npy_head(name: str) -> int:
    """How much of a member an index scan keeps: the head of a ``.npy`` (its header), nothing else."""
    return NPY_HEAD if name.endswith(".npy") else 0


def _sample_tokens(sample: Mapping[str, object]) -> dict[str, int]:
    return token_fields({ext: (v, v.size) for ext, v in sample.items() if isinstance(v, MemberHead)})


def _common(tokens: list[dict[str, int]]) -> dict[str, list[int]]:
    """Per field found in every sample, each sample's count (what the index records)."""
    if not tokens:
        return {}
    fields = set.intersection(*(set(t) for t in tokens))
    return {ext: [t[ext] for t in tokens] for ext in sorted(fields)}


class _Tee:
    """Chunks pass through; CRC32C of the whole stream and of byte ranges are computed on the way."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.whole = Crc32c()
        self._kept: list[tuple[int, bytes]] = []  # (offset, chunk) not yet fully hashed into ranges
        self._pos = 0  # end of the ranges hashed so far
        self._stream = self._run()

    def __iter__(self) -> Iterator[bytes]:
        return self._stream  # one pass: iterating again continues (draining the trailer)

    def _run(self) -> Iterator[bytes]:
        offset = 0
        for chunk in self._chunks:
            chunk = bytes(chunk)
            self.whole.update(chunk)
            self._kept.append((offset, chunk))
            offset += len(chunk)
            yield chunk

    def range_crc(self, end: int) -> int:
        """CRC32C of ``[previous end, end)``; everything before ``end`` is then forgotten."""
        value = 0
        keep: list[tuple[int, bytes]] = []
        for off, chunk in self._kept:
            lo, hi = max(self._pos, off), min(end, off + len(chunk))
            if lo < hi:
                value = crc32c(chunk[lo - off : hi - off], value)
            if off + len(chunk) > end:
                keep.append((off, chunk))
        self._kept = keep
        self._pos = end
        return value


def scan_shard(
    store: Store, path: str, *, max_sample_bytes: int = MAX_SAMPLE_BYTES
) -> ShardScan:
    """Stream one shard once: size, whole CRC32C, sample offsets and per-sample CRC32C, keys.

    ``.tar`` shards from any writer; ``.tar.zst`` shards only with one zstd frame per sample (as
    ``streamio shard --compress zstd`` writes them), since offsets must point at frame starts.
    Member data is passed over, not kept; memory is bounded by ``max_sample_bytes`` (a sample
    spanning more, decompressed, is refused) whatever the headers or frames declare.

    Raises:
        ShardFormatError: not a tar, truncated, unsafe member, a sample over ``max_sample_bytes``,
            or a zstd frame holding several samples.
    """
    with closing(store.iter_bytes(path)) as stream:
        return scan_chunks(stream, url=store.url(path), path=path, max_sample_bytes=max_sample_bytes)


def scan_chunks(
    chunks: Iterable[bytes], *, url: str, path: str, max_sample_bytes: int = MAX_SAMPLE_BYTES
) -> ShardScan:
    """:func:`scan_shard` on bytes from anywhere (chunks of any size); ``path`` names the shard in the result."""
    if path.endswith(".zst"):
        return _scan_zstd(chunks, url, path, max_sample_bytes)
    return _scan(_Tee(chunks), url, path, max_sample_bytes)


class _Counted:
    """Pieces pass through; ``total`` counts their bytes."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = pieces
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            self.total += len(piece)
            yield piece


def _scan_zstd(
    chunks: Iterable[bytes], url: str, path: str, max_sample_bytes: int
) -> ShardScan:
    whole = Crc32c()
    starts: list[int] = []
    crcs: list[int] = []
    keys: set[str] = set()
    tokens: list[dict[str, int]] = []
    biggest = 0
    end_of_samples: int | None = None
    frame_limit = max_sample_bytes + (max_sample_bytes >> 10) + 1024  # raw blocks: 3 bytes per 128 KiB, headers
    dctx = zstandard.ZstdDecompressor()
    for start, frame in zstdframes.split_frames(chunks, url=url, limit=frame_limit, on_chunk=whole.update):
        if end_of_samples is not None:
            continue  # after the end-of-archive frame: only the whole-object checksum counts
        raw = _Counted(zstdframes.decompress_sample(  # whole when small: a frame per sample, data not kept
            frame, dctx, url=url, what=f"the zstd frame at byte {start}", limit=max_sample_bytes, start=start,
            whole_up_to=_WHOLE_FRAME,
        ))
        ends: list[int] = []
        members = iter_members(raw, url=url, require_end=False, on_end=ends.append, max_sample_bytes=max_sample_bytes,
                               keep_data=_npy_head)
        found = list(group_samples(members, url=url, max_sample_bytes=max_sample_bytes))  # data not kept: small
        if len(found) > 1 or (found and ends):
            raise ShardFormatError(
                f"shard {url!r}: the zstd frame at byte {start} holds {len(found)} samples"
                f"{' and the end of the archive' if ends else ''}; indexing needs one frame per sample. "
                f"Re-shard it with `streamio shard {url} DEST --compress zstd`."
            )
        if found:
            starts.append(start)
            crcs.append(crc32c(frame))
            keys.update(k for k in found[0][1] if k != "__key__")
            tokens.append(_sample_tokens(found[0][1]))
            biggest = max(biggest, raw.total)
        elif ends:
            end_of_samples = start
        else:
            raise ShardFormatError(
                f"shard {url!r}: the zstd frame at byte {start} holds no sample; indexing needs one frame per sample"
            )
    if end_of_samples is None:
        raise ShardFormatError(f"shard {url!r} ends without the end-of-archive blocks: it is truncated")
    layout = SampleLayout(tuple(starts) + (end_of_samples,), tuple(crcs), biggest)
    return ShardScan(ShardInfo(path, whole.size, len(starts), whole.hexdigest()), layout, keys, _common(tokens))


def _scan(tee: _Tee, url: str, path: str, max_sample_bytes: int) -> ShardScan:
    starts: list[int] = []
    crcs: list[int] = []
    keys: set[str] = set()
    ends: list[int] = []
    tokens: list[dict[str, int]] = []
    members = iter_members(tee, url=url, on_end=ends.append, max_sample_bytes=max_sample_bytes, keep_data=_npy_head)
    for start, sample in group_samples(members, url=url, max_sample_bytes=max_sample_bytes):
        if starts:
            crcs.append(tee.range_crc(start))
        else:
            tee.range_crc(start)  # bytes before the first sample (directory entries) belong to none
        starts.append(start)
        keys.update(k for k in sample if k != "__key__")
        tokens.append(_sample_tokens(sample))
    end_of_samples = ends[0]  # the end-of-archive block that stopped the parser
    if starts:
        crcs.append(tee.range_crc(end_of_samples))
    for _ in tee:  # drain the trailer so the whole-object CRC covers every byte
        pass
    layout = SampleLayout(tuple(starts) + (end_of_samples,), tuple(crcs))
    return ShardScan(ShardInfo(path, tee.whole.size, len(starts), tee.whole.hexdigest()), layout, keys, _common(tokens))


#: What scans shards for :func:`build_index`: ``scan(store, paths, *, concurrency, max_sample_bytes,
#: progress)`` -> one ``(ShardInfo, SampleLayout, keys)`` per path, in path order.
ScanShards = Callable[..., "list[ShardScan]"]


def scan_shards(
    store: Store, paths: Sequence[str], *, concurrency: int = 8, max_sample_bytes: int = MAX_SAMPLE_BYTES,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[ShardScan]:
    """:func:`scan_shard` on each of ``paths``, ``concurrency`` at a time; results in path order,
    ``progress(done, total, nbytes)`` as scans end (see :func:`build_index`)."""
    report = progress or (lambda done, total, nbytes: None)
    report(0, len(paths), 0)
    results: list[ShardScan | None] = [None] * len(paths)
    nbytes = 0
    with threads.executor(concurrency, "streamio-index") as pool:
        futures = {
            pool.submit(scan_shard, store, path, max_sample_bytes=max_sample_bytes): i for i, path in enumerate(paths)
        }
        try:
            for done, future in enumerate(as_completed(futures), 1):
                result = future.result()
                results[futures[future]] = result
                nbytes += result[0].bytes
                report(done, len(paths), nbytes)
        except BaseException:
            for future in futures:  # the first failure ends the scan: no new shard starts
                future.cancel()
            raise
    return [r for r in results if r is not None]


def build_index(
    store: Store,
    patterns: str | Sequence[str] | None = None,
    *,
    concurrency: int = 8,
    progress: Callable[[int, int, int], None] | None = None,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
    scan: ScanShards | None = None,
) -> DatasetIndex:
    """Index existing WebDataset shards: ``.tar`` written by anything (webdataset, ``tar``, ...), and
    ``.tar.zst`` with one zstd frame per sample.

    Shards are streamed (never held whole) and scanned ``concurrency`` at a time. The result is
    not written: pass it to :func:`write_index`. The same index from scans made elsewhere (other
    processes, Ray tasks): :func:`shard_paths`, then :func:`scan_shard` on each, then
    :func:`index_of_scans`.

    Args:
        store: the dataset root; shard paths in the index are relative to it.
        patterns: brace / glob patterns relative to the root (``"shard-{000000..000099}.tar"``);
            None takes every ``.tar`` below the root.
        concurrency: shards scanned at once.
        progress: ``progress(done, total, nbytes)``: shards scanned of ``total`` and their bytes so
            far; called once before the first scan (``done`` 0) and as each scan ends, from the
            calling thread.
        max_sample_bytes: the largest sample accepted (its tar records, decompressed); larger
            ones are refused rather than held.
        scan: what scans the shards, called as :func:`scan_shards` is (the default); e.g.
            :func:`streamio.data.write.fanout.scan_in_processes` for all cores of the machine.

    Raises:
        ObjectNotFoundError: nothing to index: no shard under the root (empty or missing) or none
            matching the patterns, or a shard named by a pattern does not exist.
        DatasetError: a matched path cannot be named in an index.
        SourceError: a matched local path is not a regular file (a FIFO, a socket, a device).
        ShardFormatError: a shard is not a readable tar (the message names it).
    """
    paths = shard_paths(store, patterns)
    scans = (scan or scan_shards)(
        store, paths, concurrency=concurrency, max_sample_bytes=max_sample_bytes, progress=progress
    )
    return index_of_scans(scans)


def shard_paths(store: Store, patterns: str | Sequence[str] | None = None) -> list[str]:
    """The shards :func:`build_index` would scan, in index order, each checked to be one an index may name.

    Raises:
        as :func:`build_index`, except ShardFormatError for a shard's content.
    """
    paths = expand_patterns(store, patterns)
    if not paths and patterns is None:
        gzipped = gzip_shards(store)
        if gzipped:
            raise ObjectNotFoundError(
                f"no .tar or .tar.zst shards under {store.root_url}, but {len(gzipped)} gzip'd ones "
                f"({gzipped[0]}{', ...' if len(gzipped) > 1 else ''}): "
                f"{gzip_advice(gzip_glob(store.root_url, gzipped))}"
            )
        raise ObjectNotFoundError(
            f"no .tar or .tar.zst shards under {store.root_url}: it is empty or does not exist. Check the URL, "
            f"or name the shards with a pattern such as '{store.root_url}/shard-{{000000..000099}}.tar'"
        )
    gzipped = [p for p in paths if is_gzip_shard(p)]
    if gzipped:
        named = store.url(patterns if isinstance(patterns, str) else gzipped[0])
        raise ShardFormatError(
            f"{len(gzipped)} of the {len(paths)} shards named are gzip'd ({store.url(gzipped[0])}"
            f"{', ...' if len(gzipped) > 1 else ''}) and cannot be indexed: {gzip_advice(named)}"
        )
    if not paths:
        raise ObjectNotFoundError(
            f"no shards match {patterns!r} under {store.root_url}: check the URL, or give a pattern such as "
            f"'shard-{{000000..000099}}.tar'"
        )
    unfinished = read_marker(store)
    if unfinished is not None and any(unfinished.owns(p) for p in paths):
        raise DatasetError(
            f"{store.root_url} holds the shards of a `streamio shard` that did not finish ({unfinished.pattern}, "
            f"started {unfinished.started}; {store.url(WRITING_NAME)} marks them): indexing them would make a partial "
            f"dataset look whole. Write it again with `streamio shard SRC {store.root_url} --overwrite`."
        )
    for path in paths:
        problem = shard_path_problem(path)
        if problem:
            raise DatasetError(
                f"{store.url(path)} cannot be named in an index: its path {path!r} below {store.root_url} is not a "
                f"plain relative name ({problem}). Index from a root that holds it without '..' or schemes."
            )
    refuse_special_shards(store, paths)  # a FIFO named like a shard: refused by name, as `shard` does
    return paths


def index_of_scans(scans: Sequence[ShardScan]) -> DatasetIndex:
    """The index of shards scanned by :func:`scan_shard`, given in :func:`shard_paths` order."""
    keys: set[str] = set()
    for scan in scans:
        keys |= scan.keys
    return make_index([r.info for r in scans], {i: r.layout for i, r in enumerate(scans)}, keys,
                      {i: r.tokens for i, r in enumerate(scans)})
