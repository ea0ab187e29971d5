"""The fast path of verified reading: plain samples, checked and parsed in batches.

Most shards hold what streamio and most writers produce: each sample a run of ustar headers of
regular files named ``key.ext`` of one key, nothing else. :func:`plain_batch` takes the next such
samples of a stream whose sizes and CRC32C the index gives, one call for about
:data:`BATCH_BYTES` of them: each is checked for size and CRC32C, then :func:`plain_sample` reads
its headers in place (one copy per member, none of the sample). It stops at the first sample that
is anything else (short, corrupt, or needing the full parser of
:mod:`streamio.data.format.tar`) and hands its bytes back, so that
:mod:`streamio.data.format.samples` checks it alone with every error and handler call of the
per-sample path: the fast path never raises a data error and never calls a handler.

Why batches: a generator step per sample through the read path's layers cost as much CPU as the
parse itself (issue 39); a list per batch is one step.
"""

from __future__ import annotations

import struct
from typing import Any

from streamio.checksum import crc32c
from streamio.data.format.layout import SampleLayout
from streamio.data.format.tar import ChunkReader
from streamio.data.format.tarfields import BLOCK

__all__ = ["BATCH_BYTES", "plain_batch", "plain_sample"]

Sample = dict[str, Any]

BATCH_BYTES = 64 << 10
"""Bytes of samples one :func:`plain_batch` takes at most (or one sample, when larger).

Small samples gain most from batches (a 4 KiB sample's parse is mostly per-sample Python); large
ones gain nothing, and a batch must not hold more than glibc's default trim threshold (128 KiB):
a consumer that drops each sample then reuses the same memory for the next, where batches of
1 MiB made glibc give the pages back and fault them in again (0.25 -> 0.6 CPU s/GB measured)."""


def plain_batch(
    src: ChunkReader, layout: SampleLayout, first: int, stop: int, out: list[Sample]
) -> bytes | memoryview | None:
    """Append to ``out`` (empty) the next of samples ``first .. stop-1`` that are whole, pass their CRC32C, are plain.

    At most :data:`BATCH_BYTES` of them, or one sample when it is larger.

    Returns the bytes read of the first sample that is not (the caller checks it on its own), or
    None when the batch is full or the samples ran out. Appends to ``out`` rather than returning
    a list so that what was parsed before an error of the byte stream is not lost.
    """
    offsets, checksums = layout.offsets, layout.checksums
    held = 0
    for i in range(first, stop):
        size = offsets[i + 1] - offsets[i]
        held += size
        if held > BATCH_BYTES and out:
            return None
        data = src.view(size)
        sample = plain_sample(data) if len(data) == size and crc32c(data) == checksums[i] else None
        if sample is None:
            return data
        out.append(sample)
    return None


_PLAIN_TYPES = (b"0", b"\0")  # typeflag "0" or NUL: a regular file
# the header fields the fast path reads, in one call: name (bytes 0-99), size (124-135), typeflag
# (156) and the first byte of the ustar prefix (345); four slices and copies of a memoryview cost
# more (valgrind: 35.9k -> 28.5k instructions per two-member sample)
_FIELDS = struct.Struct("100s24x12s20xc188x1s")


def plain_sample(data: bytes | memoryview) -> Sample | None:
    """The sample one verified byte range holds when it is the plain case, else None (the full parser decides).

    The plain case is what streamio and most writers produce: ustar headers of regular files named
    ``key.ext`` (no directory, so nothing :func:`~streamio.data.format.layout.unsafe_reason` refuses), of
    one key, no pax or GNU records, nothing after the last member's padding. Anything
    else (and every error) goes to :func:`~streamio.data.format.tar.iter_members` +
    :func:`~streamio.data.format.samples.group_samples`, which say what is
    wrong. The 8-bit header sums are not added up here: the caller checked the range's CRC32C
    against the index, which covers every header byte. One copy per member, no other.
    """
    n, pos = len(data), 0
    sample: Sample = {}
    key = None
    unpack = _FIELDS.unpack_from
    try:
        while pos < n:
            body = pos + BLOCK
            if body > n:
                return None  # short
            raw_name, raw_size, kind, prefix = unpack(data, pos)
            if kind not in _PLAIN_TYPES or prefix != b"\0":
                return None  # not a regular file, or a ustar prefix / GNU fields
            head = raw_size.partition(b"\0")[0]
            if not head.isdigit():
                return None
            size = int(head, 8)
            name = raw_name.partition(b"\0")[0].decode("utf-8", "surrogateescape")
            pos = body + size + (-size % BLOCK)
            dot = name.find(".")
            if pos > n or dot < 1 or dot == len(name) - 1 or "/" in name:
                return None  # no extension, a name starting with a dot, or a path: the full checks decide
            ext = name[dot + 1 :]
            if key is None:
                key = name[:dot]
                sample["__key__"] = key
            elif name[:dot] != key or ext in sample:
                return None
            sample[ext] = bytes(data[body : body + size])
    except ValueError:  # an 8 or a 9 in the size field
        return None
    return sample if key is not None else None
