"""Bounded decoding of untrusted bytes: JSON documents and zstd frames.

Every document streamio reads back (``index.json`` and its sidecars, manifests, ``latest.json``)
and every compressed payload (a ``.tar.zst`` sample, a compressed checkpoint part) was written by
someone else and may be hostile or damaged. Two things must never depend on what those bytes
*claim*:

* **memory**: a 21-byte zstd frame may declare a 64 GiB content size, and a 16 KB frame may
  inflate to gigabytes. Decompression here is streamed with an explicit output limit that the
  caller takes from the index or manifest (the size it *expects*), never from the frame header;
  one byte past the limit is an error.
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

_CHUNK = 1 << 20


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
    streaming decoder in chunks of at most 1 MiB, and the first byte past ``limit`` stops it.

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
