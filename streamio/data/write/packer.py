"""Samples -> shards, with no dataset around them: what every writer of shards shares.

:class:`ShardPacker` packs samples (``{"__key__": str, "<ext>": bytes | str | JSON | ndarray (.npy), ...}``)
into WebDataset tar shards cut, named and compressed as a :class:`ShardSpec` says, uploads each
finished shard in the background, and records each shard's :class:`ShardInfo` and
:class:`SampleLayout` as the bytes pass. It does not decide what the shards become: a
:class:`~streamio.data.write.writer.DatasetWriter` commits them as a dataset (``index.json``), a
:class:`~streamio.data.write.parts.PartitionedWrite` as one partition of a dataset written by many
tasks. The shard's name is the caller's (``name(shard_number)``).

Design and reasons (the bytes a sample becomes, memory, overlap): see
:mod:`streamio.data.write.writer`'s module docstring, which describes the dataset these shards make.
"""

from __future__ import annotations

import collections
import io
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import zstandard

from streamio import threads
from streamio.checksum import format_checksum
from streamio.data.format.layout import MAX_SAMPLE_BYTES, SampleLayout, ShardInfo, unsafe_reason
from streamio.data.format.tar import END_OF_ARCHIVE
from streamio.data.write.localfiles import LocalFile
from streamio.data.write.shardbuf import Member, ShardBuffer, compressed, member_tokens, record_size, records
from streamio.errors import ConfigError, DatasetError
from streamio.storage import Store

__all__ = [
    "DEFAULT_MAX_BYTES", "EncodedSample", "ShardPacker", "ShardSpec", "compressor", "encode_sample", "sample_members",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256_000_000
_COMPRESSIONS = (None, "zstd")


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
    if ext.endswith("npy") and isinstance(value, np.ndarray):
        return _npy_bytes(key, ext, value)
    raise DatasetError(
        f"sample {key!r}: field {ext!r} is a {type(value).__name__}; give bytes, str, an int, a LocalFile, a "
        f"JSON value for a '.json' field or a numpy array for a '.npy' field (encode anything else yourself)"
    )


def _npy_bytes(key: str, ext: str, value: np.ndarray) -> bytes:  # type: ignore[type-arg]
    """``value`` as the bytes of a ``.npy`` file (never pickled: readers load with ``allow_pickle=False``)."""
    if value.dtype.hasobject:
        raise DatasetError(f"sample {key!r}: field {ext!r} is a numpy array of Python objects ({value.dtype}), which "
                           f".npy stores only pickled; give numbers, or encode it yourself")
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=False)
    return buf.getvalue()


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



class EncodedSample(NamedTuple):
    """One sample as it is stored: what :meth:`ShardPacker.add` appends.

    Attributes:
        key: its ``__key__``.
        fields: its member extensions.
        pieces: its stored bytes (tar records, or one zstd frame of them), in pieces.
        size: how many bytes ``pieces`` hold.
        raw_size: its tar records' bytes (decompressed).
        tokens: the token count of each field that is a 1-D integer ``.npy`` (a document).
    """

    key: str
    fields: tuple[str, ...]
    pieces: Iterable[bytes]
    size: int
    raw_size: int
    tokens: dict[str, int]


def compressor(spec: ShardSpec) -> zstandard.ZstdCompressor | None:
    """The compressor of ``spec``'s shards (None: uncompressed)."""
    return zstandard.ZstdCompressor(level=spec.level, write_content_size=True) if spec.compression else None


def encode_sample(
    sample: Mapping[str, Any], number: int, spec: ShardSpec, cctx: zstandard.ZstdCompressor | None = None,
    *, stream: bool = False,
) -> EncodedSample:
    """Check ``sample`` (the ``number``-th written) and encode it as ``spec`` says (``cctx``: its
    compressor when ``spec.compression``). With ``stream`` (uncompressed only), local files are read
    as the pieces are consumed; otherwise the pieces are bytes, ready to be sent to another process.

    Raises:
        DatasetError: an invalid sample, or one larger than ``spec.max_sample_bytes``.
    """
    key, members = sample_members(sample, number)
    raw_size = record_size(members)
    if raw_size > spec.max_sample_bytes:
        raise DatasetError(
            f"sample {key!r} spans {raw_size:,} bytes of tar records, more than the {spec.max_sample_bytes:,} "
            f"a sample may (ShardSpec.max_sample_bytes: readers of unindexed shards refuse larger ones). Split it."
        )
    fields = tuple(name[len(key) + 1 :] for name, _ in members)
    tokens = member_tokens(key, members)
    if cctx is not None:
        frame = compressed(members, cctx, raw_size)
        return EncodedSample(key, fields, (frame,), len(frame), raw_size, tokens)
    pieces = records(members)  # streamed into the shard: files are read there
    return EncodedSample(key, fields, pieces if stream else (b"".join(pieces),), raw_size, raw_size, tokens)


class ShardPacker:
    """Pack samples into shards stored at ``store`` under ``name(shard_number)``; see the module docstring.

    Call order: :meth:`write` any number of times, then :meth:`flush` (the last shard stored, every
    upload waited for) or :meth:`abort`. Afterwards :attr:`shards`, :attr:`layouts`, :attr:`tokens`
    (each shard's documents' token counts by field) and :attr:`keys` describe what was stored.

    Args:
        store: where the shards go.
        spec: how shards are cut and compressed.
        name: the path of shard ``i`` (0, 1, ...) below ``store``.
        max_pending: shards uploading or waiting to upload at once (memory bound).
        buffers: free shard buffers to fill (and give back) instead of fresh ones: a process that
            makes one packer per shard keeps its buffers from one to the next (a fresh large
            allocation is page-faulted every time, 3-4x slower on these VMs). Not cleared at the end.
    """

    def __init__(
        self, store: Store, spec: ShardSpec, name: Callable[[int], str], *, max_pending: int = 2,
        buffers: collections.deque[bytearray] | None = None,
    ) -> None:
        self.store = store
        self.spec = spec
        self._name = name
        self._cctx = compressor(spec)
        self._trailer = self._cctx.compress(END_OF_ARCHIVE) if self._cctx else END_OF_ARCHIVE
        self._pool = threads.executor(max_pending, "streamio-upload")
        self._slots = threading.Semaphore(max(1, max_pending))
        self._futures: list[Future[None]] = []
        self._keep_buffers = buffers is not None
        self._buffers = collections.deque() if buffers is None else buffers  # free shard buffers
        self.shards: list[ShardInfo] = []
        self.layouts: dict[int, SampleLayout] = {}
        self.tokens: dict[int, dict[str, list[int]]] = {}
        self.keys: set[str] = set()
        self._last_key: str | None = None
        self.samples_written = 0
        self.bytes_written = 0
        self._new_shard()

    def _new_shard(self) -> None:
        self._shard = ShardBuffer(self._buffers.pop() if self._buffers else bytearray())

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (raises DatasetError for an invalid one, naming it; the packer stays usable)."""
        self._raise_upload_error()
        self.add(encode_sample(sample, self.samples_written, self.spec, self._cctx, stream=True))

    def add(self, sample: EncodedSample) -> None:
        """Append one sample encoded by :func:`encode_sample` (here or in another process)."""
        self._raise_upload_error()
        if sample.key == self._last_key:
            raise DatasetError(
                f"sample {self.samples_written}: key {sample.key!r} repeats the previous sample's key; readers would "
                f"merge the two. Give every sample a distinct '__key__'."
            )
        count = self._shard.count
        if count and (
            self._shard.size + sample.size + len(self._trailer) > self.spec.max_bytes
            or (self.spec.max_count is not None and count >= self.spec.max_count)
        ):
            self._finish_shard()
        self.bytes_written += self._shard.add(sample.pieces, sample.raw_size, sample.tokens)
        self._last_key = sample.key
        self.keys.update(sample.fields)
        self.samples_written += 1

    def _finish_shard(self) -> None:
        shard_id = len(self.shards)
        path = self._name(shard_id)
        buf, total, crc, layout = self._shard.finish(self._trailer, compressed=self._cctx is not None)
        self.shards.append(ShardInfo(path, total, self._shard.count, format_checksum(crc)))
        self.layouts[shard_id] = layout
        self.tokens[shard_id] = self._shard.token_counts()
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
        log.debug("shard %s: %d samples, %d bytes, queued for upload", path, self.shards[-1].samples, total)
        self._new_shard()

    def _raise_upload_error(self) -> None:
        for f in self._futures:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        self._futures = [f for f in self._futures if not f.done()]

    def shard_path(self, shard_id: int) -> str:
        """The name shard ``shard_id`` of this packer takes."""
        return self._name(shard_id)

    def adopt(
        self, shard: ShardInfo, layout: SampleLayout, keys: Iterable[str], tokens: dict[str, list[int]] | None = None,
    ) -> None:
        """Record shard number ``len(shards)``, named :meth:`shard_path` and stored by someone else
        (another process packing the same samples the same way), between this packer's own shards."""
        if self._shard.count:
            raise DatasetError(f"cannot adopt {shard.path!r} while shard {len(self.shards)} is being filled here")
        self.layouts[len(self.shards)] = layout
        self.tokens[len(self.shards)] = tokens or {}
        self.shards.append(shard)
        self.keys.update(keys)
        self.samples_written += shard.samples
        self.bytes_written += shard.bytes

    def write_all(self, samples: Iterable[Mapping[str, Any]]) -> None:
        """:meth:`write` every sample, then :meth:`flush`; on any error (or interrupt), :meth:`abort` and raise."""
        try:
            for sample in samples:
                self.write(sample)
            self.flush()
        except BaseException:
            self.abort()
            raise

    def flush(self) -> None:
        """Finish the last shard and wait for every upload (raises the first upload error)."""
        try:
            if self._shard.count:
                self._finish_shard()
            for f in self._futures:
                f.result()
        finally:
            self._pool.shutdown(wait=True)
            self._release()

    def abort(self) -> None:
        """Stop: uploads not started are cancelled, those in flight finish (no temp file is left)."""
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._release()

    def _release(self) -> None:
        if self._keep_buffers:  # the caller's pool: the one being filled goes back too, if it is one
            if len(self._shard.buf):
                self._buffers.append(self._shard.buf)
        else:
            self._buffers.clear()
