"""The dataset index (``index.json``): schema, load / write / validate, and indexing foreign shards.

``index.json`` is what turns a prefix of tar shards into a dataset streamio can plan over::

    {"format": "streamio.dataset/1", "samples": 1200, "keys": ["cls", "jpg"], "compression": null,
     "shards": [{"path": "data-000000.tar", "bytes": 104867840, "samples": 1000,
                 "checksum": "crc32c:1a2b3c4d", "offsets": [0, ...], "crc32c": [...]}, ...]}

Per shard it records the size, the CRC32C of the whole object, the sample count and, for each
sample, the byte offset of its first member (``samples + 1`` offsets, the last one where the
end-of-archive blocks begin) and the CRC32C of its bytes; for ``.tar.zst`` shards also
``max_sample_bytes``, the largest sample after decompression, which is the output limit readers
decompress with (an older index without it gets the readers' default limit). Offsets make sample-exact planning and
mid-shard starts by one ranged GET possible; the per-sample checksums let a reader verify any run
of samples. They sit in the index itself while the dataset is small (``inline_limit`` samples in
all); beyond that each shard's layout goes to a binary sidecar ``_layout/<shard>.bin`` whose
CRC32C the index records, so a 5,000-shard index stays under 1 MB and loads in tens of milliseconds,
and a rank only fetches the sidecars of shards it reads (cached in the index object).

Reasons for the rest: the index is written last in one atomic PUT, so a half-written dataset
never looks complete; ``fingerprint`` hashes the shard list (paths, sizes, counts, checksums) and
nothing about where layouts live, so a resume state can tell "same data" from "other data";
unknown fields are ignored (newer writers may add some) but an unknown ``format`` is refused.

An index is untrusted input like the shards: it is read with a size limit, parsed with a depth
limit, every number and offset is checked, and every shard or sidecar path must be a plain
relative name below the dataset (:mod:`streamio.data.index_schema`) before anything is read on its word.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import Any

import braceexpand
import zstandard

from streamio.checksum import Crc32c, crc32c, format_checksum
from streamio.data import zstdframes
from streamio.data.index_schema import check_document, check_layout, shard_path_problem
from streamio.data.samples import group_samples, iter_members, iter_samples
from streamio.data.tarfields import MAX_SAMPLE_BYTES
from streamio.errors import (
    CorruptDataError,
    DatasetError,
    IndexFormatError,
    IndexNotFoundError,
    ObjectNotFoundError,
    ShardFormatError,
    StorageError,
    StreamioError,
)
from streamio.limits import MAX_JSON_BYTES, load_json
from streamio.storage import Store

log = logging.getLogger(__name__)

FORMAT = "streamio.dataset/1"
INDEX_NAME = "index.json"
LAYOUT_DIR = "_layout"
INLINE_LIMIT = 100_000
_SIDECAR_MAGIC = b"STIOLAY1"
_WHOLE_FRAME = 16 << 20  # a scanned frame declaring up to this is decompressed in one call, larger ones in pieces
_COMPRESSION_BY_SUFFIX = {".tar": None, ".tar.zst": "zstd"}


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the index records it.

    Attributes:
        path: path of the shard relative to the dataset root (``data-000000.tar``).
        bytes: exact size of the shard object.
        samples: number of samples in it.
        checksum: ``"crc32c:..."`` of the whole shard object.
    """

    path: str
    bytes: int
    samples: int
    checksum: str

    @property
    def compression(self) -> str | None:
        """``"zstd"`` for ``.tar.zst`` shards, None for ``.tar``."""
        return "zstd" if self.path.endswith(".zst") else None


@dataclass(frozen=True)
class SampleLayout:
    """Where each sample of one shard lies, and its checksum.

    Attributes:
        offsets: ``samples + 1`` byte offsets; sample ``i`` is ``[offsets[i], offsets[i+1])`` of the
            shard object (its tar members, or its zstd frame in a ``.tar.zst``).
        checksums: CRC32C (int) of each sample's byte range.
        max_sample_bytes: for ``.tar.zst`` shards, the largest sample's tar records after
            decompression: the output limit a reader decompresses a sample with (None: not recorded,
            readers use :data:`~streamio.data.tarfields.MAX_SAMPLE_BYTES`).
    """

    offsets: tuple[int, ...]
    checksums: tuple[int, ...]
    max_sample_bytes: int | None = None

    def byte_range(self, first: int, stop: int) -> tuple[int, int]:
        """``[start, end)`` bytes of samples ``first .. stop-1`` (one ranged GET)."""
        return self.offsets[first], self.offsets[stop]


@dataclass(frozen=True)
class DatasetIndex:
    """A loaded (or freshly built) ``index.json``; immutable, picklable, cheap to share.

    Attributes:
        shards: the shards in dataset order.
        samples: total samples.
        keys: member extensions seen (sorted).
        compression: ``"zstd"`` if every shard is ``.tar.zst``, None if every one is ``.tar``
            (a mixed dataset says ``"mixed"``; each :attr:`ShardInfo.compression` is exact).
        fingerprint: stable hash of the shard list (see module docstring).
    """

    shards: tuple[ShardInfo, ...]
    samples: int
    keys: tuple[str, ...]
    compression: str | None
    fingerprint: str = field(init=False)
    _inline: dict[int, SampleLayout] = field(default_factory=dict, repr=False, compare=False)
    _sidecars: dict[int, tuple[str, str, int | None]] = field(default_factory=dict, repr=False, compare=False)
    _cache: dict[int, SampleLayout] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", fingerprint_of(self.shards))

    def sample_counts(self) -> list[int]:
        """Samples per shard, in order (what the planner takes)."""
        return [s.samples for s in self.shards]

    def layout(self, shard_id: int, store: Store) -> SampleLayout:
        """Offsets and per-sample CRC32C of shard ``shard_id``.

        From the index itself when it holds them, otherwise from the shard's sidecar (read once,
        checked against the CRC32C the index records, then cached).

        Raises:
            IndexFormatError: no layout recorded for the shard, or an invalid sidecar.
            CorruptDataError: the sidecar does not match its recorded checksum.
        """
        found = self._inline.get(shard_id) or self._cache.get(shard_id)
        if found is not None:
            return found
        if shard_id not in self._sidecars:
            raise IndexFormatError(
                f"{store.url(INDEX_NAME)} records no sample offsets for shard {shard_id}; "
                f"rebuild the index with `streamio index {store.root_url}`"
            )
        path, checksum, biggest = self._sidecars[shard_id]
        samples = self.shards[shard_id].samples
        data = store.read(path, 0, _sidecar_size(samples))  # what the index's sample count needs, never more
        if format_checksum(crc32c(data)) != checksum:
            raise CorruptDataError(
                f"layout sidecar {store.url(path)} does not match its checksum {checksum} in {INDEX_NAME}: "
                f"re-read it; if it persists, rebuild with `streamio index {store.root_url}`"
            )
        layout = replace(decode_layout(data, url=store.url(path)), max_sample_bytes=biggest)
        shard = self.shards[shard_id]
        check_layout(layout.offsets, layout.checksums, samples=shard.samples, size=shard.bytes, path=shard.path,
                     url=store.url(INDEX_NAME))
        self._cache[shard_id] = layout
        return layout

    def with_layouts(self, layouts: dict[int, SampleLayout]) -> DatasetIndex:
        """A copy holding these layouts in memory (what writers and ``build_index`` return)."""
        return DatasetIndex(self.shards, self.samples, self.keys, self.compression, _inline=dict(layouts))


def fingerprint_of(shards: Sequence[ShardInfo]) -> str:
    """``sha256:<hex>`` of the canonical shard list (path, bytes, samples, checksum)."""
    canon = json.dumps([FORMAT, [[s.path, s.bytes, s.samples, s.checksum] for s in shards]], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def make_index(shards: Sequence[ShardInfo], layouts: dict[int, SampleLayout], keys: Iterable[str]) -> DatasetIndex:
    """Assemble a :class:`DatasetIndex` from shards and their layouts (writer / build_index)."""
    kinds = {s.compression for s in shards}
    compression = kinds.pop() if len(kinds) == 1 else (None if not kinds else "mixed")
    return DatasetIndex(
        tuple(shards), sum(s.samples for s in shards), tuple(sorted(set(keys))), compression, _inline=dict(layouts)
    )


# ----------------------------------------------------------------------------- sidecars
def encode_layout(layout: SampleLayout) -> bytes:
    """Binary sidecar: magic, count (u64), offsets (count+1 x u64), CRC32C (count x u32), little-endian."""
    offsets = array("Q", layout.offsets)
    crcs = array("I", layout.checksums)
    if sys.byteorder == "big":  # pragma: no cover - little-endian machines only here
        offsets.byteswap()
        crcs.byteswap()
    return _SIDECAR_MAGIC + struct.pack("<Q", len(layout.checksums)) + offsets.tobytes() + crcs.tobytes()


def _sidecar_size(samples: int) -> int:
    return 16 + 8 * (samples + 1) + 4 * samples


def decode_layout(data: bytes, *, url: str) -> SampleLayout:
    """Inverse of :func:`encode_layout`; raises IndexFormatError naming ``url`` on anything else."""
    if data[:8] != _SIDECAR_MAGIC or len(data) < 16:
        raise IndexFormatError(f"layout sidecar {url} is not a {_SIDECAR_MAGIC.decode()} file; rebuild the index")
    (n,) = struct.unpack_from("<Q", data, 8)
    if len(data) != _sidecar_size(n):
        raise IndexFormatError(
            f"layout sidecar {url} has {len(data)} bytes, not what {n} samples need; rebuild the index"
        )
    offsets = array("Q")
    offsets.frombytes(data[16 : 16 + 8 * (n + 1)])
    crcs = array("I")
    crcs.frombytes(data[16 + 8 * (n + 1) :])
    if sys.byteorder == "big":  # pragma: no cover
        offsets.byteswap()
        crcs.byteswap()
    return SampleLayout(tuple(offsets), tuple(crcs))


def sidecar_path(shard_path: str) -> str:
    """Where the layout of ``shard_path`` goes when it is not inline."""
    return f"{LAYOUT_DIR}/{shard_path}.bin"


# ----------------------------------------------------------------------------- load / write
def parse_index(data: bytes, *, url: str) -> DatasetIndex:
    """Parse and validate the bytes of an ``index.json`` (``url`` is named in errors).

    Nothing in it is trusted: the document has a size and nesting limit
    (:func:`streamio.limits.load_json`), and every number, offset and path is checked
    (:mod:`streamio.data.index_schema`) before anything is read on its word.

    Raises:
        IndexFormatError: naming the field at fault.
    """
    doc = check_document(load_json(data, what=url, error=IndexFormatError), url, fmt=FORMAT)
    shards: list[ShardInfo] = []
    inline: dict[int, SampleLayout] = {}
    sidecars: dict[int, tuple[str, str, int | None]] = {}
    for i, e in enumerate(doc.shards):
        shards.append(ShardInfo(e.path, e.bytes, e.samples, e.checksum))
        if e.offsets is not None and e.crcs is not None:
            inline[i] = SampleLayout(e.offsets, e.crcs, e.max_sample_bytes)
        elif e.sidecar is not None:
            sidecars[i] = (*e.sidecar, e.max_sample_bytes)
    return DatasetIndex(tuple(shards), doc.samples, doc.keys, doc.compression, _inline=inline, _sidecars=sidecars)


def read_bounded(store: Store, path: str, limit: int, *, what: str, error: type[Exception]) -> bytes:
    """The whole object ``path``, streamed, refused with ``error`` as soon as it passes ``limit`` bytes."""
    parts: list[bytes] = []
    total = 0
    with closing(store.iter_bytes(path, chunk_size=1 << 20)) as stream:
        for chunk in stream:
            total += len(chunk)
            if total > limit:
                raise error(f"{what} {store.url(path)} is larger than {limit} bytes, the most it can be; rebuild it "
                            f"with `streamio index {store.root_url}`")
            parts.append(chunk)
    return b"".join(parts)


def load_index(store: Store) -> DatasetIndex:
    """Read and validate ``index.json`` at the root of ``store``.

    Raises:
        IndexNotFoundError: there is none (says to run ``streamio index URL``).
        IndexFormatError: unknown format version, an invalid field, or over the size limit of a
            JSON document (:data:`streamio.limits.MAX_JSON_BYTES`).
    """
    try:
        data = read_bounded(store, INDEX_NAME, MAX_JSON_BYTES, what="the index", error=IndexFormatError)
    except FileNotFoundError as exc:
        raise IndexNotFoundError(
            f"no {INDEX_NAME} at {store.url(INDEX_NAME)}: write the dataset with `streamio shard`, or index "
            f"existing WebDataset shards with `streamio index {store.root_url}`"
        ) from exc
    return parse_index(data, url=store.url(INDEX_NAME))


def index_document(
    index: DatasetIndex, store: Store, *, inline_limit: int = INLINE_LIMIT
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The ``index.json`` document of ``index`` and the sidecars it refers to (``(path, bytes)``)."""
    inline = index.samples <= inline_limit
    entries: list[dict[str, Any]] = []
    sidecars: list[tuple[str, bytes]] = []
    for i, shard in enumerate(index.shards):
        entry: dict[str, Any] = {
            "path": shard.path, "bytes": shard.bytes, "samples": shard.samples, "checksum": shard.checksum
        }
        layout = index.layout(i, store)
        if layout.max_sample_bytes is not None:
            entry["max_sample_bytes"] = layout.max_sample_bytes
        if inline:
            entry["offsets"] = list(layout.offsets)
            entry["crc32c"] = list(layout.checksums)
        else:
            blob = encode_layout(layout)
            path = sidecar_path(shard.path)
            entry["layout"] = path
            entry["layout_checksum"] = format_checksum(crc32c(blob))
            sidecars.append((path, blob))
        entries.append(entry)
    doc = {
        "format": FORMAT,
        "samples": index.samples,
        "keys": list(index.keys),
        "compression": index.compression,
        "fingerprint": index.fingerprint,
        "shards": entries,
    }
    return doc, sidecars


def write_index(store: Store, index: DatasetIndex, *, inline_limit: int = INLINE_LIMIT) -> None:
    """Write ``index.json`` (and, for large datasets, the layout sidecars first) at ``store``'s root.

    ``index.json`` is the last object written, in one atomic PUT: until it exists the dataset is
    not a dataset. Layouts the index does not hold in memory are read from ``store``'s sidecars
    (so write an index back where it was loaded from, or one made by a writer / ``build_index``).
    """
    doc, sidecars = index_document(index, store, inline_limit=inline_limit)
    if sidecars:
        store.put_many(sidecars)
    store.put(INDEX_NAME, json.dumps(doc, separators=(",", ":")).encode())
    log.info("wrote %s: %d shards, %d samples", store.url(INDEX_NAME), len(index.shards), index.samples)


# ----------------------------------------------------------------------------- build (foreign shards)
def _is_shard(path: str) -> bool:
    return path.endswith(".tar") or path.endswith(".tar.zst")


def expand_patterns(store: Store, patterns: str | Sequence[str] | None) -> list[str]:
    """Shard paths (relative to ``store``) named by brace / glob patterns, in pattern order.

    ``None`` means every ``.tar`` / ``.tar.zst`` below the root. Braces are expanded here (s3fs's glob
    does not); glob characters are matched against one fresh listing.
    """
    if patterns is None:
        return [o.path for o in store.list() if _is_shard(o.path) and not o.path.startswith(LAYOUT_DIR + "/")]
    if isinstance(patterns, str):
        patterns = [patterns]
    listing: list[str] | None = None
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        for expanded in braceexpand.braceexpand(pattern):
            if any(c in expanded for c in "*?["):
                if listing is None:
                    listing = [o.path for o in store.list()]
                matches = sorted(p for p in listing if fnmatch.fnmatchcase(p, expanded))
            else:
                matches = [expanded]
            for m in matches:
                if m not in seen:
                    seen.add(m)
                    out.append(m)
    return out


def split_pattern(url: str) -> tuple[str, str | None]:
    """``"s3://b/ds/shard-{000..009}.tar"`` -> ``("s3://b/ds", "shard-{000..009}.tar")``; no pattern -> ``(url, None)``.

    The root is everything before the first path component holding ``{``, ``*``, ``?`` or ``[``;
    a URL naming one ``.tar`` / ``.tar.zst`` splits into its directory and its name.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    parts = rest.split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in "{*?["):
            root = "/".join(parts[:i]) or ("/" if rest.startswith("/") else ".")
            return (f"{scheme}://{root}" if sep else root), "/".join(parts[i:])
    if _is_shard(parts[-1]):  # one shard named outright
        root = "/".join(parts[:-1]) or ("/" if rest.startswith("/") else ".")
        return (f"{scheme}://{root}" if sep else root), parts[-1]
    return url, None


class _Tee:
    """Chunks pass through; CRC32C of the whole stream and of byte ranges are computed on the way."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.whole = Crc32c()
        self._kept: list[tuple[int, bytes]] = []  # (offset, chunk) not yet fully hashed into ranges
        self._pos = 0  # end of the ranges hashed so far
        self._stream = self._run()

    def __iter__(self) -> Iterator[bytes]:
        return self._stream  # one pass: iterating again continues (draining the trailer)

    def _run(self) -> Iterator[bytes]:
        offset = 0
        for chunk in self._chunks:
            chunk = bytes(chunk)
            self.whole.update(chunk)
            self._kept.append((offset, chunk))
            offset += len(chunk)
            yield chunk

    def range_crc(self, end: int) -> int:
        """CRC32C of ``[previous end, end)``; everything before ``end`` is then forgotten."""
        value = 0
        keep: list[tuple[int, bytes]] = []
        for off, chunk in self._kept:
            lo, hi = max(self._pos, off), min(end, off + len(chunk))
            if lo < hi:
                value = crc32c(chunk[lo - off : hi - off], value)
            if off + len(chunk) > end:
                keep.append((off, chunk))
        self._kept = keep
        self._pos = end
        return value


def scan_shard(
    store: Store, path: str, *, max_sample_bytes: int = MAX_SAMPLE_BYTES
) -> tuple[ShardInfo, SampleLayout, set[str]]:
    """Stream one shard once: size, whole CRC32C, sample offsets and per-sample CRC32C, keys.

    ``.tar`` shards from any writer; ``.tar.zst`` shards only with one zstd frame per sample (as
    ``streamio shard --compress zstd`` writes them), since offsets must point at frame starts.
    Member data is passed over, not kept; memory is bounded by ``max_sample_bytes`` (a sample
    spanning more, decompressed, is refused) whatever the headers or frames declare.

    Raises:
        ShardFormatError: not a tar, truncated, unsafe member, a sample over ``max_sample_bytes``,
            or a zstd frame holding several samples.
    """
    with closing(store.iter_bytes(path)) as stream:
        return scan_chunks(stream, url=store.url(path), path=path, max_sample_bytes=max_sample_bytes)


def scan_chunks(
    chunks: Iterable[bytes], *, url: str, path: str, max_sample_bytes: int = MAX_SAMPLE_BYTES
) -> tuple[ShardInfo, SampleLayout, set[str]]:
    """:func:`scan_shard` on bytes from anywhere (chunks of any size); ``path`` names the shard in the result."""
    if path.endswith(".zst"):
        return _scan_zstd(chunks, url, path, max_sample_bytes)
    return _scan(_Tee(chunks), url, path, max_sample_bytes)


class _Counted:
    """Pieces pass through; ``total`` counts their bytes."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = pieces
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            self.total += len(piece)
            yield piece


def _scan_zstd(
    chunks: Iterable[bytes], url: str, path: str, max_sample_bytes: int
) -> tuple[ShardInfo, SampleLayout, set[str]]:
    whole = Crc32c()
    starts: list[int] = []
    crcs: list[int] = []
    keys: set[str] = set()
    biggest = 0
    end_of_samples: int | None = None
    frame_limit = max_sample_bytes + (max_sample_bytes >> 10) + 1024  # raw blocks: 3 bytes per 128 KiB, headers
    dctx = zstandard.ZstdDecompressor()
    for start, frame in zstdframes.split_frames(chunks, url=url, limit=frame_limit, on_chunk=whole.update):
        if end_of_samples is not None:
            continue  # after the end-of-archive frame: only the whole-object checksum counts
        raw = _Counted(zstdframes.decompress_sample(  # whole when small: a frame per sample, data not kept
            frame, dctx, url=url, what=f"the zstd frame at byte {start}", limit=max_sample_bytes, start=start,
            whole_up_to=_WHOLE_FRAME,
        ))
        ends: list[int] = []
        members = iter_members(raw, url=url, require_end=False, on_end=ends.append, max_sample_bytes=max_sample_bytes,
                               keep_data=False)
        found = list(group_samples(members, url=url, max_sample_bytes=max_sample_bytes))  # data not kept: small
        if len(found) > 1 or (found and ends):
            raise ShardFormatError(
                f"shard {url!r}: the zstd frame at byte {start} holds {len(found)} samples"
                f"{' and the end of the archive' if ends else ''}; indexing needs one frame per sample. "
                f"Re-shard it with `streamio shard {url} DEST --compress zstd`."
            )
        if found:
            starts.append(start)
            crcs.append(crc32c(frame))
            keys.update(k for k in found[0][1] if k != "__key__")
            biggest = max(biggest, raw.total)
        elif ends:
            end_of_samples = start
        else:
            raise ShardFormatError(
                f"shard {url!r}: the zstd frame at byte {start} holds no sample; indexing needs one frame per sample"
            )
    if end_of_samples is None:
        raise ShardFormatError(f"shard {url!r} ends without the end-of-archive blocks: it is truncated")
    layout = SampleLayout(tuple(starts) + (end_of_samples,), tuple(crcs), biggest)
    return ShardInfo(path, whole.size, len(starts), whole.hexdigest()), layout, keys


def _scan(tee: _Tee, url: str, path: str, max_sample_bytes: int) -> tuple[ShardInfo, SampleLayout, set[str]]:
    starts: list[int] = []
    crcs: list[int] = []
    keys: set[str] = set()
    ends: list[int] = []
    members = iter_members(tee, url=url, on_end=ends.append, max_sample_bytes=max_sample_bytes, keep_data=False)
    for start, sample in group_samples(members, url=url, max_sample_bytes=max_sample_bytes):
        if starts:
            crcs.append(tee.range_crc(start))
        else:
            tee.range_crc(start)  # bytes before the first sample (directory entries) belong to none
        starts.append(start)
        keys.update(k for k in sample if k != "__key__")
    end_of_samples = ends[0]  # the end-of-archive block that stopped the parser
    if starts:
        crcs.append(tee.range_crc(end_of_samples))
    for _ in tee:  # drain the trailer so the whole-object CRC covers every byte
        pass
    layout = SampleLayout(tuple(starts) + (end_of_samples,), tuple(crcs))
    return ShardInfo(path, tee.whole.size, len(starts), tee.whole.hexdigest()), layout, keys


def build_index(
    store: Store,
    patterns: str | Sequence[str] | None = None,
    *,
    concurrency: int = 8,
    progress: Callable[[ShardInfo], None] | None = None,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
) -> DatasetIndex:
    """Index existing WebDataset shards: ``.tar`` written by anything (webdataset, ``tar``, ...), and
    ``.tar.zst`` with one zstd frame per sample.

    Shards are streamed (never held whole) and scanned ``concurrency`` at a time. The result is
    not written: pass it to :func:`write_index`.

    Args:
        store: the dataset root; shard paths in the index are relative to it.
        patterns: brace / glob patterns relative to the root (``"shard-{000000..000099}.tar"``);
            None takes every ``.tar`` below the root.
        concurrency: shards scanned at once.
        progress: called with each shard's info as its scan ends (for progress bars).
        max_sample_bytes: the largest sample accepted (its tar records, decompressed); larger
            ones are refused rather than held.

    Raises:
        ObjectNotFoundError: nothing to index: no shard under the root (empty or missing) or none
            matching the patterns, or a shard named by a pattern does not exist.
        DatasetError: a matched path cannot be named in an index.
        ShardFormatError: a shard is not a readable tar (the message names it).
    """
    paths = expand_patterns(store, patterns)
    if not paths and patterns is None:
        raise ObjectNotFoundError(
            f"no .tar or .tar.zst shards under {store.root_url}: it is empty or does not exist. Check the URL, "
            f"or name the shards with a pattern such as '{store.root_url}/shard-{{000000..000099}}.tar'"
        )
    if not paths:
        raise ObjectNotFoundError(
            f"no shards match {patterns!r} under {store.root_url}: check the URL, or give a pattern such as "
            f"'shard-{{000000..000099}}.tar'"
        )
    for path in paths:
        problem = shard_path_problem(path)
        if problem:
            raise DatasetError(
                f"{store.url(path)} cannot be named in an index: its path {path!r} below {store.root_url} is not a "
                f"plain relative name ({problem}). Index from a root that holds it without '..' or schemes."
            )

    def scan(path: str) -> tuple[ShardInfo, SampleLayout, set[str]]:
        result = scan_shard(store, path, max_sample_bytes=max_sample_bytes)
        if progress is not None:
            progress(result[0])
        return result

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(scan, paths))
    keys: set[str] = set()
    for _, _, k in results:
        keys |= k
    return make_index([r[0] for r in results], {i: r[1] for i, r in enumerate(results)}, keys)


# ----------------------------------------------------------------------------- validate
@dataclass(frozen=True)
class BadShard:
    """One shard that failed validation, and why (one sentence naming the fix)."""

    path: str
    reason: str


@dataclass(frozen=True)
class ValidationReport:
    """What :func:`validate` found: ``ok`` when ``bad`` is empty."""

    checked: int
    deep: bool
    bad: tuple[BadShard, ...]

    @property
    def ok(self) -> bool:
        return not self.bad


def _deep_check(store: Store, index: DatasetIndex, i: int) -> str | None:
    shard = index.shards[i]
    url = store.url(shard.path)
    try:
        layout = index.layout(i, store)
        whole = Crc32c()

        def counted(chunks: Iterable[bytes]) -> Iterator[bytes]:
            for chunk in chunks:
                whole.update(chunk)
                yield chunk

        with closing(store.iter_bytes(shard.path)) as raw:
            stream = counted(raw)
            n = sum(1 for _ in iter_samples(stream, url=url, layout=layout, compression=shard.compression))
            for _ in stream:  # the trailer after the last sample, for the whole-object checksum
                pass
    except FileNotFoundError:
        return "missing: the object does not exist"
    except StorageError:
        raise  # could not read (access, network): not a verdict on the shard; the caller cannot vouch
    except StreamioError as exc:
        return str(exc)
    if whole.size != shard.bytes:
        return f"size {whole.size} bytes, the index says {shard.bytes}"
    if whole.hexdigest() != shard.checksum:
        return f"checksum {whole.hexdigest()}, the index says {shard.checksum}: the shard is corrupt"
    if n != shard.samples:
        return f"{n} samples, the index says {shard.samples}"
    return None


def validate(store: Store, index: DatasetIndex, *, deep: bool = False, concurrency: int = 8) -> ValidationReport:
    """Check that the shards the index names are there, and (``deep``) that their bytes are right.

    Shallow: one fresh listing; every shard must exist with the recorded size. Deep: every shard is
    re-read (streamed, ``concurrency`` at a time) and its size, whole CRC32C, every sample's CRC32C
    and the sample count are compared with the index.

    Raises:
        StorageError: a shard could not be read (access refused, storage unreachable): a read that
            failed is no verdict on the shard, so it is raised rather than reported as bad.
    """
    listing = {o.path: o.size for o in store.list()}
    bad: list[BadShard] = []
    to_read: list[int] = []
    for i, shard in enumerate(index.shards):
        size = listing.get(shard.path)
        if size is None:
            bad.append(BadShard(shard.path, "missing: the object does not exist"))
        elif size != shard.bytes:
            bad.append(BadShard(shard.path, f"size {size} bytes, the index says {shard.bytes}"))
        else:
            to_read.append(i)
    if deep and to_read:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            for i, reason in zip(to_read, pool.map(lambda j: _deep_check(store, index, j), to_read), strict=True):
                if reason is not None:
                    bad.append(BadShard(index.shards[i].path, reason))
    order = {s.path: n for n, s in enumerate(index.shards)}
    return ValidationReport(len(index.shards), deep, tuple(sorted(bad, key=lambda b: order[b.path])))
