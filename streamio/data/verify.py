"""Checking a dataset against its index: are the shards there, and are their bytes right.

What ``streamio verify`` runs. :func:`validate` lists the root once and compares every shard's
size with the index (shallow), then, with ``deep=True``, re-reads every shard (streamed,
``concurrency`` at a time) through the verified reader of :mod:`streamio.data.samples`, comparing
its size, whole CRC32C, every sample's CRC32C and the sample count with the index.

A read that fails (access refused, storage unreachable) is no verdict on the shard: it raises a
:class:`~streamio.errors.StorageError` rather than reporting the shard bad, so the CLI can tell
"found bad data" (exit 1) from "could not check" (exit 3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from dataclasses import dataclass

from streamio.checksum import Crc32c
from streamio.data.index import DatasetIndex
from streamio.data.samples import iter_samples
from streamio.errors import StorageError, StreamioError
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


def _deep_check(store: Store, index: DatasetIndex, i: int) -> str | None:
    shard = index.shards[i]
    url = store.url(shard.path)
    try:
        layout = index.layout(i, store)
        whole = Crc32c()

        def counted(chunks: Iterable[bytes]) -> Iterator[bytes]:
            for chunk in chunks:
                whole.update(chunk)
                yield chunk

        with closing(store.iter_bytes(shard.path)) as raw:
            stream = counted(raw)
            n = sum(1 for _ in iter_samples(stream, url=url, layout=layout, compression=shard.compression))
            for _ in stream:  # the trailer after the last sample, for the whole-object checksum
                pass
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
    return None


def _read_all(
    store: Store, index: DatasetIndex, to_read: list[int], concurrency: int,
    progress: Callable[[int, int, int], None] | None,
) -> list[BadShard]:
    """Deep-check the shards ``to_read``, ``concurrency`` at a time; progress as each read ends."""
    report = progress or (lambda done, total, nbytes: None)
    report(0, len(to_read), 0)
    bad: list[BadShard] = []
    nbytes = 0
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
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
