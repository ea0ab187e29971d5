"""zstd for shards: bounded streamed decompression, and a stream cut into its frames.

A ``.tar.zst`` shard is untrusted input, and the easy calls of python-zstandard trust it:
``ZstdDecompressor().decompress(frame)`` allocates whatever content size the frame header
*declares* (21 bytes can declare 64 GiB: a bare ``MemoryError``), and ``decompressobj()``
returns all the output of the input it was given at once (a 64 KB frame of RLE blocks inflates to
2 GiB in one call). Its ``stream_reader``, on the other hand, ends silently, with no error, on a
stream cut inside a frame. So:

* :func:`decompress` streams through ``stream_reader`` in pieces of at most 1 MiB, stops at the
  first byte past an explicit ``limit`` (what the index declares for a sample; nothing at all for
  a whole foreign archive, where the tar reader downstream bounds what it keeps), and checks the
  framing of the compressed bytes as they pass (:class:`FrameWalker`), so a truncated or
  garbled stream is an error.
* :func:`decompress_sample` is the fast path for one sample already in memory (checked against its
  index): a single frame that declares a content size within the limit, what streamio's writer
  produces, is decompressed in one call into a buffer of exactly that size (zstd fails rather than
  write past it) once its headers show it whole (:func:`streamio.limits.zstd_frame_size`, the walk
  checkpoint parts are checked with too); anything else is streamed as above.
* :func:`split_frames` cuts a stream into its frames by reading only frame and block headers
  (RFC 8878): no decompression, each frame held once, and a frame larger than a limit refused
  before it is complete.

Every error is a :class:`~streamio.errors.ShardFormatError` naming the shard and a byte offset.
Memory: the 1 MiB output piece, zstd's own window (at most 128 MiB, its default decoder limit;
frames declaring more are refused by zstd), and for :func:`split_frames` one frame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn

import zstandard

from streamio.errors import ShardFormatError
from streamio.limits import ZSTD_MAGIC, ZSTD_MAX_BLOCK, zstd_frame_size

MAGIC = ZSTD_MAGIC
MAX_BLOCK = ZSTD_MAX_BLOCK
_OUT = 1 << 20
_IN = 128 * 1024


class FrameWalker:
    """Follows the frame and block headers of a zstd stream as its bytes pass, without decompressing.

    Call :meth:`feed` with each piece in order (it returns the absolute offsets where frames
    ended inside it), then :meth:`finish` (raises if the stream stopped inside a frame).
    Skippable frames are walked over like any other.
    """

    def __init__(self, url: str, start: int = 0) -> None:
        self.url = url
        self.pos = start  # absolute offset of the next byte
        self.frame_start = start
        self.in_frame = False
        self._head = bytearray()
        self._need = 4
        self._on_head: Callable[[bytes], None] = self._magic
        self._skip = 0
        self._on_skipped: Callable[[], None] = self._end
        self._checksum = False
        self._ends: list[int] = []

    def feed(self, chunk: bytes | memoryview) -> list[int]:
        """Walk ``chunk``; returns the offsets just past each frame that ended inside it."""
        view = memoryview(chunk).cast("B")
        i, n = 0, len(view)
        while i < n:
            if self._skip:
                k = min(self._skip, n - i)
                self._skip -= k
                i += k
                self.pos += k
                if not self._skip:
                    self._on_skipped()
                continue
            k = min(self._need - len(self._head), n - i)
            self._head += view[i : i + k]
            i += k
            self.pos += k
            if len(self._head) == self._need:
                head = bytes(self._head)
                self._head.clear()
                self._on_head(head)
        ends, self._ends = self._ends, []
        return ends

    def finish(self) -> None:
        """Raise if the stream ended inside a frame."""
        if self.in_frame or self._head:
            self._fail(f" ends inside the zstd frame at byte {self.frame_start} (at byte {self.pos}): it is truncated")

    # ------------------------------------------------------------------ states
    def _expect(self, n: int, then: Callable[[bytes], None]) -> None:
        self._need, self._on_head = n, then

    def _pass(self, n: int, then: Callable[[], None]) -> None:
        if n:
            self._skip, self._on_skipped = n, then
        else:
            then()

    def _magic(self, head: bytes) -> None:
        self.frame_start, self.in_frame = self.pos - 4, True
        if head == MAGIC:
            self._expect(1, self._descriptor)
        elif head[1:] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:  # skippable frame
            self._expect(4, lambda size: self._pass(int.from_bytes(size, "little"), self._end))
        else:
            self._fail(
                f": the bytes at byte {self.frame_start} are not a zstd frame (magic {head.hex()}): the shard is "
                f"damaged or not zstd"
            )

    def _descriptor(self, head: bytes) -> None:
        fhd = head[0]
        if fhd & 0x08:
            self._fail(f": the zstd frame at byte {self.frame_start} sets a reserved header bit: the shard is damaged")
        single = fhd >> 5 & 1
        content_size = (single, 2, 4, 8)[fhd >> 6]
        self._checksum = bool(fhd & 0x04)
        self._pass((1 - single) + (0, 1, 2, 4)[fhd & 3] + content_size, lambda: self._expect(3, self._block))

    def _block(self, head: bytes) -> None:
        h = int.from_bytes(head, "little")
        last, kind, size = h & 1, h >> 1 & 3, h >> 3
        if kind == 3 or size > MAX_BLOCK:
            why = "of the reserved type" if kind == 3 else f"of {size} bytes (at most {MAX_BLOCK})"
            self._fail(f": the zstd frame at byte {self.frame_start} has a block {why} at byte {self.pos - 3}: damaged")
        body = 1 if kind == 1 else size
        if last:
            self._pass(body + 4 * self._checksum, self._end)
        else:
            self._pass(body, lambda: self._expect(3, self._block))

    def _end(self) -> None:
        self._ends.append(self.pos)
        self.in_frame = False
        self._expect(4, self._magic)

    def _fail(self, what: str) -> NoReturn:
        raise ShardFormatError(f"shard {self.url!r}{what}. Re-fetch it, or re-create it with `streamio shard`.")


class _Input:
    """``read(n)`` over chunks, for ``stream_reader``; every byte is walked by a :class:`FrameWalker`."""

    def __init__(self, chunks: Iterable[bytes], walker: FrameWalker) -> None:
        self._it = iter(chunks)
        self._walker = walker
        self._buf = memoryview(b"")
        self._done = False

    def read(self, n: int = -1) -> bytes:
        while not self._buf and not self._done:
            chunk = next(self._it, None)
            if chunk is None:
                self._done = True
                self._walker.finish()
                break
            self._buf = memoryview(chunk).cast("B")
            self._walker.feed(self._buf)
        size = len(self._buf) if n < 0 else n
        out, self._buf = self._buf[:size], self._buf[size:]
        return bytes(out)


def decompress(
    chunks: Iterable[bytes], *, url: str, what: str, limit: int | None = None, start: int = 0
) -> Iterator[bytes]:
    """The decompressed bytes of the zstd stream ``chunks`` (one or more frames), in pieces of at most 1 MiB.

    Args:
        chunks: compressed bytes, in pieces of any size.
        url: the shard, for messages.
        what: what the bytes are, for messages (``"sample 3 at byte 4096"``).
        limit: the most output accepted in all; one byte more is an error. None: no limit (the
            consumer bounds what it keeps).
        start: absolute offset of the first compressed byte, for messages.

    Raises:
        ShardFormatError: not zstd, truncated, or more than ``limit`` bytes of output.
    """
    walker = FrameWalker(url, start)
    reader = zstandard.ZstdDecompressor().stream_reader(_Input(chunks, walker), read_size=_IN, read_across_frames=True)
    produced = 0
    try:
        while True:
            want = _OUT if limit is None else min(_OUT, limit - produced + 1)
            try:
                piece = reader.read(want)
            except zstandard.ZstdError as exc:
                raise ShardFormatError(
                    f"shard {url!r}: {what} is not valid zstd data (after {produced} bytes of output, near byte "
                    f"{walker.pos} of the shard): {exc}. The shard is damaged; re-fetch or re-create it."
                ) from exc
            if not piece:
                return
            produced += len(piece)
            if limit is not None and produced > limit:
                raise ShardFormatError(
                    f"shard {url!r}: {what} decompresses to more than the {limit} bytes a sample may hold (what the "
                    f"index declares, or max_sample_bytes): the shard is damaged or hostile, or the index is stale. "
                    f"Rebuild the index with `streamio index`."
                )
            yield piece
    finally:
        reader.close()


def decompress_sample(  # noqa: PLR0913 - keyword-only context for messages and limits
    data: bytes,
    dctx: zstandard.ZstdDecompressor,
    *,
    url: str,
    what: str,
    limit: int,
    start: int = 0,
    whole_up_to: int | None = None,
) -> Iterable[bytes]:
    """The decompressed bytes of one sample's zstd data (in memory: one index entry, or one frame).

    The common case, one frame that declares its content size within ``limit`` (what streamio's
    writer produces), is decompressed in one call into a buffer of exactly that size (zstd fails
    rather than write past it) when that size is at most ``whole_up_to`` (default ``limit``);
    anything else goes through :func:`decompress`, in pieces.
    """
    declared = check_declared(data, url=url, what=what, limit=limit)
    if 0 <= declared <= (limit if whole_up_to is None else whole_up_to) and zstd_frame_size(data) == len(data):
        try:
            return (dctx.decompress(data),)
        except zstandard.ZstdError as exc:
            raise ShardFormatError(
                f"shard {url!r}: {what} is not valid zstd data ({exc}). The shard is damaged; re-fetch or re-create it."
            ) from exc
    return decompress((data,), url=url, what=what, limit=limit, start=start)


def check_declared(frame: bytes, *, url: str, what: str, limit: int) -> int:
    """The content size ``frame``'s header declares (-1: none, or not a readable zstd frame header);
    more than ``limit`` is refused before anything is decompressed.

    (A single-segment frame makes the decoder allocate its declared size as the window.)
    """
    if len(frame) < 4 or frame[:4] != MAGIC:
        return -1  # not a plain zstd frame: decompress() says what it is
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError:
        return -1  # an unreadable header: decompress() says so, with context
    if declared > limit:  # -1: not declared
        raise ShardFormatError(
            f"shard {url!r}: {what} is a zstd frame declaring {declared} bytes of content, more than the {limit} "
            f"a sample may hold (what the index declares, or max_sample_bytes): the shard is damaged or hostile, or "
            f"the index is stale. Rebuild the index with `streamio index`."
        )
    return declared


def split_frames(
    chunks: Iterable[bytes], *, url: str, limit: int, on_chunk: Callable[[bytes], None] | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(offset, frame bytes)`` of each frame of a zstd stream, without decompressing it.

    Args:
        chunks: the stream, in pieces of any size.
        url: the shard, for messages.
        limit: a frame growing past this many bytes is an error (before it is complete).
        on_chunk: called with every piece as it passes (e.g. a whole-object checksum).

    Raises:
        ShardFormatError: not zstd, truncated, or a frame over ``limit`` bytes.
    """
    walker = FrameWalker(url)
    held = bytearray()
    held_start = 0  # absolute offset of held[0]
    for chunk in chunks:
        if on_chunk is not None:
            on_chunk(chunk)
        ends = walker.feed(chunk)
        held += chunk
        for end in ends:
            cut = end - held_start
            yield held_start, bytes(held[:cut])
            del held[:cut]
            held_start = end
        if len(held) > limit and walker.in_frame:
            raise ShardFormatError(
                f"shard {url!r}: the zstd frame at byte {held_start} is larger than {limit} bytes; a shard that can be "
                f"indexed holds one frame per sample, of at most max_sample_bytes. Re-shard it with "
                f"`streamio shard {url} DEST --compress zstd`."
            )
    walker.finish()
