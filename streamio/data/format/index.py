"""The dataset index (``index.json``): the :class:`DatasetIndex` value and its codecs.

``index.json`` is what turns a prefix of tar shards into a dataset streamio can plan over::

    {"format": "streamio.dataset/1", "samples": 1200, "keys": ["cls", "jpg"], "compression": null,
     "shards": [{"path": "data-000000.tar", "bytes": 104867840, "samples": 1000,
                 "checksum": "crc32c:1a2b3c4d", "offsets": [0, ...], "crc32c": [...]}, ...]}

Per shard it records the size, the CRC32C of the whole object, the sample count and, for each
sample, the byte offset of its first member (``samples + 1`` offsets, the last one where the
end-of-archive blocks begin) and the CRC32C of its bytes; for ``.tar.zst`` shards also
``max_sample_bytes``, the largest sample after decompression, which is the output limit readers
decompress with (an older index without it gets the readers' default limit). Offsets make
sample-exact planning and mid-shard starts by one ranged GET possible; the per-sample checksums
let a reader verify any run of samples. They sit in the index itself while the dataset is small
(``inline_limit`` samples in all); beyond that each shard's layout goes to a binary sidecar
``_layout/<shard>.bin`` whose CRC32C the index records, so a 5,000-shard index stays under 1 MB and
loads in tens of milliseconds, and a rank only fetches the sidecars of shards it reads (cached in
the index object).

An index may live apart from its shards (``streamio index s3://public/ds --index-url
s3://mine/ds-index``: shards in a bucket one can read but not write). It then records
``"shards_url"``, the absolute URL its shard paths are relative to, and keeps its layout sidecars
beside itself; the shard paths stay plain relative names below that URL, so the index is as
confined as one beside its shards. An index without ``shards_url`` (every index before it) has
its shards beside it. :mod:`streamio.data.locate` resolves a URL (prefix, index URL, pattern) to
the shards' store and the index.

Reasons for the rest: the index is written last in one atomic PUT, so a half-written dataset
never looks complete; ``fingerprint`` hashes the shard list (paths, sizes, counts, checksums) and
nothing about where layouts live, so a resume state can tell "same data" from "other data";
unknown fields are ignored (newer writers may add some) but an unknown ``format`` is refused.

An index is untrusted input like the shards: it is read with a size limit, parsed with a depth
limit, every number and offset is checked, and every shard or sidecar path must be a plain
relative name below the dataset (:mod:`streamio.data.format.index_schema`) before anything is read on its
word.

Building an index for existing shards is :mod:`streamio.data.write.indexer`; checking a dataset
against its index is :mod:`streamio.data.write.verify`. The values an index is made of
(:class:`~streamio.data.format.layout.ShardInfo`, :class:`~streamio.data.format.layout.SampleLayout`) and the
names it uses live in :mod:`streamio.data.format.layout`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import sys
import warnings
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamio.checksum import crc32c, format_checksum
from streamio.data.format.index_schema import MAX_TOKEN_FIELDS, check_document, check_layout, check_room, token_room
from streamio.data.format.layout import FORMAT, INDEX_NAME, LAYOUT_DIR, SampleLayout, ShardInfo, sidecar_path
from streamio.errors import CorruptDataError, DatasetError, IndexFormatError, IndexNotFoundError, ObjectTooLargeError
from streamio.limits import MAX_JSON_BYTES, load_json
from streamio.storage import Store, WriteMode, store_at

__all__ = [
    "INLINE_LIMIT", "DatasetIndex", "decode_layout", "encode_layout", "fingerprint_of", "index_document",
    "load_index", "make_index", "parse_index", "read_index_bytes", "write_index",
]

log = logging.getLogger(__name__)

#: Datasets of up to this many samples keep their layouts inside ``index.json``.
INLINE_LIMIT = 100_000
_SIDECAR_MAGIC = b"STIOLAY1"


@dataclass(frozen=True)
class DatasetIndex:
    """A loaded (or freshly built) ``index.json``; immutable, picklable, cheap to share.

    Attributes:
        shards: the shards in dataset order.
        samples: total samples.
        keys: member extensions seen (sorted).
        compression: ``"zstd"`` if every shard is ``.tar.zst``, None if every one is ``.tar``
            (a mixed dataset says ``"mixed"``; each :attr:`ShardInfo.compression` is exact).
        shards_url: the absolute URL the shard paths are relative to, when the index was written
            somewhere else (``streamio index SHARDS --index-url URL``); None: beside the index.
            Not part of the fingerprint: the same shards elsewhere are the same data.
        fingerprint: stable hash of the shard list (see module docstring).
    """

    shards: tuple[ShardInfo, ...]
    samples: int
    keys: tuple[str, ...]
    compression: str | None
    shards_url: str | None = None
    fingerprint: str = field(init=False)
    _layouts_at: Store | None = field(default=None, repr=False, compare=False)
    _inline: dict[int, SampleLayout] = field(default_factory=dict, repr=False, compare=False)
    _sidecars: dict[int, tuple[str, str, int | None]] = field(default_factory=dict, repr=False, compare=False)
    _cache: dict[int, SampleLayout] = field(default_factory=dict, repr=False, compare=False)
    _tokens: dict[int, dict[str, tuple[int, ...]]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", fingerprint_of(self.shards))

    def sample_counts(self) -> list[int]:
        """Samples per shard, in order (what the planner takes)."""
        return [s.samples for s in self.shards]

    def token_fields(self) -> tuple[str, ...]:
        """The member fields whose token counts the index records for every sample (sorted)."""
        fields = [set(self._tokens.get(i, {})) for i, s in enumerate(self.shards) if s.samples]
        return tuple(sorted(set.intersection(*fields))) if fields else ()

    def shard_tokens(self, i: int) -> dict[str, tuple[int, ...]]:
        """Shard ``i``'s per-sample token counts by field (``{}``: none recorded)."""
        return dict(self._tokens.get(i, {}))

    def token_counts(self, member: str) -> list[tuple[int, ...]]:
        """Each shard's per-sample token counts of ``member`` (what a packing plan takes).

        Raises:
            DatasetError: a shard records no token counts for ``member`` (an index written before
                they existed, or a data set whose ``member`` is not a 1-D integer ``.npy`` in every
                sample); the message names the shard and the fix.
        """
        out = []
        for i, shard in enumerate(self.shards):
            counts = self._tokens.get(i, {}).get(member)
            if counts is None and shard.samples:
                have = sorted(self._tokens.get(i, {}))
                raise DatasetError(
                    f"shard {shard.path!r} records no token counts for member {member!r} (it records "
                    f"{have or 'none'}): packing needs each document's count in the index. Index the shards "
                    f"again (`streamio index URL --overwrite`) or write the data set with write_dataset() or "
                    f"`streamio shard`, which record them for every 1-D integer .npy member, or give "
                    f"Pack(member=...) one of {list(self.token_fields())}."
                )
            out.append(counts or ())
        return out

    def with_layouts(self, layouts: Mapping[int, SampleLayout]) -> DatasetIndex:
        """Deprecated since 0.2.0, removed in 0.3.0: a copy holding ``layouts`` in memory.

        Writers and :func:`~streamio.data.write.indexer.build_index` return indexes that hold their layouts.
        """
        warnings.warn(
            "DatasetIndex.with_layouts() is deprecated since streamio 0.2.0 and will be removed in 0.3.0: "
            "write_dataset() and build_index() return indexes that hold their layouts",
            DeprecationWarning,
            stacklevel=2,
        )
        return replace(self, _inline=dict(layouts), _cache={})

    def layout(self, shard_id: int, store: Store) -> SampleLayout:
        """Offsets and per-sample CRC32C of shard ``shard_id``.

        From the index itself when it holds them, otherwise from the shard's sidecar (read once,
        checked against the CRC32C the index records, then cached).

        Raises:
            IndexFormatError: no layout recorded for the shard, an invalid sidecar, or a token count
                more than its sample's span holds.
            CorruptDataError: the sidecar does not match its recorded checksum.
        """
        found = self._inline.get(shard_id) or self._cache.get(shard_id)
        if found is not None:
            return found
        if self._layouts_at is not None:  # an index kept apart from its shards keeps its sidecars beside it
            store = self._layouts_at
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
        room = token_room(shard.path, shard.bytes, samples, layout.offsets, biggest)
        for ext, counts in self._tokens.get(shard_id, {}).items():  # the spans were unknown when the index was parsed
            check_room(counts, room, ext=ext, path=shard.path, url=store.url(INDEX_NAME))
        self._cache[shard_id] = layout
        return layout



def fingerprint_of(shards: Sequence[ShardInfo]) -> str:
    """``sha256:<hex>`` of the canonical shard list (path, bytes, samples, checksum)."""
    canon = json.dumps([FORMAT, [[s.path, s.bytes, s.samples, s.checksum] for s in shards]], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def make_index(
    shards: Sequence[ShardInfo],
    layouts: dict[int, SampleLayout],
    keys: Iterable[str],
    tokens: Mapping[int, Mapping[str, Sequence[int]]] | None = None,
) -> DatasetIndex:
    """Assemble a :class:`DatasetIndex` from shards, their layouts and token counts (writer / build_index)."""
    kinds = {s.compression for s in shards}
    compression = kinds.pop() if len(kinds) == 1 else (None if not kinds else "mixed")
    counts = {  # at most what a reader accepts (the first fields by name): an index must load again
        i: {ext: tuple(fields[ext]) for ext in sorted(fields)[:MAX_TOKEN_FIELDS]}
        for i, fields in (tokens or {}).items() if fields
    }
    return DatasetIndex(
        tuple(shards), sum(s.samples for s in shards), tuple(sorted(set(keys))), compression, _inline=dict(layouts),
        _tokens=counts,
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



# ----------------------------------------------------------------------------- load / write
def parse_index(data: bytes, *, url: str, layouts_at: Store | None = None) -> DatasetIndex:
    """Parse and validate the bytes of an ``index.json`` (``url`` is named in errors).

    Nothing in it is trusted: the document has a size and nesting limit
    (:func:`streamio.limits.load_json`), and every number, offset and path is checked
    (:mod:`streamio.data.format.index_schema`) before anything is read on its word. ``layouts_at`` is
    the store the index was read from: its layout sidecars are read there when it records a
    ``shards_url`` (the shards live elsewhere).

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
    tokens = {i: e.tokens for i, e in enumerate(doc.shards) if e.tokens}
    return DatasetIndex(
        tuple(shards), doc.samples, doc.keys, doc.compression, doc.shards_url,
        _layouts_at=layouts_at if doc.shards_url is not None else None, _inline=inline, _sidecars=sidecars,
        _tokens=tokens,
    )


def load_index(store: Store | str | os.PathLike[str], path: str = INDEX_NAME, *,
               storage_options: Mapping[str, Any] | None = None) -> DatasetIndex:
    """Read and validate ``index.json`` (or another ``path``) at the root of a dataset: ``store`` is
    its URL (``"s3://bucket/ds"``, with fsspec ``storage_options``), a local path or a
    :class:`~streamio.storage.Store`; a URL ending in ``.json`` is the index itself.

    The shards are at that root unless the index records a :attr:`~DatasetIndex.shards_url`;
    :func:`streamio.data.locate.open_dataset` resolves that (and patterns, and index URLs).

    Raises:
        IndexNotFoundError: there is none (says to run ``streamio index URL``).
        IndexFormatError: unknown format version, an invalid field, or over the size limit of a
            JSON document (:data:`streamio.limits.MAX_JSON_BYTES`).
        ConfigError: ``store`` is not a URL, path or Store, or a Store came with ``storage_options``.
    """
    if isinstance(store, (str, os.PathLike)) and path == INDEX_NAME and os.fspath(store).endswith(".json"):
        head, _, path = os.fspath(store).rpartition("/")
        store = head or "."
    store = store_at(store, storage_options, caller="load_index")
    return parse_index(read_index_bytes(store, path), url=store.url(path), layouts_at=store)


def read_index_bytes(store: Store, path: str = INDEX_NAME) -> bytes:
    """The bytes of ``index.json`` (or another ``path``) at the root of ``store``, as stored: one GET,
    at most :data:`streamio.limits.MAX_JSON_BYTES`. Untrusted until :func:`parse_index` took them.

    Raises:
        IndexNotFoundError: there is none (says to run ``streamio index URL``).
        IndexFormatError: over the size limit of a JSON document.
    """
    try:
        return store.read(path, max_bytes=MAX_JSON_BYTES)
    except FileNotFoundError as exc:
        raise IndexNotFoundError(
            f"no {path} at {store.url(path)}: write the dataset with `streamio shard`, or index "
            f"existing WebDataset shards with `streamio index {store.root_url}`"
        ) from exc
    except ObjectTooLargeError as exc:
        raise IndexFormatError(f"{exc}; rebuild the index with `streamio index {store.root_url}`") from exc


def index_document(
    index: DatasetIndex, store: Store, *, inline_limit: int = INLINE_LIMIT, path: str = INDEX_NAME
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The ``index.json`` document of ``index`` and the sidecars it refers to (``(path, bytes)``).

    Sidecars go to ``_layout/<shard>.bin`` beside an index named ``index.json``, and to
    ``_layout/<name>/<shard>.bin`` beside an index of another ``path``, so that several indexes
    written into one prefix (``--index-url s3://b/indexes/a.json``) never share a sidecar.
    """
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
        if index._tokens.get(i):
            entry["tokens"] = {ext: list(c) for ext, c in sorted(index._tokens[i].items())}
        if inline:
            entry["offsets"] = list(layout.offsets)
            entry["crc32c"] = list(layout.checksums)
        else:
            blob = encode_layout(layout)
            where = sidecar_path(shard.path) if path == INDEX_NAME else f"{LAYOUT_DIR}/{path}/{shard.path}.bin"
            entry["layout"] = where
            entry["layout_checksum"] = format_checksum(crc32c(blob))
            sidecars.append((where, blob))
        entries.append(entry)
    doc = {
        "format": FORMAT,
        "samples": index.samples,
        "keys": list(index.keys),
        "compression": index.compression,
        "fingerprint": index.fingerprint,
        **({"shards_url": index.shards_url} if index.shards_url is not None else {}),
        "shards": entries,
    }
    return doc, sidecars


def write_index(
    store: Store, index: DatasetIndex, *, inline_limit: int = INLINE_LIMIT, path: str = INDEX_NAME,
    mode: WriteMode = "overwrite", if_match: str | None = None,
) -> str | None:
    """Write ``index.json`` (or ``path``; and, for large datasets, the layout sidecars first) at ``store``'s root.

    ``index.json`` is the last object written, in one atomic PUT: until it exists the dataset is
    not a dataset. Layouts the index does not hold in memory are read from ``store``'s sidecars
    (so write an index back where it was loaded from, or one made by a writer / ``build_index``).

    Args:
        mode: ``"create"`` writes the index only if none exists (two writers cannot silently
            replace each other); ``"overwrite"`` replaces one.
        if_match: replace the index only if it is still at this version (from ``store.info``).

    Returns:
        The version of the index object written.

    Raises:
        WriteConflictError: ``mode="create"`` and an index exists, or ``if_match`` and it changed.
    """
    doc, sidecars = index_document(index, store, inline_limit=inline_limit, path=path)
    if sidecars:
        store.put_many(sidecars)
    version = store.put(path, json.dumps(doc, separators=(",", ":")).encode(), mode=mode, if_match=if_match)
    log.info("wrote %s: %d shards, %d samples", store.url(path), len(index.shards), index.samples)
    return version
