"""Samples -> shards + ``index.json`` at any fsspec URL (what ``streamio shard`` runs).

``DatasetWriter`` packs samples (``{"__key__": str, "<ext>": bytes | str | JSON value, ...}``) into
WebDataset tar shards named ``{prefix}-{i:06d}.tar`` (``.tar.zst`` with ``compression="zstd"``)
and, when closed, writes ``index.json`` last. How shards are cut, named and compressed is one
frozen :class:`ShardSpec` value; the samples of ``streamio shard SRC`` come from
:mod:`streamio.data.write.sources`.

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

import collections
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import zstandard

from streamio.checksum import format_checksum
from streamio.data.format.index import INLINE_LIMIT, DatasetIndex, make_index
from streamio.data.format.layout import MAX_SAMPLE_BYTES, SampleLayout, ShardInfo, unsafe_reason
from streamio.data.format.tar import END_OF_ARCHIVE
from streamio.data.write import publish
from streamio.data.write.localfiles import LocalFile
from streamio.data.write.shardbuf import Member, ShardBuffer, compressed, member_tokens, record_size, records
from streamio.deprecation import fold_moved
from streamio.errors import ConfigError, DatasetError
from streamio.storage import Store

__all__ = ["DEFAULT_MAX_BYTES", "DatasetWriter", "ShardSpec", "sample_members", "write_dataset"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256_000_000
_COMPRESSIONS = (None, "zstd")
MOVED_INTO_SPEC = ("max_bytes", "max_count", "compression", "level", "prefix")  # keywords of 0.1 (deprecated)


@dataclass(frozen=True)
class ShardSpec:
    """How a writer cuts samples into shards, names and compresses them; checked when made.

    Attributes:
        max_bytes: a shard is closed before it would exceed this many bytes (a single larger
            sample gets a shard of its own).
        max_count: and/or after this many samples (None: no count limit).
        compression: None (``.tar``) or ``"zstd"`` (``.tar.zst``, one frame per sample).
        level: zstd level.
        prefix: shard names are ``{prefix}-{i:06d}.tar[.zst]``.
        max_sample_bytes: the most bytes one sample's tar records may span (what readers of
            unindexed shards accept); a larger sample is refused before it is read.

    Raises:
        ConfigError: an unknown compression, a limit that is not positive, or a prefix that is not
            a plain file-name prefix.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_count: int | None = None
    compression: str | None = None
    level: int = 3
    prefix: str = "data"
    max_sample_bytes: int = MAX_SAMPLE_BYTES

    def __post_init__(self) -> None:
        if self.compression not in _COMPRESSIONS:
            raise ConfigError(f"compression must be one of {_COMPRESSIONS}, not {self.compression!r}")
        if min(self.max_bytes, self.max_sample_bytes, 1 if self.max_count is None else self.max_count) <= 0:
            raise ConfigError(
                f"max_bytes ({self.max_bytes}), max_count ({self.max_count}) and max_sample_bytes "
                f"({self.max_sample_bytes}) must be positive"
            )
        if unsafe_reason(self.prefix) or "/" in self.prefix:
            raise ConfigError(f"prefix {self.prefix!r} must be a plain file-name prefix")

    def shard_path(self, shard_id: int, tag: str = "") -> str:
        """The name of shard ``shard_id``: ``{prefix}-{shard_id:06d}.tar`` or ``.tar.zst``; with a write's
        ``tag`` (one that must not collide with a dataset already there), ``{prefix}-{tag}-{shard_id:06d}...``."""
        stem = f"{self.prefix}-{tag}-" if tag else f"{self.prefix}-"
        return f"{stem}{shard_id:06d}{'.tar.zst' if self.compression == 'zstd' else '.tar'}"


def _field_bytes(key: str, ext: str, value: Any) -> bytes | LocalFile:
    if isinstance(value, (bytes, LocalFile)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if ext.endswith("json") and (value is None or isinstance(value, (dict, list, int, float, bool))):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    raise DatasetError(
        f"sample {key!r}: field {ext!r} is a {type(value).__name__}; give bytes, str, an int, a LocalFile, or a "
        f"JSON value for a '.json' field (encode anything else yourself)"
    )


def sample_members(sample: Mapping[str, Any], number: int) -> tuple[str, list[Member]]:
    """Check one sample and return ``(key, [(member name, bytes or LocalFile), ...])`` in sorted field order.

    Raises:
        DatasetError: unsafe or ambiguous key, bad field name, no fields, unsupported value type.
    """
    key = sample.get("__key__", f"{number:09d}")
    if not isinstance(key, str):
        raise DatasetError(f"sample {number}: '__key__' is {key!r}, not a str")
    reason = unsafe_reason(key)
    if reason:
        raise DatasetError(f"sample {number}: key {key!r} cannot name a tar member: {reason}")
    if "." in key.rsplit("/", 1)[-1]:
        raise DatasetError(
            f"sample {number}: key {key!r} has a dot in its last part; readers split 'key.ext' at the first dot "
            f"of the basename, so it would not read back. Replace the dot (dots in directory parts are fine)."
        )
    members: list[Member] = []
    for ext in sorted(k for k in sample if not k.startswith("__")):
        if not isinstance(ext, str) or not ext or "/" in ext or "\0" in ext:
            raise DatasetError(f"sample {key!r}: field name {ext!r} is not a valid extension (non-empty, no '/')")
        name = f"{key}.{ext}"
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DatasetError(f"sample {key!r}: member name {name!r} is not valid UTF-8") from exc
        if unsafe_reason(name):
            raise DatasetError(f"sample {key!r}: member name {name!r} is unsafe: {unsafe_reason(name)}")
        members.append((name, _field_bytes(key, ext, sample[ext])))
    if not members:
        raise DatasetError(f"sample {key!r} has no fields: a tar sample needs at least one 'key.ext' member")
    return key, members


class DatasetWriter:
    """Write samples into shards at ``dest`` and the index last; see the module docstring.

    Call order: ``write(sample)`` any number of times, then ``close()`` (returns the
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
        self._cctx = zstandard.ZstdCompressor(level=spec.level, write_content_size=True) if spec.compression else None
        self._trailer = self._cctx.compress(END_OF_ARCHIVE) if self._cctx else END_OF_ARCHIVE
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_pending), thread_name_prefix="streamio-upload")
        self._slots = threading.Semaphore(max(1, max_pending))
        self._futures: list[Future[None]] = []
        self._buffers: collections.deque[bytearray] = collections.deque()  # free shard buffers
        self._shards: list[ShardInfo] = []
        self._layouts: dict[int, SampleLayout] = {}
        self._tokens: dict[int, dict[str, list[int]]] = {}
        self._keys: set[str] = set()
        self._last_key: str | None = None
        self.samples_written = 0
        self.bytes_written = 0
        self.index: DatasetIndex | None = None
        self._closed = False
        self._new_shard()

    def _new_shard(self) -> None:
        self._shard = ShardBuffer(self._buffers.pop() if self._buffers else bytearray())

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (raises DatasetError for an invalid one, naming it; the writer stays usable)."""
        if self._closed:
            raise DatasetError(f"writer for {self.store.root_url} is closed")
        self._raise_upload_error()
        key, members = sample_members(sample, self.samples_written)
        if key == self._last_key:
            raise DatasetError(
                f"sample {self.samples_written}: key {key!r} repeats the previous sample's key; readers would merge "
                f"the two. Give every sample a distinct '__key__'."
            )
        raw_size = record_size(members)
        if raw_size > self.spec.max_sample_bytes:
            raise DatasetError(
                f"sample {key!r} spans {raw_size:,} bytes of tar records, more than the {self.spec.max_sample_bytes:,} "
                f"a sample may (ShardSpec.max_sample_bytes: readers of unindexed shards refuse larger ones). Split it."
            )
        if self._cctx is not None:
            frame = compressed(members, self._cctx, raw_size)
            pieces, size = (frame,), len(frame)
        else:
            pieces, size = records(members), raw_size  # streamed into the shard: files are read here
        count = self._shard.count
        if count and (
            self._shard.size + size + len(self._trailer) > self.spec.max_bytes
            or (self.spec.max_count is not None and count >= self.spec.max_count)
        ):
            self._finish_shard()
        self.bytes_written += self._shard.add(pieces, raw_size, member_tokens(key, members))
        self._last_key = key
        self._keys.update(name[len(key) + 1 :] for name, _ in members)
        self.samples_written += 1

    def _finish_shard(self) -> None:
        shard_id = len(self._shards)
        path = self.spec.shard_path(shard_id, self._generation.tag)
        buf, total, crc, layout = self._shard.finish(self._trailer, compressed=self._cctx is not None)
        self._shards.append(ShardInfo(path, total, self._shard.count, format_checksum(crc)))
        self._layouts[shard_id] = layout
        self._tokens[shard_id] = self._shard.token_counts()
        self._slots.acquire()  # at most max_pending shards (and buffers) in flight
        try:
            future = self._pool.submit(self.store.put, path, memoryview(buf)[:total])
        except BaseException:
            self._slots.release()
            raise

        def done(_: object, buf: bytearray = buf) -> None:
            self._buffers.append(buf)  # the put has returned: nothing reads the buffer any more
            self._slots.release()

        future.add_done_callback(done)
        self._futures.append(future)  # type: ignore[arg-type]
        log.debug("shard %s: %d samples, %d bytes, queued for upload", path, self._shards[-1].samples, total)
        self._new_shard()

    def _raise_upload_error(self) -> None:
        for f in self._futures:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        self._futures = [f for f in self._futures if not f.done()]

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
            if self._shard.count:
                self._finish_shard()
            for f in self._futures:
                f.result()
        except BaseException as exc:
            self._stopped(exc)
            raise
        finally:
            self._pool.shutdown(wait=True)
            self._buffers.clear()
        if not self._shards:
            publish.discard(self.store)
            raise DatasetError(f"no samples were written to {self.store.root_url}: the source is empty")
        index = make_index(self._shards, self._layouts, self._keys, self._tokens)
        publish.commit(self.store, self._generation, self._previous, index, self.inline_limit)
        self.index = index
        return index

    def abort(self) -> None:
        """Stop without writing an index: the dataset at ``dest`` (if any) is untouched; the shards
        already stored stay, unreferenced, until a write with ``overwrite=True`` removes them."""
        self._closed = True
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)  # uploads in flight finish (no temp file is left)
        self._buffers.clear()
        if not self._shards:
            publish.discard(self.store)

    def _stopped(self, exc: BaseException) -> None:
        """Say what a write that stopped left behind, and how to clean it up."""
        if not self._shards:
            return
        url = self.store.root_url
        log.warning(
            "writing %s stopped (%s): no index was written, so %s still holds the dataset it held before, if any. "
            "The %d shards this write stored (%s) are not part of it: the next write there with overwrite=True "
            "(`streamio shard SRC %s --overwrite`) removes them.",
            url, type(exc).__name__, url, len(self._shards), self._generation.pattern, url,
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
