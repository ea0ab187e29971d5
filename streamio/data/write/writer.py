"""Samples -> shards + ``index.json`` at any fsspec URL (what ``streamio shard`` runs).

``DatasetWriter`` packs samples (``{"__key__": str, "<ext>": bytes | str | JSON | ndarray (.npy), ...}``) into
WebDataset tar shards named ``{prefix}-{i:06d}.tar`` (``.tar.zst`` with ``compression="zstd"``)
and, when closed, writes ``index.json`` last. How shards are cut, named and compressed is one
frozen :class:`ShardSpec` value; the packing itself is :mod:`streamio.data.write.packer`'s (shared
with the partitioned writes of :mod:`streamio.data.write.parts`); the samples of ``streamio shard
SRC`` come from :mod:`streamio.data.write.sources`.

Design and reasons:

* **Deterministic bytes.** Tar headers carry fixed mtime (0), owner (0/0, no names) and mode
  (0644); fields are written in sorted extension order; so the same samples give identical
  shards on any machine, at any time (reproducible datasets, content-addressed caching).
* **One pass, one copy.** Each sample's records are written straight into the shard being filled
  (:mod:`streamio.data.write.shardbuf`) and its offset and CRC32C, the shard's CRC32C, size and count are
  recorded as the bytes pass; nothing is re-read. A member given as a
  :class:`~streamio.data.write.localfiles.LocalFile` (what ``streamio shard`` reads from disk) is
  streamed in pieces of a few MiB, never held whole outside the shard.
* **Bounded samples.** A sample whose tar records exceed ``ShardSpec.max_sample_bytes`` (default
  :data:`~streamio.data.format.layout.MAX_SAMPLE_BYTES`, 1 GiB: what readers of unindexed shards accept)
  is refused before any of it is read: its size is known from its members' sizes.
* **Overlap.** A finished shard is handed to a background upload (``Store.put``, one atomic PUT)
  while the next one is filled. At most ``max_pending`` shards wait or upload at once, each in a
  buffer reused from shard to shard (fresh large allocations are page-faulted every time), so
  memory stays bounded by about ``(max_pending + 1) * max(max_bytes, the largest sample)``; an
  upload error surfaces at the next ``write`` or at ``close``.
* **Index last, old dataset whole until then.** ``index.json`` is written after every shard (and
  sidecar) is stored, in one conditional PUT that switches readers from the old dataset to the new
  one; a writer that fails, is interrupted or is left through an exception writes no index and the
  old dataset stays readable. New shards never take a name the prefix holds, a marker written first
  claims them, and the old dataset's shards are deleted only after the commit
  (:mod:`streamio.data.write.publish`). Writing where a dataset or an unfinished write's leftovers are
  requires ``overwrite=True``.
* **Compression** (``zstd``): each sample is compressed as its own zstd frame (content size in the
  frame header) and the end-of-archive blocks form a last frame, so the shard is one valid zstd
  stream of one valid tar and offsets point at frame starts.

Keys follow WebDataset: a member is ``key.ext`` and readers split at the first dot of the
basename, so a ``__key__`` may hold dots only in directory parts (``"v1.2/000017"``); field names
may hold dots (``"seg.png"``). A missing ``__key__`` becomes the sample's running number.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from streamio.data.format.index import INLINE_LIMIT, DatasetIndex, make_index
from streamio.data.format.layout import SampleLayout, ShardInfo
from streamio.data.write import publish
from streamio.data.write.packer import DEFAULT_MAX_BYTES, EncodedSample, ShardPacker, ShardSpec, sample_members
from streamio.deprecation import fold_moved
from streamio.errors import DatasetError
from streamio.storage import Store

__all__ = ["DEFAULT_MAX_BYTES", "DatasetWriter", "ShardSpec", "sample_members", "write_dataset"]

log = logging.getLogger(__name__)

MOVED_INTO_SPEC = ("max_bytes", "max_count", "compression", "level", "prefix")  # keywords of 0.1 (deprecated)


class DatasetWriter:
    """Write samples into shards at ``dest`` and the index last; see the module docstring.

    Call order: ``write(sample)`` (or ``add(encoded)``) any number of times, then ``close()`` (returns the
    :class:`DatasetIndex`), or use it as a context manager (closes on success, writes no index on
    an exception).

    Args:
        dest: dataset root URL (any fsspec URL) or a :class:`Store`.
        storage_options: fsspec options when ``dest`` is a URL.
        spec: how shards are cut, named and compressed (default: ``ShardSpec()``, 256 MB ``.tar``
            shards named ``data-000000.tar``, ...).
        max_pending: shards uploading or waiting to upload at once (memory bound).
        overwrite: replace the dataset at ``dest`` (its index is replaced in one PUT once the new
            dataset is complete, then its shards are deleted), and remove the leftovers of a write
            there that did not finish. Says that no other write into ``dest`` is running.
        inline_limit: datasets up to this many samples keep their offsets inside ``index.json``.
        moved: 0.1's ``max_bytes=``, ``max_count=``, ``compression=``, ``level=``, ``prefix=``:
            deprecated (a ``DeprecationWarning``), removed in 0.3.0; give them in ``spec``.

    Raises:
        DatasetError: ``dest`` holds a dataset or the leftovers of a write that did not finish, and
            ``overwrite`` is False.
        ArgumentError: an unknown keyword, or a moved one given together with ``spec``.
    """

    def __init__(
        self,
        dest: str | Store,
        storage_options: Mapping[str, Any] | None = None,
        *,
        spec: ShardSpec | None = None,
        max_pending: int = 2,
        overwrite: bool = False,
        inline_limit: int = INLINE_LIMIT,
        **moved: Any,
    ) -> None:
        spec = fold_moved("DatasetWriter", moved, into="spec", given=spec, make=ShardSpec, fields=MOVED_INTO_SPEC)
        self.spec = spec = ShardSpec() if spec is None else spec
        self.store = dest if isinstance(dest, Store) else Store(dest, storage_options)
        self.inline_limit = inline_limit
        self._generation, self._previous = publish.begin(self.store, spec.prefix, overwrite=overwrite)
        tag = self._generation.tag
        self._packer = ShardPacker(self.store, spec, lambda i: spec.shard_path(i, tag), max_pending=max_pending)
        self.index: DatasetIndex | None = None
        self._closed = False
        self._named = 0  # shard names handed to other processes (shard_path)

    @property
    def samples_written(self) -> int:
        """Samples written so far."""
        return self._packer.samples_written

    @property
    def bytes_written(self) -> int:
        """Bytes of shards written so far (the shard being filled included)."""
        return self._packer.bytes_written

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (raises DatasetError for an invalid one, naming it; the writer stays usable)."""
        if self._closed:
            raise DatasetError(f"writer for {self.store.root_url} is closed")
        self._packer.write(sample)

    def add(self, sample: EncodedSample) -> None:
        """Append one sample already checked and encoded by
        :func:`~streamio.data.write.packer.encode_sample` (e.g. in another process:
        :func:`streamio.data.write.fanout.encoded`); the same shards as :meth:`write` of the sample."""
        if self._closed:
            raise DatasetError(f"writer for {self.store.root_url} is closed")
        self._packer.add(sample)

    def shard_path(self, shard_id: int) -> str:
        """The name shard ``shard_id`` of this write takes, for another process to store it there
        (then :meth:`adopt`): a write stopped before adopting it still claims it, and says so."""
        self._named = max(self._named, shard_id + 1)
        return self._packer.shard_path(shard_id)

    def adopt(
        self, shard: ShardInfo, layout: SampleLayout, keys: Iterable[str], tokens: dict[str, list[int]] | None = None,
    ) -> None:
        """Take shard number ``len(shards)``, stored at :meth:`shard_path` by another process, into this
        write (what :func:`streamio.data.write.fanout.pack_in_processes` does); ``keys``: its member
        extensions; ``tokens``: its documents' token counts by field."""
        if self._closed:
            raise DatasetError(f"writer for {self.store.root_url} is closed")
        self._packer.adopt(shard, layout, keys, tokens)

    def close(self) -> DatasetIndex:
        """Finish the last shard, wait for every upload, commit ``index.json``; return the index.

        The index replaces the one that was at ``dest`` (if any) in one conditional PUT; then the
        old dataset's shards are deleted (:mod:`streamio.data.write.publish`).

        Raises:
            DatasetError: no sample was written (an empty source makes no dataset), or the index
                at ``dest`` changed since the write began (another write committed).
        """
        if self.index is not None:
            return self.index
        self._closed = True
        try:
            self._packer.flush()
        except BaseException as exc:
            self._stopped(exc)
            raise
        if not self._packer.shards:
            publish.discard(self.store)
            raise DatasetError(f"no samples were written to {self.store.root_url}: the source is empty")
        index = make_index(self._packer.shards, self._packer.layouts, self._packer.keys, self._packer.tokens)
        publish.commit(self.store, self._generation, self._previous, index, self.inline_limit)
        self.index = index
        return index

    def abort(self) -> None:
        """Stop without writing an index: the dataset at ``dest`` (if any) is untouched; the shards
        already stored stay, unreferenced, until a write with ``overwrite=True`` removes them."""
        self._closed = True
        self._packer.abort()
        if not self._packer.shards and not self._named:  # nothing stored, here or by another process
            publish.discard(self.store)

    def _stopped(self, exc: BaseException) -> None:
        """Say what a write that stopped left behind, and how to clean it up."""
        stored = len(self._packer.shards)
        if not stored and not self._named:
            return
        url = self.store.root_url
        count = f"{stored}" if self._named <= stored else f"{stored} (or up to {self._named})"
        log.warning(
            "writing %s stopped (%s): no index was written, so %s still holds the dataset it held before, if any. "
            "The %s shards this write stored (%s) are not part of it: the next write there with overwrite=True "
            "(`streamio shard SRC %s --overwrite`) removes them.",
            url, type(exc).__name__, url, count, self._generation.pattern, url,
        )

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:
            self.abort()
            self._stopped(exc)  # type: ignore[arg-type]


def write_dataset(
    samples: Iterable[Mapping[str, Any]],
    dest_url: str | Store,
    storage_options: Mapping[str, Any] | None = None,
    *,
    spec: ShardSpec | None = None,
    max_pending: int = 2,
    overwrite: bool = False,
    inline_limit: int = INLINE_LIMIT,
    **moved: Any,
) -> DatasetIndex:
    """Write ``samples`` as a dataset at ``dest_url`` and return its index.

    Args and errors as :class:`DatasetWriter` (``moved``: 0.1's shard keywords, deprecated).

    Example::

        index = write_dataset(({"__key__": f"{i:06d}", "txt": f"sample {i}"} for i in range(1000)),
                              "s3://bucket/ds", spec=ShardSpec(max_count=100, compression="zstd"))
    """
    spec = fold_moved("write_dataset", moved, into="spec", given=spec, make=ShardSpec, fields=MOVED_INTO_SPEC)
    with DatasetWriter(
        dest_url, storage_options, spec=spec, max_pending=max_pending, overwrite=overwrite, inline_limit=inline_limit
    ) as writer:
        for sample in samples:
            writer.write(sample)
    return writer.close()  # already closed by __exit__: returns the index
