"""Bounded decoding of untrusted bytes: JSON documents and zstd frames.

Every document streamio reads back (``index.json`` and its sidecars, manifests, ``latest.json``)
and every compressed payload (a ``.tar.zst`` sample, a compressed checkpoint part) was written by
someone else and may be hostile or damaged. Two things must never depend on what those bytes
*claim*:

* **memory**: a 21-byte zstd frame may declare a 64 GiB content size, and a 16 KB frame may
  inflate to gigabytes. Decompression here is streamed with an explicit output limit that the
  caller takes from the index or manifest (the size it *expects*), never from the frame header;
  one byte past the limit is an error, and so is a frame cut short (the streaming decoder of
  python-zstandard would hand back its partial output without a word).
* **time and stack**: ``json.loads`` of ``[[[[...`` recurses once per level in C and raises a bare
  ``RecursionError``; a document of gigabytes parses for ever. Documents have a byte limit and a
  nesting limit, checked before and after parsing.

Both raise the caller's error class (``IndexFormatError``, ``CheckpointFormatError``,
``CorruptDataError``, ...) with a message naming the object, so the limit shows up as a streamio
error about *that* file and not as a ``MemoryError`` from somewhere inside a dependency.
"""

from __future__ import annotations

import json
from typing import Any

import zstandard

#: Default byte limit of a JSON document (an index of 50,000 shards is ~9 MB).
MAX_JSON_BYTES = 256 * 1024 * 1024
#: Default nesting limit of a JSON document; streamio's own documents nest under 40 levels.
MAX_JSON_DEPTH = 200
#: Most tokens one document of a token data set may declare (an index's ``tokens``, a plan's input):
#: 2**40, far above any document and far below int64 overflow when an epoch's counts are summed.
MAX_DOCUMENT_TOKENS = 1 << 40

_CHUNK = 1 << 20
#: The magic number that starts every zstd frame (RFC 8878).
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: The largest block a zstd frame may hold.
ZSTD_MAX_BLOCK = 128 * 1024


def load_json(
    data: bytes | str,
    *,
    what: str,
    error: type[Exception],
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse one JSON document of at most ``max_bytes`` bytes and ``max_depth`` nesting levels.

    Args:
        data: the document as read from storage.
        what: names the document in error messages (e.g. ``"manifest s3://b/ckpt/step-1/..."``).
        error: the exception class to raise (a streamio error taking one message argument).
        max_bytes: documents larger than this are refused before parsing.
        max_depth: documents nested deeper than this are refused.

    Raises:
        error: not UTF-8, not JSON, too large or too deeply nested.
    """
    if len(data) > max_bytes:
        raise error(f"{what} is {len(data)} bytes, over the {max_bytes}-byte limit of a JSON document")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise error(f"{what} is nested too deeply to parse (limit {max_depth} levels)") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise error(f"{what} is not valid JSON: {exc}") from exc
    depth = json_depth(doc, limit=max_depth)
    if depth > max_depth:
        raise error(f"{what} is nested {depth}+ levels deep, over the limit of {max_depth}")
    return doc


def json_depth(doc: Any, *, limit: int) -> int:
    """Nesting depth of a parsed JSON value (scalars are 0), counted iteratively; stops past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def zstd_decompress(data: bytes | memoryview, *, limit: int, what: str, error: type[Exception]) -> bytes:
    """Decompress zstd ``data`` (one or more frames) into at most ``limit`` bytes.

    The frame header's declared content size is never used to allocate: output is produced by the
    streaming decoder in chunks of at most 1 MiB, and the first byte past ``limit`` stops it. The
    frame and block headers are walked first (:func:`zstd_framing_problem`), because the streaming
    decoder returns the output of a frame cut short as if it were whole.

    Args:
        data: compressed bytes.
        limit: the most output the caller can accept (the size the index or manifest declares).
        what: names the object in error messages.
        error: the exception class to raise.

    Raises:
        error: not zstd, truncated, or more than ``limit`` bytes of output.
    """
    if limit < 0:
        raise error(f"{what}: negative size limit {limit}")
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise error(f"{what} is not a zstd frame: {exc}") from exc
    if declared > limit:  # -1 means "unknown": decoded below, still bounded
        raise error(f"{what}: zstd frame declares {declared} bytes of content, more than the {limit} expected")
    problem = zstd_framing_problem(data)  # the streaming decoder ends silently on a cut frame
    if problem is not None:
        raise error(f"{what} is truncated or damaged: {problem}")
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True, closefd=False)
    out = bytearray()
    try:
        while True:
            chunk = reader.read(min(_CHUNK, limit - len(out) + 1))
            if not chunk:
                break
            out += chunk
            if len(out) > limit:
                raise error(f"{what}: zstd data decompresses to more than the {limit} bytes expected")
    except zstandard.ZstdError as exc:
        raise error(f"{what}: zstd decompression failed after {len(out)} bytes of output: {exc}") from exc
    finally:
        reader.close()
    return bytes(out)


def zstd_frame_size(data: bytes | memoryview) -> int | None:
    """The compressed size of the zstd frame at the start of ``data``, read from its frame and block
    headers alone (RFC 8878), or None when ``data`` does not start with a whole, well-formed one."""
    n = len(data)
    if n < 6 or data[:4] != ZSTD_MAGIC or data[4] & 0x08:
        return None
    fhd = data[4]
    single = fhd >> 5 & 1
    pos = 5 + (1 - single) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
    while pos + 3 <= n:
        h = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        kind, size = h >> 1 & 3, h >> 3
        if kind == 3 or size > ZSTD_MAX_BLOCK:
            return None
        pos += 3 + (1 if kind == 1 else size)
        if h & 1:
            pos += 4 * (fhd >> 2 & 1)
            return pos if pos <= n else None
    return None


def zstd_framing_problem(data: bytes | memoryview) -> str | None:
    """Why ``data`` is not a sequence of whole zstd frames (skippable ones included), or None.

    Only headers are read, so this costs a few steps per 128 KiB block. It is what tells a cut
    stream from a whole one: python-zstandard's ``stream_reader`` returns the output of a frame cut
    short as if it were complete.
    """
    view = memoryview(data).cast("B")
    pos, n = 0, len(view)
    while pos < n:
        head = bytes(view[pos : pos + 4])
        if len(head) == 4 and head[1:] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:  # skippable frame
            end = pos + 8 + int.from_bytes(view[pos + 4 : pos + 8], "little") if n - pos >= 8 else None
        elif ZSTD_MAGIC.startswith(head):
            size = zstd_frame_size(view[pos:])
            end = None if size is None else pos + size
        else:
            return f"the bytes at offset {pos} are not a zstd frame (magic {head.hex()})"
        if end is None or end > n:
            return f"the zstd frame at offset {pos} runs past the end of the {n} bytes or has a damaged header"
        pos = end
    return None
