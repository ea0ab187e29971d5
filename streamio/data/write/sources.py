"""Where the samples of ``streamio shard SRC`` come from: a directory tree, a JSONL file, or shards.

Each source is an iterator of samples (``{"__key__": key, "<ext>": bytes | str, ...}``) for
:class:`~streamio.data.write.writer.DatasetWriter`, a :class:`Samples` that also says how many it
will yield when it knows (for a progress total); it reads lazily, so memory stays one sample
(plus a listing: file names, or 8 bytes per JSONL line) whatever the source's size. With
``stream_files=True`` a member read from a local file is a
:class:`~streamio.data.write.localfiles.LocalFile` the writer streams into the shard instead of its bytes,
so memory does not even hold one file.

Local files are read as :mod:`streamio.data.write.localfiles` decides: regular files only (a FIFO,
socket or device is refused, never opened), symbolic links only to regular files inside the source
tree unless ``follow_symlinks``, and a sample whose files add up to more than ``max_sample_bytes``
is refused on their ``stat`` sizes before a byte is read (a
:class:`~streamio.errors.SourceError` naming every entry refused).

* :func:`samples_from_directory`: files grouped by key the WebDataset way
  (``a/0001.jpg`` + ``a/0001.cls`` -> sample ``a/0001``);
* :func:`samples_from_jsonl`: one JSON object per line, kept whole as the sample's ``json``
  member (types and bytes as they are), or each field its own member on request;
* :func:`samples_from_shards`: existing ``.tar`` / ``.tar.zst`` shards, and gzip'd ``.tar.gz`` /
  ``.tgz`` ones (decompressed as they stream, :mod:`streamio.data.write.gzipstream`), streamed in order
  and, having no index, bounded by ``max_sample_bytes`` like any foreign input.

``shuffle_seed`` shuffles the listing with ``random.Random(shuffle_seed)``, not the bytes, so a
shuffled source costs no more memory than an ordered one.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import IO, Any

from streamio.data.format.layout import GZIP_MAGIC, MAX_SAMPLE_BYTES, is_gzip_shard, shard_compression, split_name
from streamio.data.format.patterns import expand_patterns
from streamio.data.format.samples import Handler, iter_samples
from streamio.data.write import gzipstream
from streamio.data.write.localfiles import LocalFile, local_file, refuse_special_shards, tree_files
from streamio.data.write.shardbuf import record_size
from streamio.errors import DatasetError, NotRegularFileError, ObjectNotFoundError, SourceError
from streamio.storage import Store
from streamio.storage.backends.local import open_regular

__all__ = ["Samples", "samples_from_directory", "samples_from_jsonl", "samples_from_shards"]

log = logging.getLogger(__name__)


class Samples(Iterator[dict[str, Any]]):
    """The samples of a source, and how many there are when the source knows before reading them.

    An iterator like a generator (one pass); ``total`` (None: unknown until read) lets a caller
    show a progress total and an ETA. The listing behind it (files, line offsets, shard paths) is
    made when the source is opened, so an empty or unreadable source fails there.
    """

    def __init__(self, samples: Iterator[dict[str, Any]], total: int | None) -> None:
        self._samples = samples
        self.total = total

    def __next__(self) -> dict[str, Any]:
        return next(self._samples)

    def close(self) -> None:
        """Stop reading (closes the file or stream behind the samples)."""
        close = getattr(self._samples, "close", None)
        if close is not None:
            close()


def samples_from_directory(
    root: str,
    *,
    shuffle_seed: int | None = None,
    follow_symlinks: bool = False,
    stream_files: bool = False,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
) -> Samples:
    """Samples from a directory tree, files grouped by key the WebDataset way.

    ``root/a/0001.jpg`` and ``root/a/0001.cls`` become ``{"__key__": "a/0001", "jpg": ..., "cls": ...}``
    (the key is the relative path up to the first dot of the file name). Samples come in sorted
    key order, or shuffled with ``random.Random(shuffle_seed)`` (the listing is shuffled, the
    bytes are read lazily). Hidden files and directories (``.name``) are skipped. :attr:`Samples.total`
    is the number of keys.

    Args:
        root: the source tree.
        shuffle_seed: shuffle the samples with this seed (None: sorted key order).
        follow_symlinks: also read symbolic links whose target lies outside ``root``.
        stream_files: members are :class:`~streamio.data.write.localfiles.LocalFile` references the writer
            streams, not bytes.
        max_sample_bytes: the most bytes the files of one sample may hold.

    Raises:
        SourceError: entries that are never packed (FIFOs, sockets, devices, links to directories,
            dangling links, links leaving ``root``), or a sample over ``max_sample_bytes``: all
            named, before any file is read.
        DatasetError: no files, a file without an extension, or an entry that cannot be examined.
    """
    if not os.path.isdir(root):
        raise DatasetError(f"{root} is not a directory")
    groups: dict[str, list[tuple[str, LocalFile]]] = {}
    for rel, found in tree_files(root, follow_symlinks=follow_symlinks):
        parts = split_name(rel)
        if parts is None:
            raise DatasetError(
                f"{found.name} has no extension: files are grouped into samples as 'key.ext'. Rename or remove it."
            )
        groups.setdefault(parts[0], []).append((parts[1], found))
    if not groups:
        raise DatasetError(f"{root} holds no files: nothing to shard")
    _check_sizes(groups, max_sample_bytes)
    keys = sorted(groups)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(keys)
    return Samples(_directory_samples(keys, groups, stream_files), len(keys))


def _check_sizes(groups: dict[str, list[tuple[str, LocalFile]]], limit: int) -> None:
    """Refuse, on ``stat`` sizes alone, a sample whose tar records would span more than ``limit`` bytes."""
    for key, files in groups.items():
        total = record_size([(f"{key}.{ext}", f) for ext, f in files])
        if total > limit:
            biggest = max((f for _, f in files), key=lambda f: f.size)
            raise SourceError(
                f"{biggest.name} is {biggest.size:,} bytes: sample {key!r} would span {total:,} bytes of tar records, "
                f"more than the {limit:,} a sample may (max_sample_bytes: readers refuse larger ones). Split it, or "
                f"leave it out of the source."
            )


def _directory_samples(
    keys: list[str], groups: dict[str, list[tuple[str, LocalFile]]], stream_files: bool
) -> Iterator[dict[str, Any]]:
    for key in keys:
        sample: dict[str, Any] = {"__key__": key}
        for ext, found in groups[key]:
            sample[ext] = found if stream_files else found.read()
        yield sample


def _file_member(path: str, files: _Files) -> LocalFile | bytes:
    """The member a JSONL file field names: checked as a regular file within the size limit."""
    found = local_file(path)
    if found.size > files.limit:
        raise SourceError(
            f"{path} is {found.size:,} bytes, more than the {files.limit:,} a sample may hold (max_sample_bytes: "
            f"readers refuse larger ones). Split it, or leave it out of the source."
        )
    return found if files.stream else found.read()


@dataclass(frozen=True)
class _Files:
    """How a JSONL source's file fields are read: relative to ``base``, which fields, streamed or not."""

    base: str
    forced: set[str] | None
    stream: bool
    limit: int


def samples_from_jsonl(
    path: str,
    *,
    split_fields: bool = False,
    file_fields: Iterable[str] | None = None,
    shuffle_seed: int | None = None,
    stream_files: bool = False,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
) -> Samples:
    """Samples from a JSONL file, one JSON object per line.

    By default each line is one sample with one member, ``json``, holding the line's bytes as they
    are: every type is kept (``json.loads`` of the member gives the line's object back), nothing
    is reformatted, and the shards hold about the input's bytes plus the tar framing (a 512-byte
    header per sample, data padded to 512 bytes; ``--compress zstd`` squeezes that out). The key
    is the line's ``"__key__"`` when it has one, else the running number. Fields listed in
    ``file_fields`` name files (relative to the JSONL file's directory, or absolute) whose bytes
    become extra members of the sample under the field's name (``jpg`` -> ``key.jpg``).

    ``split_fields=True`` is the older mapping: every top-level field becomes its own member;
    strings naming a file are read as bytes (only the ``file_fields`` when given, else any string
    naming an existing file), other strings stored as UTF-8, other JSON values as JSON text (the
    number ``0`` becomes the member bytes ``b"0"``: the type is up to the reader's decoder).

    Only the byte offsets of the lines are held (8 bytes a line), so memory does not grow with
    the file's size, shuffled or not; :attr:`Samples.total` is the number of lines. A file a field
    names must be a regular file (a link to one is followed: the line named it) of at most
    ``max_sample_bytes``; with ``stream_files`` it is a
    :class:`~streamio.data.write.localfiles.LocalFile` the writer streams, not bytes.

    Raises:
        DatasetError: unreadable or empty file, a line that is not UTF-8 JSON object, a named file
            missing, a file field named ``json`` without ``split_fields``.
        SourceError: the JSONL file or a file a field names is not a regular file (a FIFO, a device)
            or is over ``max_sample_bytes``.
    """
    forced = set(file_fields) if file_fields is not None else None
    if not split_fields and forced and "json" in forced:
        raise DatasetError(
            f"{path}: the file field 'json' would clash with the 'json' member holding each line; "
            f"rename the field, or store every field as its own member (split fields)"
        )
    local_file(path)  # a regular file: opening a FIFO would wait for a writer
    offsets = _line_offsets(path)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(offsets)  # in place: no list of a Python int per line
    line_sample = _split_line if split_fields else _whole_line
    files = _Files(os.path.dirname(os.path.abspath(path)), forced, stream_files, max_sample_bytes)
    return Samples(_jsonl_samples(path, offsets, line_sample, files), len(offsets))


def _open_jsonl(path: str) -> IO[bytes]:
    """The JSONL file, opened as every local file is (a FIFO swapped in since it was checked: refused)."""
    try:
        return os.fdopen(open_regular(path), "rb")
    except NotRegularFileError as exc:
        raise SourceError(str(exc)) from exc


def _line_offsets(path: str) -> array[int]:
    """Byte offsets of the non-blank lines of ``path`` (one pass, nothing else kept)."""
    offsets = array("Q")
    pos = 0
    try:
        with _open_jsonl(path) as f:
            for line in f:
                if line.strip():
                    offsets.append(pos)
                pos += len(line)
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not offsets:
        raise DatasetError(f"{path} holds no samples: nothing to shard")
    return offsets


def _line_number(path: str, offset: int) -> int:
    """The 1-based number of the line starting at ``offset`` (for messages only: re-reads the file)."""
    with _open_jsonl(path) as f:
        return f.read(offset).count(b"\n") + 1


LineSample = Callable[[dict[str, Any], bytes, "_Files"], dict[str, Any]]


def _jsonl_samples(
    path: str, offsets: array[int], line_sample: LineSample, files: _Files
) -> Iterator[dict[str, Any]]:
    with _open_jsonl(path) as f:
        for offset in offsets:
            f.seek(offset)
            raw = f.readline().strip()
            if offset == 0 and raw.startswith(_BOM):
                raw = raw[len(_BOM):].strip()
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as exc:
                raise DatasetError(
                    f"{path}:{_line_number(path, offset)} is not valid UTF-8 JSON ({_short(exc)})"
                ) from exc
            if not isinstance(obj, dict):
                raise DatasetError(
                    f"{path}:{_line_number(path, offset)} is a JSON {_JSON_TYPES.get(type(obj), type(obj).__name__)}, "
                    f"not an object (one sample per line)"
                )
            yield line_sample(obj, raw, files)


_BOM = b"\xef\xbb\xbf"
_JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "..."


def _whole_line(obj: dict[str, Any], raw: bytes, files: _Files) -> dict[str, Any]:
    """The line as one ``json`` member, plus the files its ``forced`` fields name."""
    sample: dict[str, Any] = {"json": raw}
    if "__key__" in obj:
        sample["__key__"] = obj["__key__"]
    for field in sorted(files.forced or ()):
        value = obj.get(field)
        if not isinstance(value, str):
            raise DatasetError(
                f"sample {obj.get('__key__', '?')!r}: file field {field!r} is {value!r}, not a file name"
            )
        sample[field] = _file_member(value if os.path.isabs(value) else os.path.join(files.base, value), files)
    return sample


def _split_line(obj: dict[str, Any], raw: bytes, files: _Files) -> dict[str, Any]:
    """Every top-level field its own member (the ``split_fields`` mapping)."""
    sample: dict[str, Any] = {}
    for field, value in obj.items():
        if field.startswith("__"):
            sample[field] = value
            continue
        if isinstance(value, str):
            target = value if os.path.isabs(value) else os.path.join(files.base, value)
            if files.forced is not None and field in files.forced:
                sample[field] = _file_member(target, files)
            elif files.forced is None and os.path.isfile(target):
                sample[field] = _file_member(target, files)
            else:
                sample[field] = value
        else:
            sample[field] = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return sample


def samples_from_shards(
    store: Store,
    patterns: str | Sequence[str] | None = None,
    *,
    handler: Handler | None = None,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
) -> Samples:
    """Samples of existing ``.tar`` / ``.tar.zst`` / ``.tar.gz`` shards (brace / glob patterns), streamed in order.

    The shards are foreign input without an index: every header is checked and a sample spanning
    more than ``max_sample_bytes`` (decompressed) is refused, so a hostile shard stops the
    stream with a :class:`~streamio.errors.ShardFormatError` instead of growing it without end.
    Their sample count is not known before reading them (:attr:`Samples.total` is None).
    """
    paths = expand_patterns(store, patterns)
    if not paths:
        raise ObjectNotFoundError(
            f"no shards match {patterns!r} under {store.root_url}: nothing to shard. Check the URL."
        )
    refuse_special_shards(store, paths)  # a FIFO named x.tar: refused by name, with exit 2
    return Samples(_shard_samples(store, paths, handler, max_sample_bytes), None)


def _shard_samples(
    store: Store, paths: list[str], handler: Handler | None, max_sample_bytes: int
) -> Iterator[dict[str, Any]]:
    for path in paths:
        url = store.url(path)
        with closing(store.iter_bytes(path)) as chunks:
            stream, compression, gzipped = _tar_stream(chunks, path, url)
            yield from iter_samples(
                stream, url=url, compression=compression, handler=handler, max_sample_bytes=max_sample_bytes
            )
            if gzipped:  # the tar reader stopped at the end-of-archive: the gzip trailers are still unread
                gzipstream.finish(iter(stream), url=url, limit=max_sample_bytes)


def _tar_stream(chunks: Iterable[bytes], path: str, url: str) -> tuple[Iterable[bytes], str | None, bool]:
    """A source shard's bytes, the compression the tar reader is left with, and whether it was gzip'd: a
    gzip'd shard (by its name, or its first bytes whatever its name) is decompressed here, as it streams."""
    it = iter(chunks)
    first = next(it, b"")
    rest = itertools.chain((first,), it)
    if is_gzip_shard(path) or bytes(first[:2]) == GZIP_MAGIC:
        return gzipstream.decompress(rest, url=url), None, True
    return rest, shard_compression(path), False
