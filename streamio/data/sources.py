"""Where the samples of ``streamio shard SRC`` come from: a directory tree, a JSONL file, or shards.

Each source is a generator of samples (``{"__key__": key, "<ext>": bytes | str, ...}``) for
:class:`~streamio.data.writer.DatasetWriter`; it reads lazily, so memory stays one sample
whatever the source's size.

* :func:`samples_from_directory`: files grouped by key the WebDataset way
  (``a/0001.jpg`` + ``a/0001.cls`` -> sample ``a/0001``);
* :func:`samples_from_jsonl`: one JSON object per line, strings naming files read as bytes;
* :func:`samples_from_shards`: existing ``.tar`` / ``.tar.zst`` shards, streamed in order and,
  having no index, bounded by ``max_sample_bytes`` like any foreign input.

``shuffle_seed`` shuffles the listing with ``random.Random(shuffle_seed)``, not the bytes, so a
shuffled source costs no more memory than an ordered one.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing
from typing import Any

from streamio.data.format import MAX_SAMPLE_BYTES, shard_compression, split_name
from streamio.data.patterns import expand_patterns
from streamio.data.samples import Handler, iter_samples
from streamio.errors import DatasetError, ObjectNotFoundError
from streamio.storage import Store

__all__ = ["samples_from_directory", "samples_from_jsonl", "samples_from_shards"]

log = logging.getLogger(__name__)


def samples_from_directory(root: str, *, shuffle_seed: int | None = None) -> Iterator[dict[str, Any]]:
    """Samples from a directory tree, files grouped by key the WebDataset way.

    ``root/a/0001.jpg`` and ``root/a/0001.cls`` become ``{"__key__": "a/0001", "jpg": ..., "cls": ...}``
    (the key is the relative path up to the first dot of the file name). Samples come in sorted
    key order, or shuffled with ``random.Random(shuffle_seed)`` (the listing is shuffled, the
    bytes are read lazily). Hidden files (``.name``) are skipped.

    Raises:
        DatasetError: no files, a file without an extension, or a file that cannot be read.
    """
    if not os.path.isdir(root):
        raise DatasetError(f"{root} is not a directory")
    groups: dict[str, list[tuple[str, str]]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                log.info("skipping hidden file %s", os.path.join(dirpath, name))
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            parts = split_name(rel)
            if parts is None:
                raise DatasetError(
                    f"{full} has no extension: files are grouped into samples as 'key.ext'. Rename or remove it."
                )
            groups.setdefault(parts[0], []).append((parts[1], full))
    if not groups:
        raise DatasetError(f"{root} holds no files: nothing to shard")
    keys = sorted(groups)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(keys)
    for key in keys:
        sample: dict[str, Any] = {"__key__": key}
        for ext, path in groups[key]:
            sample[ext] = _read_file(path)
        yield sample


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}. Fix it or remove it from the source.") from exc


def samples_from_jsonl(
    path: str, *, file_fields: Iterable[str] | None = None, shuffle_seed: int | None = None
) -> Iterator[dict[str, Any]]:
    """Samples from a JSONL file, one JSON object per line.

    String fields listed in ``file_fields`` name files (relative to the JSONL file's directory or
    absolute) whose bytes become the field; with ``file_fields=None`` any string naming an existing
    file is read. Other strings are stored as UTF-8, other JSON values as JSON text. ``__key__`` is
    taken from the line if present.

    Raises:
        DatasetError: unreadable or empty file, a line that is not a JSON object, a named file missing.
    """
    base = os.path.dirname(os.path.abspath(path))
    forced = set(file_fields) if file_fields is not None else None
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    if not lines:
        raise DatasetError(f"{path} holds no samples: nothing to shard")
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(lines)
    for lineno, line in lines:
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{path}:{lineno} is not valid JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}:{lineno} is a JSON {type(obj).__name__}, not an object (one sample per line)")
        sample: dict[str, Any] = {}
        for field, value in obj.items():
            if field.startswith("__"):
                sample[field] = value
                continue
            if isinstance(value, str):
                target = value if os.path.isabs(value) else os.path.join(base, value)
                if forced is not None and field in forced:
                    sample[field] = _read_file(target)
                elif forced is None and os.path.isfile(target):
                    sample[field] = _read_file(target)
                else:
                    sample[field] = value
            else:
                sample[field] = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        yield sample


def samples_from_shards(
    store: Store,
    patterns: str | Sequence[str] | None = None,
    *,
    handler: Handler | None = None,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
) -> Iterator[dict[str, Any]]:
    """Samples of existing ``.tar`` / ``.tar.zst`` shards (brace / glob patterns), streamed in order.

    The shards are foreign input without an index: every header is checked and a sample spanning
    more than ``max_sample_bytes`` (decompressed) is refused, so a hostile shard stops the
    stream with a :class:`~streamio.errors.ShardFormatError` instead of growing it without end.
    """
    paths = expand_patterns(store, patterns)
    if not paths:
        raise ObjectNotFoundError(
            f"no shards match {patterns!r} under {store.root_url}: nothing to shard. Check the URL."
        )
    for path in paths:
        compression = shard_compression(path)
        with closing(store.iter_bytes(path)) as chunks:
            yield from iter_samples(
                chunks, url=store.url(path), compression=compression, handler=handler, max_sample_bytes=max_sample_bytes
            )
