"""The shard being filled: samples' tar records written straight into one reusable buffer.

:class:`~streamio.data.write.writer.DatasetWriter` keeps one :class:`ShardBuffer` open at a time. Each
sample's stored bytes (its tar records, or the zstd frame of them) are copied into the buffer as
they are produced, piece by piece, and hashed on the way (the sample's CRC32C and the shard's), so:

* memory is the shard itself and nothing per sample: a member that is a
  :class:`~streamio.data.write.localfiles.LocalFile` arrives in pieces of a few MiB and is never held
  whole anywhere else (before, a sample was read whole and the shard's samples were joined into a
  second copy at the end: two copies of a shard, plus the source file);
* nothing is re-read: offsets and checksums are recorded as the bytes pass;
* a sample that fails half-way (a file that changed while read) is rolled back: the shard is as it
  was before it;
* each document's token count (a member that is a 1-D integer ``.npy``: its header says, read from
  the first :data:`~streamio.data.format.tokens.NPY_HEAD` bytes) is kept per field, for the index.

The buffer is one of the writer's reused upload buffers (a fresh large allocation is page-faulted
on every shard, 3-4x slower on these VMs); it grows when a shard outgrows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import zstandard

from streamio.checksum import crc32c
from streamio.data.format.layout import SampleLayout
from streamio.data.format.tar import member_record
from streamio.data.format.tarfields import BLOCK
from streamio.data.format.tokens import NPY_HEAD, token_fields
from streamio.data.write.localfiles import LocalFile

__all__ = ["Member", "ShardBuffer", "member_tokens", "record_size", "records"]

#: A member as the writer packs it: its name and its bytes, or a local file read when packed.
Member = tuple[str, "bytes | LocalFile"]

_ZEROS = bytes(BLOCK)


def _size(value: bytes | LocalFile) -> int:
    return value.size if isinstance(value, LocalFile) else len(value)


def record_size(members: Iterable[Member]) -> int:
    """Bytes of the tar records of ``members`` (headers, data, padding), known before any is read."""
    return sum(len(member_record(name, _size(v))) + _size(v) + (-_size(v) % BLOCK) for name, v in members)


def records(members: Iterable[Member]) -> Iterator[bytes]:
    """The tar records of ``members`` in pieces: headers, data (a local file in pieces), padding."""
    for name, value in members:
        size = _size(value)
        yield member_record(name, size)
        if isinstance(value, LocalFile):
            yield from value.chunks()
        elif size:
            yield value
        if size % BLOCK:
            yield _ZEROS[: -size % BLOCK]


def _head(value: bytes | LocalFile) -> bytes:
    if not isinstance(value, LocalFile):
        return value[:NPY_HEAD]
    chunks = value.chunks(NPY_HEAD)
    try:
        return next(chunks, b"")
    finally:
        chunks.close()


def member_tokens(key: str, members: Iterable[Member]) -> dict[str, int]:
    """The token count of each ``.npy`` field of sample ``key`` that is a 1-D integer array (by field)."""
    npy = {
        name[len(key) + 1 :]: (_head(v), _size(v))
        for name, v in members
        if name.endswith(".npy") and name.startswith(key + ".")
    }
    return token_fields(npy)


def compressed(members: list[Member], cctx: zstandard.ZstdCompressor, raw_size: int) -> bytes:
    """The sample's tar records as one zstd frame declaring ``raw_size`` (the same bytes as one
    ``cctx.compress`` of them joined, produced piece by piece)."""
    if not any(isinstance(v, LocalFile) for _, v in members):
        return cctx.compress(b"".join(records(members)))
    obj = cctx.compressobj(size=raw_size)
    out = bytearray()
    for piece in records(members):
        out += obj.compress(piece)
    out += obj.flush()
    return bytes(out)


class ShardBuffer:
    """One shard being filled (see the module docstring).

    Call order: :meth:`add` for each sample, then :meth:`finish` once.

    Args:
        buf: the buffer to fill from its start (its length is kept as capacity).
    """

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.size = 0
        self.offsets: list[int] = []
        self.crcs: list[int] = []
        self.crc = 0
        self.biggest = 0  # the largest sample's tar records (what readers decompress a sample into)
        self.tokens: list[dict[str, int]] = []  # each sample's token count per token field

    @property
    def count(self) -> int:
        """Samples added."""
        return len(self.offsets)

    def add(self, pieces: Iterable[bytes], raw_size: int, tokens: dict[str, int] | None = None) -> int:
        """Append one sample's stored bytes (and its token counts by field); returns how many bytes.

        On an error, the shard is as before.
        """
        start, shard_crc = self.size, self.crc
        crc = 0
        try:
            for piece in pieces:
                self._put(piece)
                crc = crc32c(piece, crc)
                self.crc = crc32c(piece, self.crc)
        except BaseException:
            self.size, self.crc = start, shard_crc
            raise
        self.offsets.append(start)
        self.crcs.append(crc)
        self.biggest = max(self.biggest, raw_size)
        self.tokens.append(tokens or {})
        return self.size - start

    def token_counts(self) -> dict[str, list[int]]:
        """Per token field found in every sample, each sample's count (what the index records)."""
        if not self.tokens:
            return {}
        common = set.intersection(*(set(t) for t in self.tokens))
        return {ext: [t[ext] for t in self.tokens] for ext in sorted(common)}

    def finish(self, trailer: bytes, *, compressed: bool) -> tuple[bytearray, int, int, SampleLayout]:
        """Append the end-of-archive ``trailer``: ``(buffer, size, CRC32C, layout)`` of the shard."""
        end = self.size
        self._put(trailer)
        crc = crc32c(trailer, self.crc)
        layout = SampleLayout(tuple(self.offsets) + (end,), tuple(self.crcs), self.biggest if compressed else None)
        return self.buf, self.size, crc, layout

    def _put(self, piece: bytes | bytearray | memoryview) -> None:
        end = self.size + len(piece)
        try:
            if end <= len(self.buf):
                self.buf[self.size : end] = piece
            else:
                del self.buf[self.size :]
                self.buf += piece
        except BufferError:  # a view of this reused buffer is still alive somewhere: fill a fresh one
            self.buf = bytearray(memoryview(self.buf)[: self.size])
            self.buf += piece
        self.size = end
