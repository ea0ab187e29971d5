"""Checking a dataset against its index: are the shards there, and are their bytes right.

What ``streamio verify`` runs. :func:`validate` lists the root once and compares every shard's
size with the index (shallow), then, with ``deep=True``, re-reads every shard (streamed,
``concurrency`` at a time) through the verified reader of :mod:`streamio.data.format.samples`, comparing
its size, whole CRC32C, every sample's CRC32C and the sample count with the index, and each
document's token count (where the index records them) with its ``.npy`` header.

The deep check covers the shard's whole extent, not only the samples the index lists: the bytes
before the first indexed sample may hold tar headers of directories only, and the bytes after the
last one must be the end-of-archive blocks and their zero padding (decompressed, for ``.tar.zst``).
A member there is a sample the index does not list (an index that lists fewer samples than the
shard holds passes every per-sample check): the shard is reported bad, naming the member and its
byte offset.

A read that fails (access refused, storage unreachable) is no verdict on the shard: it raises a
:class:`~streamio.errors.StorageError` rather than reporting the shard bad, so the CLI can tell
"found bad data" (exit 1) from "could not check" (exit 3).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import as_completed
from contextlib import closing
from dataclasses import dataclass

from streamio import threads
from streamio.checksum import Crc32c
from streamio.data.format import zstdframes
from streamio.data.format.index import DatasetIndex
from streamio.data.format.layout import SampleLayout
from streamio.data.format.samples import SampleSpan, iter_samples
from streamio.data.format.tar import iter_members
from streamio.data.format.tarfields import BLOCK
from streamio.data.format.tokens import NPY_HEAD, npy_tokens
from streamio.errors import ShardFormatError, StorageError, StreamioError
from streamio.storage import Store

__all__ = ["BadShard", "ValidationReport", "validate"]


@dataclass(frozen=True)
class BadShard:
    """One shard that failed validation, and why (one sentence naming the fix)."""

    path: str
    reason: str


@dataclass(frozen=True)
class ValidationReport:
    """What :func:`validate` found: ``ok`` when ``bad`` is empty."""

    checked: int
    deep: bool
    bad: tuple[BadShard, ...]

    @property
    def ok(self) -> bool:
        return not self.bad


#: The most bytes the end of a ``.tar.zst`` shard may decompress to (tar pads its end to a record: 10 KiB by default).
TAIL_LIMIT = 1 << 20
_REBUILD = "Rebuild the index with `streamio index`."


class _Cursor:
    """A shard's bytes handed out region by region (head, samples, tail), CRC32C of all on the way."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._rest = memoryview(b"")
        self.whole = Crc32c()
        self.pos = 0

    def region(self, n: int | None) -> Iterator[memoryview]:
        """The next ``n`` bytes (everything left when None) as read-only pieces; fewer at the end of the shard."""
        while n is None or n > 0:
            if not self._rest:
                chunk = next(self._chunks, None)
                if chunk is None:
                    return
                self.whole.update(chunk)
                self._rest = memoryview(bytes(chunk) if not isinstance(chunk, bytes) else chunk)
            piece = self._rest if n is None or len(self._rest) <= n else self._rest[:n]
            self._rest = self._rest[len(piece):]
            self.pos += len(piece)
            n = None if n is None else n - len(piece)
            yield piece


def _decompressed(
    chunks: Iterable[bytes], url: str, compression: str | None, start: int, where: str
) -> Iterable[bytes]:
    if compression != "zstd":
        return chunks
    return zstdframes.decompress(chunks, url=url, what=f"the bytes {where}", limit=TAIL_LIMIT, start=start)


def _head_problem(chunks: Iterable[bytes], url: str, compression: str | None, end: int) -> str | None:
    """Why the bytes before the first indexed sample are not tar headers of directories only, or None."""
    where = f"before the first indexed sample (bytes 0..{end})"
    ends: list[int] = []
    try:
        stream = _decompressed(chunks, url, compression, 0, where)
        for at, name, _ in iter_members(stream, url=url, require_end=False, keep_data=False, on_end=ends.append):
            return f"member {name!r} at byte {at} lies {where}: the index does not list it. {_REBUILD}"
    except ShardFormatError as exc:
        return f"the bytes {where} are not directory headers: {exc}"
    return f"the end-of-archive block at byte {ends[0]} lies {where}" if ends else None


def _tail_problem(chunks: Iterable[bytes], url: str, compression: str | None, start: int) -> str | None:
    """Why the bytes after the last indexed sample are not the end-of-archive blocks and zero padding, or None."""
    where = f"after the last indexed sample (byte {start} on{', decompressed' if compression else ''})"
    base = 0 if compression else start  # offsets in a .tar.zst's tail are those of its decompressed bytes
    try:
        stream = iter(_decompressed(chunks, url, compression, start, where))
        pos = base
        for piece in stream:
            data = bytes(piece)
            zeros = len(data) - len(data.lstrip(b"\0"))
            if zeros < len(data):  # something else than padding: name it if it parses as a member
                block = pos + zeros - (pos + zeros - base) % BLOCK
                rest = bytes(pos + zeros - block) + data[zeros:]
                for at, name, _ in iter_members(
                    itertools.chain((rest,), stream), url=url, start_offset=block, require_end=False, keep_data=False
                ):
                    return (
                        f"member {name!r} at byte {at} lies {where}: the index does not list it (the shard holds "
                        f"more samples than the index says). {_REBUILD}"
                    )
                return f"the bytes {where} are not the end-of-archive blocks and their zero padding (byte {block})"
            pos += len(data)
    except ShardFormatError as exc:
        return f"the bytes {where} are not the end of the archive: {exc}"
    return None


def _token_problem(sample: dict[str, object], j: int, tokens: dict[str, tuple[int, ...]]) -> str | None:
    """How sample ``j``'s token documents disagree with the counts the index records, if they do."""
    for ext, counts in tokens.items():
        data = sample.get(ext)
        got = npy_tokens(bytes(data[:NPY_HEAD]), len(data)) if isinstance(data, (bytes, memoryview)) else None
        if j < len(counts) and got != counts[j]:
            return (f"sample {j} ({sample.get('__key__')!r}): its {ext!r} holds "
                    f"{'no token document' if got is None else f'{got} tokens'}, the index says {counts[j]}")
    return None


def _check_extent(
    src: _Cursor, layout: SampleLayout, url: str, compression: str | None, tokens: dict[str, tuple[int, ...]],
) -> tuple[int, str | None]:
    """Read the whole shard from ``src``: ``(samples read, the first problem outside them or None)``."""
    first, end = layout.offsets[0], layout.offsets[-1]
    problem = None
    if first:
        problem = _head_problem(src.region(first), url, compression, first)
        for _ in src.region(first - src.pos):  # whatever the head's parser left unread
            pass
    samples = src.region(end - first)
    n = 0
    for sample in iter_samples(samples, url=url, span=SampleSpan(first), layout=layout, compression=compression):
        problem = problem or (_token_problem(sample, n, tokens) if tokens else None)
        n += 1
    for _ in samples:
        pass
    tail = src.region(None)
    problem = problem or _tail_problem(tail, url, compression, end)
    for _ in tail:  # the rest, for the whole-object checksum and size
        pass
    return n, problem


def _deep_check(store: Store, index: DatasetIndex, i: int) -> str | None:
    shard = index.shards[i]
    url = store.url(shard.path)
    try:
        layout = index.layout(i, store)
        with closing(store.iter_bytes(shard.path)) as raw:
            src = _Cursor(raw)
            n, problem = _check_extent(src, layout, url, shard.compression, index.shard_tokens(i))
        whole = src.whole
    except FileNotFoundError:
        return "missing: the object does not exist"
    except StorageError:
        raise  # could not read (access, network): not a verdict on the shard; the caller cannot vouch
    except StreamioError as exc:
        return str(exc)
    if whole.size != shard.bytes:
        return f"size {whole.size} bytes, the index says {shard.bytes}"
    if whole.hexdigest() != shard.checksum:
        return f"checksum {whole.hexdigest()}, the index says {shard.checksum}: the shard is corrupt"
    if n != shard.samples:
        return f"{n} samples, the index says {shard.samples}"
    return problem  # bytes or token counts the index does not account for, in a shard that matches it otherwise


def _read_all(
    store: Store, index: DatasetIndex, to_read: list[int], concurrency: int,
    progress: Callable[[int, int, int], None] | None,
) -> list[BadShard]:
    """Deep-check the shards ``to_read``, ``concurrency`` at a time; progress as each read ends."""
    report = progress or (lambda done, total, nbytes: None)
    report(0, len(to_read), 0)
    bad: list[BadShard] = []
    nbytes = 0
    with threads.executor(concurrency, "streamio-verify") as pool:
        futures = {pool.submit(_deep_check, store, index, i): i for i in to_read}
        try:
            for done, future in enumerate(as_completed(futures), 1):
                i = futures[future]
                reason = future.result()
                if reason is not None:
                    bad.append(BadShard(index.shards[i].path, reason))
                nbytes += index.shards[i].bytes
                report(done, len(to_read), nbytes)
        except BaseException:
            for future in futures:  # could not check: stop starting reads
                future.cancel()
            raise
    return bad


def validate(
    store: Store,
    index: DatasetIndex,
    *,
    deep: bool = False,
    concurrency: int = 8,
    progress: Callable[[int, int, int], None] | None = None,
) -> ValidationReport:
    """Check that the shards the index names are there, and (``deep``) that their bytes are right.

    Shallow: one fresh listing; every shard must exist with the recorded size. Deep: every shard is
    re-read (streamed, ``concurrency`` at a time) and its size, whole CRC32C, every sample's CRC32C
    and the sample count are compared with the index.

    ``progress(done, total, nbytes)`` (deep only): shards read of ``total`` and their bytes so
    far; called once before the first read (``done`` 0) and as each read ends, from the calling
    thread.

    Raises:
        StorageError: a shard could not be read (access refused, storage unreachable): a read that
            failed is no verdict on the shard, so it is raised rather than reported as bad.
    """
    listing = {o.path: o.size for o in store.list()}
    bad: list[BadShard] = []
    to_read: list[int] = []
    for i, shard in enumerate(index.shards):
        size = listing.get(shard.path)
        if size is None:
            bad.append(BadShard(shard.path, "missing: the object does not exist"))
        elif size != shard.bytes:
            bad.append(BadShard(shard.path, f"size {size} bytes, the index says {shard.bytes}"))
        else:
            to_read.append(i)
    if deep and to_read:
        bad += _read_all(store, index, to_read, concurrency, progress)
    order = {s.path: n for n, s in enumerate(index.shards)}
    return ValidationReport(len(index.shards), deep, tuple(sorted(bad, key=lambda b: order[b.path])))
