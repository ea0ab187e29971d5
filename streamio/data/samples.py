"""Shard bytes <-> samples: a streaming tar / tar.zst reader and the tar encoding the writer uses.

A shard is a WebDataset tar: members ``key.ext`` grouped into samples by ``key`` (everything up to
the first dot of the basename, as ``webdataset.tariterators.base_plus_ext`` splits it), read into
``{"__key__": key, "ext": bytes, ...}``. A ``.tar.zst`` shard written by streamio holds one zstd
frame per sample (plus a last frame with the end-of-archive blocks), so the file is one valid zstd
stream of one valid tar and a reader can start decoding at any sample's offset.

Design and reasons:

* **Our own 512-byte header parser** (ustar, GNU longname ``L``, pax ``path``/``size``), not
  ``tarfile``: tarfile costs a ``TarInfo`` object and several small reads per member and stops
  *silently* on a shard cut at a header boundary. Here a stream that ends without the
  end-of-archive block, inside a header or inside a member is a :class:`ShardFormatError` naming
  the shard, the byte offset and the member.
* **Streaming**: bytes arrive as an iterable of chunks (``Store.iter_bytes``); only the member
  being assembled is held. A member lying inside one chunk costs one copy (the slice handed out);
  one straddling chunks is joined once.
* **Verified before yielded**: with a :class:`~streamio.data.index.SampleLayout` (offsets and
  per-sample CRC32C from the index), each sample's stored bytes are checked for size and CRC32C
  before anything of it is yielded, so no unverified byte reaches training (s3fs hands back flipped
  bytes silently on ranged reads). Without a layout (foreign shards) only the tar structure is
  checked.
* **Safe names**: absolute paths, ``..`` components, links, devices and FIFOs are refused
  (nothing is ever extracted; only regular files become sample fields). Directory entries are
  skipped.

Errors and the ``handler``: by default every problem raises. A ``handler(exc) -> bool`` (the
WebDataset convention: ``webdataset.ignore_and_continue`` / ``warn_and_continue`` work) can ask to
go on: returning True skips the unsafe member (unsafe name or type, duplicate field, member without
an extension), or the whole sample for a :class:`CorruptDataError` when a layout is given; after a
structural error (truncated or non-tar bytes) the rest of the shard cannot be located, so True ends
the shard there, dropping the sample being assembled (nothing proves it was complete; webdataset
yields it partial). Returning False re-raises.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import zstandard

from streamio.checksum import crc32c
from streamio.errors import CorruptDataError, ShardFormatError

if TYPE_CHECKING:
    from streamio.data.index import SampleLayout

log = logging.getLogger(__name__)

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
_ZERO_BLOCK = bytes(BLOCK)
# Fixed header fields: same input -> identical bytes, whoever writes and whenever.
MTIME = 0
MODE = 0o644
_PAX_NAME = b"././@PaxHeader"
_MAX_OCTAL_SIZE = 8**11 - 1
_REGULAR = (b"0", b"\0", b"7")
_UNSAFE_TYPES = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device", b"6": "FIFO"}

_WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
Handler = Callable[[Exception], bool]
Sample = dict[str, Any]


# ----------------------------------------------------------------------------- names
def split_name(name: str) -> tuple[str, str] | None:
    """``"dir/key.ext.gz"`` -> ``("dir/key", "ext.gz")``, the WebDataset way; None without an extension."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1:
        return (name[:dot], name[dot + 1 :]) if dot < len(name) - 1 else None
    match = _WDS_SPLIT.match(name)  # a basename starting with a dot: do exactly what webdataset does
    return (match.group(1), match.group(2)) if match and match.group(2) else None


def unsafe_reason(name: str) -> str | None:
    """Why a member name must not be used (absolute, ``..``, empty component, NUL), or None."""
    if not name:
        return "it is empty"
    if "\0" in name:
        return "it contains a NUL byte"
    if name.startswith("/"):
        return "it is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "it has a '..' component"
    if any(p in ("", ".") for p in parts):
        return "it has an empty or '.' path component"
    return None


# ----------------------------------------------------------------------------- writing
def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(key: bytes, value: bytes) -> bytes:
    payload = len(key) + len(value) + 3  # ' ', '=', '\n'
    n = payload + len(str(payload))
    while n != payload + len(str(n)):
        n = payload + len(str(n))
    return b"%d %s=%s\n" % (n, key, value)


def _template() -> bytes:
    h = bytearray(BLOCK)
    h[100:108] = _octal(MODE, 8)
    h[108:116] = _octal(0, 8)
    h[116:124] = _octal(0, 8)
    h[136:148] = _octal(MTIME, 12)
    h[148:156] = b" " * 8  # the checksum field counts as spaces
    h[257:265] = b"ustar\x0000"
    return bytes(h)


_TEMPLATE = _template()
_TEMPLATE_SUM = sum(_TEMPLATE)


def _header(name: bytes, size: int, typeflag: bytes) -> bytearray:
    h = bytearray(_TEMPLATE)
    h[0 : len(name)] = name
    if size <= _MAX_OCTAL_SIZE:
        field = _octal(size, 12)
    else:  # GNU base-256; the pax "size" record says it too
        field = b"\x80" + size.to_bytes(11, "big")
    h[124:136] = field
    h[156:157] = typeflag
    h[148:156] = b"%06o\0 " % (_TEMPLATE_SUM + sum(name) + sum(field) + typeflag[0])
    return h


def _padding(size: int) -> bytes:
    return _ZERO_BLOCK[: -size % BLOCK]


def member_record(name: str, size: int) -> bytes:
    """The header block(s) of a regular-file member ``name`` of ``size`` bytes (deterministic).

    Names that are not ASCII or longer than 100 bytes, and sizes of 8 GiB or more, get a pax
    extended header first (POSIX.1-2001; read by tarfile, GNU tar, webdataset).
    """
    raw = name.encode("utf-8")
    if len(raw) <= 100 and raw.isascii() and size <= _MAX_OCTAL_SIZE:
        return bytes(_header(raw, size, b"0"))
    records = _pax_record(b"path", raw)
    if size > _MAX_OCTAL_SIZE:
        records += _pax_record(b"size", b"%d" % size)
    fallback = raw[:100].decode("utf-8", "ignore").encode("ascii", "replace")
    return b"".join(
        (bytes(_header(_PAX_NAME, len(records), b"x")), records, _padding(len(records)), bytes(_header(fallback, size, b"0")))
    )


def encode_sample(members: Iterable[tuple[str, bytes]]) -> list[bytes]:
    """Tar records of one sample's members, as pieces (headers, data, padding) to join or hash."""
    pieces: list[bytes] = []
    for name, data in members:
        pieces.append(member_record(name, len(data)))
        pieces.append(data)
        pad = -len(data) % BLOCK
        if pad:
            pieces.append(_ZERO_BLOCK[:pad])
    return pieces


# ----------------------------------------------------------------------------- reading
class _Source:
    """Exact-size reads from an iterable of chunks, tracking the absolute byte offset."""

    __slots__ = ("_it", "_buf", "_pos", "offset")

    def __init__(self, chunks: Iterable[bytes], offset: int) -> None:
        self._it = iter(chunks)
        self._buf: bytes | memoryview = b""
        self._pos = 0
        self.offset = offset

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer only at the end of the stream), copied at most once."""
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            self.offset += n
            if type(buf) is bytes:
                return buf if (pos == 0 and end == len(buf)) else buf[pos:end]
            return bytes(buf[pos:end])  # a memoryview chunk (e.g. of an mmapped cache file)
        parts: list[Any] = [memoryview(buf)[pos:]] if pos < len(buf) else []
        have = len(buf) - pos
        self._buf, self._pos = b"", 0
        while have < n:
            chunk = next(self._it, None)
            if chunk is None:
                break
            if type(chunk) is not bytes:
                view = memoryview(chunk)
                # a read-only view (an mmapped cache file) is sliced without a copy; a writable
                # buffer is copied, as its producer may refill it once the next chunk is asked for
                chunk = view.cast("B") if view.readonly else bytes(view)
            need = n - have
            if len(chunk) <= need:
                parts.append(chunk)
                have += len(chunk)
            else:
                parts.append(memoryview(chunk)[:need])
                self._buf, self._pos = chunk, need
                have = n
        self.offset += have
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        return b"".join(parts)


class _Recoverable(ShardFormatError):
    """A problem confined to one member; a handler may skip it."""


def _parse_size(field: bytes) -> int:
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    text = field.strip(b" \0")
    return int(text, 8) if text else 0


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = int(block[148:156].strip(b" \0"), 8)
    except ValueError:
        return False
    unsigned = sum(block) - sum(block[148:156]) + 256
    if stored == unsigned:
        return True
    signed = unsigned - 2 * sum(b for b in block if b > 127) + 2 * sum(b for b in block[148:156] if b > 127)
    return stored == signed


def _pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardFormatError(
                f"shard {url!r}: malformed pax header at byte {offset}; the shard is damaged or not a tar"
            ) from None
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def iter_members(
    chunks: Iterable[bytes],
    *,
    url: str,
    start_offset: int = 0,
    require_end: bool = True,
    handler: Handler | None = None,
    on_end: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, str, bytes]]:
    """Regular-file members of a tar byte stream: ``(offset of its first header, name, data)``.

    Args:
        chunks: the tar bytes, in pieces of any size.
        url: the shard, for messages.
        start_offset: absolute offset of the first byte of ``chunks`` (for messages and offsets).
        require_end: a stream that ends at a header boundary without the end-of-archive block is
            truncated (True), or simply the end of a run of samples (False).
        handler: see the module docstring.
        on_end: called with the offset of the end-of-archive block when the parser reaches it.

    Raises:
        ShardFormatError: truncated or non-tar bytes, unsafe member (unless the handler skips it).
    """
    src = _Source(chunks, start_offset)
    long_name: str | None = None
    pax: dict[str, str] = {}
    first = None  # offset of the first header of the member being assembled
    last_name = None
    while True:
        at = src.offset
        block = src.take(BLOCK)
        if len(block) < BLOCK:
            if not block and first is None and not require_end:
                return
            after = f" after member {last_name!r}" if last_name else ""
            where = "inside a header" if block else "without the end-of-archive block"
            raise ShardFormatError(
                f"shard {url!r} ends at byte {src.offset}{after}, {where}: it is truncated. "
                f"Re-fetch it or re-run `streamio verify` on its dataset."
            )
        if block == _ZERO_BLOCK:
            if on_end is not None:
                on_end(at)
            return
        if not _checksum_ok(block):
            raise ShardFormatError(
                f"shard {url!r}: the 512 bytes at offset {at}{' after member ' + repr(last_name) if last_name else ''} "
                f"are not a valid tar header (bad checksum): the shard is damaged or not a tar file"
            )
        if first is None:
            first = at
        typeflag = block[156:157]
        size = _parse_size(block[124:136])
        if "size" in pax:
            size = int(pax["size"])
        data = src.take(size)
        pad = -size % BLOCK
        padding = src.take(pad) if pad else b""
        if len(data) < size or len(padding) < pad:
            raise ShardFormatError(
                f"shard {url!r} ends at byte {src.offset} inside member {_name(block, long_name, pax)!r} "
                f"(header at {at}, {size} bytes announced): it is truncated. Re-fetch it or re-run `streamio verify`."
            )
        if typeflag == b"L":
            long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if typeflag == b"x":
            pax.update(_pax(data, url, at))
            continue
        if typeflag in (b"g", b"K"):
            continue
        name = _name(block, long_name, pax)
        member_start, first, long_name, pax = first, None, None, {}
        last_name = name
        if typeflag == b"5":
            continue
        if name.startswith("./"):
            name = name[2:]
        problem = None
        if typeflag not in _REGULAR:
            kind = _UNSAFE_TYPES.get(typeflag, f"type {typeflag!r}")
            problem = f"member {name!r} at byte {member_start} is a {kind}; only regular files are read"
        else:
            reason = unsafe_reason(name)
            if reason:
                problem = f"member {name!r} at byte {member_start} is unsafe to read: {reason}"
        if problem is not None:
            exc = _Recoverable(f"shard {url!r}: {problem}. Remove it from the shard, or pass a handler that skips it.")
            if handler is not None and handler(exc):
                continue
            raise exc
        yield member_start, name, data


def _name(block: bytes, long_name: str | None, pax: dict[str, str]) -> str:
    if "path" in pax:
        return pax["path"]
    if long_name is not None:
        return long_name
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX ustar: a prefix field (GNU uses these bytes otherwise)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def group_samples(
    members: Iterable[tuple[int, str, bytes]], *, url: str, handler: Handler | None = None
) -> Iterator[tuple[int, Sample]]:
    """``(offset, name, data)`` members -> ``(offset of the sample's first member, sample)``, by key."""
    current: Sample | None = None
    current_key = None
    start = 0
    for offset, name, data in members:
        parts = split_name(name)
        try:
            if parts is None:
                raise _Recoverable(
                    f"shard {url!r}: member {name!r} at byte {offset} has no extension, so it belongs to no "
                    f"sample (members are named key.ext). Rename it, or pass a handler that skips it."
                )
            key, ext = parts
            if key != current_key:
                if current is not None:
                    yield start, current
                current, current_key, start = {"__key__": key}, key, offset
            elif ext in current:  # type: ignore[operator]
                raise _Recoverable(
                    f"shard {url!r}: member {name!r} at byte {offset} repeats field {ext!r} of sample {key!r}"
                )
        except _Recoverable as exc:
            if handler is not None and handler(exc):
                continue
            raise
        current[ext] = data  # type: ignore[index]
    if current is not None:
        yield start, current


def _decompressed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    dobj = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)
    for chunk in chunks:
        out = dobj.decompress(chunk)
        if out:
            yield out


def iter_samples(
    chunks: Iterable[bytes],
    *,
    url: str,
    start_offset: int = 0,
    first_sample: int = 0,
    layout: SampleLayout | None = None,
    compression: str | None = None,
    handler: Handler | None = None,
    num_samples: int | None = None,
) -> Iterator[Sample]:
    """Samples from the bytes of one shard, starting at sample ``first_sample``.

    Args:
        chunks: the shard's bytes from ``start_offset`` on, in pieces of any size (e.g.
            ``store.iter_bytes(path, start_offset)``): ``bytes`` or read-only memoryviews (e.g. of
            an mmapped file) are used without copying; writable buffers are copied first.
        url: the shard, named in every error.
        start_offset: byte offset of ``first_sample`` in the shard (``layout.offsets[first_sample]``).
        first_sample: index of the first sample in the stream (for messages and the layout).
        layout: the shard's offsets and per-sample CRC32C. With it, every sample is checked for
            size and CRC32C before it is yielded, and the stream is expected to hold every sample
            from ``first_sample`` to the shard's last (or ``num_samples`` of them).
        compression: None for ``.tar``, ``"zstd"`` for ``.tar.zst``.
        handler: ``handler(exc) -> bool``, see the module docstring; None raises.
        num_samples: with a layout, read only this many samples (a ranged read of part of a shard).

    Yields:
        ``{"__key__": str, "<ext>": bytes, ...}`` in shard order.

    Raises:
        ShardFormatError: truncated or non-tar bytes, unsafe member (shard, byte offset, member).
        CorruptDataError: a sample's bytes do not match the layout (shard, sample, offset).
        ValueError: ``start_offset`` disagrees with the layout, or unknown ``compression``.
    """
    if compression not in (None, "zstd"):
        raise ValueError(f"unknown compression {compression!r} for shard {url!r}: expected None or 'zstd'")
    if layout is None:
        stream = _decompressed(chunks) if compression == "zstd" else chunks
        offset = 0 if compression == "zstd" else start_offset
        try:
            for _, sample in group_samples(
                iter_members(stream, url=url, start_offset=offset, handler=handler), url=url, handler=handler
            ):
                yield sample
        except zstandard.ZstdError as exc:
            _structural(
                ShardFormatError(f"shard {url!r}: zstd decompression failed after byte {start_offset}: {exc}"), handler, exc
            )
        except ShardFormatError as exc:
            if isinstance(exc, _Recoverable):
                raise
            _structural(exc, handler)
        return
    yield from _iter_verified(chunks, url, start_offset, first_sample, layout, compression, handler, num_samples)


def _structural(exc: ShardFormatError, handler: Handler | None, cause: BaseException | None = None) -> None:
    if handler is not None and handler(exc):
        log.warning("ending shard early: %s", exc)
        return
    if cause is not None:
        raise exc from cause
    raise exc


def _iter_verified(
    chunks: Iterable[bytes],
    url: str,
    start_offset: int,
    first_sample: int,
    layout: SampleLayout,
    compression: str | None,
    handler: Handler | None,
    num_samples: int | None,
) -> Iterator[Sample]:
    offsets, checksums = layout.offsets, layout.checksums
    count = len(offsets) - 1
    if not 0 <= first_sample <= count:
        raise ValueError(f"shard {url!r} has {count} samples; cannot start at sample {first_sample}")
    if start_offset != offsets[first_sample]:
        raise ValueError(
            f"shard {url!r}: sample {first_sample} starts at byte {offsets[first_sample]}, not {start_offset}"
        )
    stop = count if num_samples is None else min(count, first_sample + num_samples)
    src = _Source(chunks, start_offset)
    dctx = zstandard.ZstdDecompressor() if compression == "zstd" else None
    for i in range(first_sample, stop):
        begin, size = offsets[i], offsets[i + 1] - offsets[i]
        data = src.take(size)
        if len(data) < size:
            _structural(
                ShardFormatError(
                    f"shard {url!r} ends at byte {begin + len(data)}, inside sample {i} ({begin}..{begin + size}): "
                    f"it is truncated. Re-fetch it or re-run `streamio verify` on its dataset."
                ),
                handler,
            )
            return
        if crc32c(data) != checksums[i]:
            exc = CorruptDataError(
                f"shard {url!r}: sample {i} (bytes {begin}..{begin + size}) fails its CRC32C check: the bytes read "
                f"are corrupt. Retry the read; if it persists, re-run `streamio verify` on the dataset."
            )
            if handler is not None and handler(exc):
                continue
            raise exc
        if dctx is not None:
            try:
                data = dctx.decompress(data)
            except zstandard.ZstdError as zexc:
                raise ShardFormatError(
                    f"shard {url!r}: sample {i} at byte {begin} is not one zstd frame ({zexc}); "
                    f"this shard was not written with one frame per sample"
                ) from zexc
        found = list(
            group_samples(
                iter_members((data,), url=url, start_offset=begin, require_end=False, handler=handler),
                url=url,
                handler=handler,
            )
        )
        if len(found) != 1:
            exc2 = ShardFormatError(
                f"shard {url!r}: sample {i} at byte {begin} holds {len(found)} samples' members, not 1: "
                f"the index does not describe this shard. Rebuild it with `streamio index`."
            )
            if handler is not None and handler(exc2):
                continue
            raise exc2
        yield found[0][1]
