"""gzip'd tar shards as a source: decompressed as a stream, in bounded pieces.

webdataset users often keep shards as ``.tar.gz`` / ``.tgz``. A dataset cannot be made of them: a
gzip stream has no random access, so a reader could not start at a sample's offset (resuming
mid-shard would mean decompressing from the start), and no per-sample frame could be checked on its
own. They are a *source*: ``streamio shard 'in/*.tar.gz' DEST`` reads them once, in order, through
:func:`decompress`, and writes ``.tar`` or ``.tar.zst`` shards with an index.

A gzip'd shard is untrusted input: ``zlib`` is asked for at most :data:`PIECE` bytes of output per
call (the rest of the input is kept as ``unconsumed_tail``), so a small input that inflates hugely
costs time, never memory; the tar parser downstream bounds what it keeps (``max_sample_bytes``) and
stops reading at the end-of-archive blocks. Concatenated gzip members (what ``cat a.gz b.gz`` or
``pigz`` make) are read one after another; a stream that ends inside a member is an error.

A member's trailer (the CRC32 and the length of its data, ``ISIZE``) is what says the data is
whole, and ``zlib`` checks it only when it reaches it: after the tar reader has stopped at the
end-of-archive blocks, :func:`finish` reads the rest of the stream (the archive's padding, at most
``limit`` bytes of it) so that every trailer is checked. A shard cut inside its trailer, or whose
CRC32 or length disagrees, is refused rather than taken whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

from streamio.errors import ShardFormatError

__all__ = ["PIECE", "decompress", "finish"]

#: The most decompressed bytes produced at once.
PIECE = 1 << 20
_GZIP = 16 + zlib.MAX_WBITS  # a gzip header and trailer, not raw deflate or zlib


def decompress(chunks: Iterable[bytes], *, url: str) -> Iterator[bytes]:
    """The decompressed bytes of the gzip stream ``chunks`` (one or more members), in pieces of at most :data:`PIECE`.

    Raises:
        ShardFormatError: not gzip data, corrupt, or cut inside a member (naming ``url``).
    """
    inflater = zlib.decompressobj(_GZIP)
    fed = False  # whether the current member has received input
    try:
        for chunk in chunks:
            data = bytes(chunk)
            fed = fed or bool(data)
            while True:
                piece = inflater.decompress(data, PIECE)
                if piece:
                    yield piece
                if inflater.eof:  # a member ended: the rest of the input is the next member
                    data, inflater = inflater.unused_data, zlib.decompressobj(_GZIP)
                    fed = bool(data)
                    if not data:
                        break
                else:
                    data = inflater.unconsumed_tail
                    if not data and not piece:  # everything given is decompressed: needs more input
                        break
    except zlib.error as exc:
        raise ShardFormatError(f"shard {url!r} is not valid gzip data ({exc}): it is damaged or not gzip'd") from exc
    if fed:
        raise ShardFormatError(f"shard {url!r} ends inside a gzip member: it is truncated. Re-fetch it.")


def finish(pieces: Iterator[bytes], *, url: str, limit: int) -> None:
    """Read the rest of :func:`decompress`'s ``pieces`` (after the end-of-archive) so every gzip trailer is checked.

    Raises:
        ShardFormatError: a trailer is missing or wrong (from :func:`decompress`), or more than
            ``limit`` decompressed bytes follow the archive's end (a bomb after the data).
    """
    after = 0
    for piece in pieces:
        after += len(piece)
        if after > limit:
            raise ShardFormatError(
                f"shard {url!r} holds more than {limit} bytes of gzip data after its tar archive ends: it is "
                f"damaged or hostile. Re-create it with tar and gzip."
            )
