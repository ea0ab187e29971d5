"""Shard bytes -> samples: members grouped by key, and reads verified against the index.

A sample is ``{"__key__": key, "ext": bytes, ...}``: the members ``key.ext`` of a WebDataset tar
that share a ``key`` (everything up to the first dot of the basename, as
``webdataset.tariterators.base_plus_ext`` splits it; :func:`streamio.data.format.layout.split_name`). A
``.tar.zst`` shard written by streamio holds one zstd frame per sample (plus a last frame with the
end-of-archive blocks), so the file is one valid zstd stream of one valid tar and a reader can
start decoding at any sample's offset. The tar records themselves are parsed by
:mod:`streamio.data.format.tar`.

Design and reasons:

* **Verified before yielded**: with a :class:`~streamio.data.format.layout.SampleLayout` (offsets and
  per-sample CRC32C from the index), each sample's stored bytes are checked for size and CRC32C
  before anything of it is yielded, so no unverified byte reaches training (s3fs hands back flipped
  bytes silently on ranged reads). Without a layout (foreign shards) only the tar structure is
  checked.
* **Bounded**: memory is one sample: its byte range when an index gives it (or a batch of
  small ones, at most 64 KiB: :func:`iter_sample_batches`), ``max_sample_bytes`` otherwise
  (default :data:`~streamio.data.format.layout.MAX_SAMPLE_BYTES`, 1 GiB); ``.tar.zst`` is
  decompressed as a stream with that output limit (:mod:`streamio.data.format.zstdframes`), never
  by what a frame header declares.

Errors and the ``handler``: by default every problem raises. A ``handler(exc) -> bool`` (the
WebDataset convention: ``webdataset.ignore_and_continue`` / ``warn_and_continue`` work) can ask to
go on: returning True skips the unsafe member (unsafe name or type, duplicate field, member without
an extension: a :class:`~streamio.data.format.tar.MemberError`), or the whole sample for a
:class:`CorruptDataError` when a layout is given; after a structural error (truncated or non-tar
bytes) the rest of the shard cannot be located, so True ends the shard there, dropping the sample
being assembled (nothing proves it was complete; webdataset yields it partial). Returning False
re-raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import zstandard

from streamio.checksum import crc32c
from streamio.data.format import zstdframes
from streamio.data.format.layout import MAX_SAMPLE_BYTES, SampleLayout, split_name
from streamio.data.format.plain import plain_batch, plain_sample
from streamio.data.format.tar import ChunkReader, Handler, MemberError, iter_members
from streamio.deprecation import fold_moved
from streamio.errors import ConfigError, CorruptDataError, ShardFormatError

__all__ = ["Handler", "Sample", "SampleSpan", "group_samples", "iter_sample_batches", "iter_samples"]

log = logging.getLogger(__name__)

Sample = dict[str, Any]


def group_samples(
    members: Iterable[tuple[int, str, bytes]],
    *,
    url: str,
    handler: Handler | None = None,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
) -> Iterator[tuple[int, Sample]]:
    """``(offset, name, data)`` members -> ``(offset of the sample's first member, sample)``, by key.

    A sample whose members span more than ``max_sample_bytes`` of the stream is refused
    (:class:`ShardFormatError`) as the member that crosses the limit arrives.
    """
    current: Sample | None = None
    current_key = None
    start = 0
    for offset, name, data in members:
        parts = split_name(name)
        try:
            if parts is None:
                raise MemberError(
                    f"shard {url!r}: member {name!r} at byte {offset} has no extension, so it belongs to no "
                    f"sample (members are named key.ext). Rename it, or pass a handler that skips it."
                )
            key, ext = parts
            if key != current_key:
                if current is not None:
                    yield start, current
                current, current_key, start = {"__key__": key}, key, offset
            elif offset + len(data) - start > max_sample_bytes:
                raise ShardFormatError(
                    f"shard {url!r}: sample {key!r} at byte {start} spans more than {max_sample_bytes} bytes (member "
                    f"{name!r} at byte {offset}), more than a sample may hold (max_sample_bytes): the shard is damaged "
                    f"or hostile, or pass a larger max_sample_bytes."
                )
            elif ext in current:  # type: ignore[operator]
                raise MemberError(
                    f"shard {url!r}: member {name!r} at byte {offset} repeats field {ext!r} of sample {key!r}"
                )
        except MemberError as exc:
            if handler is not None and handler(exc):
                continue
            raise
        current[ext] = data  # type: ignore[index]
    if current is not None:
        yield start, current


@dataclass(frozen=True)
class SampleSpan:
    """Which samples of a shard a stream of its bytes holds (the default: all, from the start).

    Attributes:
        start_offset: byte offset of the stream's first byte in the shard; with a layout, where
            sample ``first_sample`` starts (``layout.offsets[first_sample]``).
        first_sample: index of the first sample in the stream (for messages and the layout).
        num_samples: with a layout, how many samples the stream holds (a ranged read of part of a
            shard); None: every one to the shard's last.
    """

    start_offset: int = 0
    first_sample: int = 0
    num_samples: int | None = None


def iter_samples(
    chunks: Iterable[bytes],
    *,
    url: str,
    span: SampleSpan | None = None,
    layout: SampleLayout | None = None,
    compression: str | None = None,
    handler: Handler | None = None,
    max_sample_bytes: int | None = None,
    **moved: Any,
) -> Iterator[Sample]:
    """Samples from the bytes of one shard, starting at sample ``span.first_sample``.

    Memory is bounded by one sample: with a layout, by the sample's byte range (``.tar``) or the
    layout's ``max_sample_bytes`` (``.tar.zst``, decompressed); without one, by
    ``max_sample_bytes``. Decompression is streamed and stops one byte past that bound.

    Args:
        chunks: the shard's bytes from ``span.start_offset`` on, in pieces of any size (e.g.
            ``store.iter_bytes(path, start_offset)``): ``bytes`` or read-only memoryviews (e.g. of
            an mmapped file) are used without copying; writable buffers are copied first.
        url: the shard, named in every error.
        span: where in the shard the stream starts and, with a layout, how many samples it holds
            (:class:`SampleSpan`; None: the whole shard).
        layout: the shard's offsets and per-sample CRC32C. With it, every sample is checked for
            size and CRC32C before it is yielded, and the stream is expected to hold every sample
            of the span.
        compression: None for ``.tar``, ``"zstd"`` for ``.tar.zst``.
        handler: ``handler(exc) -> bool``, see the module docstring; None raises.
        max_sample_bytes: the most bytes of tar records one sample may span (decompressed);
            None takes the layout's, else :data:`~streamio.data.format.layout.MAX_SAMPLE_BYTES`.
        moved: ``start_offset=``, ``first_sample=``, ``num_samples=`` as streamio 0.2 took them:
            deprecated (a warning), removed in 0.4.0; give them in ``span``.

    Yields:
        ``{"__key__": str, "<ext>": bytes, ...}`` in shard order.

    Raises:
        ShardFormatError: truncated, non-tar or non-zstd bytes, an invalid header field, unsafe member,
            a sample over its size bound (shard, byte offset, member).
        CorruptDataError: a sample's bytes do not match the layout (shard, sample, offset).
        ConfigError: the span's ``start_offset`` disagrees with the layout, or unknown ``compression``.
        ArgumentError: an unknown keyword, or a moved one given together with ``span``.
    """
    span = fold_moved("iter_samples", moved, into="span", given=span, make=SampleSpan,
                      fields=("start_offset", "first_sample", "num_samples"))
    return _iter_samples(chunks, url, span or SampleSpan(), layout, compression, handler, max_sample_bytes)


def iter_sample_batches(
    chunks: Iterable[bytes],
    *,
    url: str,
    span: SampleSpan,
    layout: SampleLayout,
    compression: str | None = None,
    handler: Handler | None = None,
    max_sample_bytes: int | None = None,
) -> Iterator[list[Sample]]:
    """:func:`iter_samples` over a shard with a layout, its samples handed out in lists of consecutive ones.

    What the read path consumes: plain samples that pass their checks come in lists of about
    :data:`~streamio.data.format.plain.BATCH_BYTES` (:mod:`streamio.data.format.plain`: one call
    and one list per batch instead of a generator step per sample); any sample that needs more (a
    checksum failure, a truncation, the full tar parser, a zstd frame) comes alone, checked by the
    per-sample path at the same point of the stream, with the same errors and the same ``handler``
    calls as :func:`iter_samples`. An error of the byte stream itself is raised after the samples
    before it have been handed out. Memory: one batch, or one sample when a sample is larger.

    Args: as :func:`iter_samples` (``span`` and ``layout`` required).

    Yields:
        non-empty lists of samples, in shard order.

    Raises:
        as :func:`iter_samples`.
    """
    _check_compression(compression, url)
    if max_sample_bytes is None:
        max_sample_bytes = layout.max_sample_bytes or MAX_SAMPLE_BYTES
    start_offset, first_sample, num_samples = span.start_offset, span.first_sample, span.num_samples
    count = len(layout.offsets) - 1
    if not 0 <= first_sample <= count:
        raise ConfigError(f"shard {url!r} has {count} samples; cannot start at sample {first_sample}")
    if start_offset != layout.offsets[first_sample]:
        raise ConfigError(
            f"shard {url!r}: sample {first_sample} starts at byte {layout.offsets[first_sample]}, not {start_offset}"
        )
    stop = count if num_samples is None else min(count, first_sample + num_samples)
    src = ChunkReader(chunks, start_offset)
    yield from _verified_batches(src, url, layout, range(first_sample, stop), compression, handler, max_sample_bytes)


def _iter_samples(
    chunks: Iterable[bytes],
    url: str,
    span: SampleSpan,
    layout: SampleLayout | None,
    compression: str | None,
    handler: Handler | None,
    max_sample_bytes: int | None,
) -> Iterator[Sample]:
    _check_compression(compression, url)
    if layout is not None:
        for batch in iter_sample_batches(chunks, url=url, span=span, layout=layout, compression=compression,
                                         handler=handler, max_sample_bytes=max_sample_bytes):
            yield from batch
        return
    limit = MAX_SAMPLE_BYTES if max_sample_bytes is None else max_sample_bytes
    stream: Iterable[bytes] = chunks
    offset = span.start_offset
    if compression == "zstd":  # offsets in messages are then those of the decompressed tar
        stream, offset = zstdframes.decompress(chunks, url=url, what="the zstd stream", start=span.start_offset), 0
    try:
        members = iter_members(stream, url=url, start_offset=offset, handler=handler, max_sample_bytes=limit)
        for _, sample in group_samples(members, url=url, handler=handler, max_sample_bytes=limit):
            yield sample
    except ShardFormatError as exc:
        if isinstance(exc, MemberError):
            raise
        _structural(exc, handler)


def _check_compression(compression: str | None, url: str) -> None:
    if compression not in (None, "zstd"):
        raise ConfigError(f"unknown compression {compression!r} for shard {url!r}: expected None or 'zstd'")


def _structural(exc: ShardFormatError, handler: Handler | None) -> None:
    if handler is not None and handler(exc):
        log.warning("ending shard early: %s", exc)
        return
    raise exc


_END = object()  # _one_sample: the shard ends here (a truncation the handler chose to skip)


def _verified_batches(
    src: ChunkReader,
    url: str,
    layout: SampleLayout,
    samples: range,
    compression: str | None,
    handler: Handler | None,
    max_sample_bytes: int,
) -> Iterator[list[Sample]]:
    offsets = layout.offsets
    dctx = zstandard.ZstdDecompressor() if compression == "zstd" else None  # one per run: they cost to make
    i, stop = samples.start, samples.stop
    while i < stop:
        batch: list[Sample] = []
        try:
            data = plain_batch(src, layout, i, stop, batch) if dctx is None else None
        except Exception:  # the byte stream failed: hand out what came before it, as one sample at a time would
            if batch:
                yield batch
            raise
        i += len(batch)
        if batch:
            yield batch
        if i == stop or (data is None and dctx is None):  # the end, or a full batch
            continue
        if data is None:
            data = src.view(offsets[i + 1] - offsets[i])
        sample = _one_sample(data, i, url, layout, dctx, handler, max_sample_bytes)
        if sample is _END:
            return
        if sample is not None:
            yield [sample]  # type: ignore[list-item]
        i += 1


def _one_sample(
    data: bytes | memoryview,
    i: int,
    url: str,
    layout: SampleLayout,
    dctx: zstandard.ZstdDecompressor | None,
    handler: Handler | None,
    max_sample_bytes: int,
) -> Sample | object | None:
    """Sample ``i`` from its bytes, every check with its own error: the sample, None (skipped) or :data:`_END`."""
    offsets, checksums = layout.offsets, layout.checksums
    begin, size = offsets[i], offsets[i + 1] - offsets[i]
    if len(data) < size:
        _structural(
            ShardFormatError(
                f"shard {url!r} ends at byte {begin + len(data)}, inside sample {i} ({begin}..{begin + size}): "
                f"it is truncated. Re-fetch it or re-run `streamio verify` on its dataset."
            ),
            handler,
        )
        return _END
    if crc32c(data) != checksums[i]:
        exc = CorruptDataError(
            f"shard {url!r}: sample {i} (bytes {begin}..{begin + size}) fails its CRC32C check: the bytes read "
            f"are corrupt. Retry the read; if it persists, re-run `streamio verify` on the dataset."
        )
        if handler is not None and handler(exc):
            return None
        raise exc
    if dctx is None:
        sample = plain_sample(data)
        if sample is not None:
            return sample
    stream: Iterable[bytes] = (bytes(data),)
    limit = size
    if dctx is not None:
        what = f"sample {i} at byte {begin}"
        stream = zstdframes.decompress_sample(data, dctx, url=url, what=what, limit=max_sample_bytes, start=begin)
        limit = max_sample_bytes
    members = iter_members(
        stream, url=url, start_offset=begin, require_end=False, handler=handler, max_sample_bytes=limit
    )
    found = list(islice(group_samples(members, url=url, handler=handler, max_sample_bytes=limit), 2))
    if len(found) != 1:
        exc2 = ShardFormatError(
            f"shard {url!r}: sample {i} at byte {begin} holds {'no' if not found else 'more than one'} sample's "
            f"members, not 1: the index does not describe this shard. Rebuild it with `streamio index`."
        )
        if handler is not None and handler(exc2):
            return None
        raise exc2
    return found[0][1]
