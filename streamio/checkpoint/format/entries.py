"""The entries of a checkpoint document: parts, tensors, sections, sharded tensors; their records and JSON (PURE).

:mod:`.manifest` assembles its documents (manifest, done marker) from these. Every parser
here checks every field before it returns (:mod:`.checks`), because the documents are read back
from storage that others can write: a parsed entry names only confined paths, well-formed checksums,
a dtype torch has, and numbers that are integers in ``[0, 2**63)`` and agree with each other
before anything is allocated on their word: a tensor's (and a chunk's) ``nbytes`` is the product
of its shape times its dtype's item size, a part ends below ``2**63``, a sharded tensor's global
shape holds less than ``2**63`` bytes, and its chunks lie inside that shape and cover it exactly
once by volume. Whether chunks overlap is checked where they are read (a restore checks
that the chunks it reads cover each destination exactly), since only there is it cheap.

Parts of a save with sharded state carry a CRC32C per *block* of raw bytes (``block_size``,
``blocks``) besides the checksum of the whole stored object, so that a restore that needs a few
rows of a part (another sharding than the one saved) reads just those blocks and verifies them.
Compressed parts carry no blocks: they are read whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from streamio.checkpoint.format import checks
from streamio.checkpoint.format.checks import ManifestError
from streamio.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH, json_depth, load_json

__all__ = [
    "DTYPE_SIZES", "ChunkEntry", "FileEntry", "Section", "ShardedEntry", "TensorEntry", "check_format", "dump",
    "file_from_json", "file_to_json", "files_field", "list_field", "load_doc", "optional_str", "section_from_json",
    "section_to_json", "sharded_from_json", "sharded_to_json", "tensor_from_json", "tensor_to_json",
]

#: bytes per element of each dtype torch has (its name without ``torch.``; a test compares this
#: table with the installed torch). Sub-byte dtypes (int4, float4_e2m1fn_x2 ...) take a byte each.
DTYPE_SIZES: Mapping[str, int] = {
    **dict.fromkeys([
        "bool", "uint8", "int8", "qint8", "quint8", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8",
        "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
        *(f"int{i}" for i in range(1, 8)), *(f"uint{i}" for i in range(1, 8)),
    ], 1),
    **dict.fromkeys(["int16", "uint16", "float16", "bfloat16", "bits16"], 2),
    **dict.fromkeys(["int32", "uint32", "float32", "complex32", "qint32"], 4),
    **dict.fromkeys(["int64", "uint64", "float64", "complex64"], 8),
    "complex128": 16,
}
COMPRESSIONS = (None, "zstd")
MAX_DIMS = 64


# ------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class FileEntry:
    """One stored object of a checkpoint.

    Attributes:
        path: relative to the step directory.
        rank: the rank whose stream this part belongs to (who uploaded it).
        start: offset of the part's first raw byte in that rank's stream.
        raw_size: raw (uncompressed) bytes of the part.
        size: stored bytes (``raw_size`` unless compressed).
        checksum: ``"crc32c:..."`` of the stored bytes.
        compression: ``None`` or ``"zstd"``.
        block_size: raw bytes per checksummed block (``0``: none); set on the parts of a save
            with sharded state, so that a restore can read a byte range of a part and verify it.
        blocks: ``"crc32c:..."`` of each block of the raw part, in order (the last one may be
            shorter); only on uncompressed parts.
    """

    path: str
    rank: int
    start: int
    raw_size: int
    size: int
    checksum: str
    compression: str | None = None
    block_size: int = 0
    blocks: tuple[str, ...] = ()


@dataclass(frozen=True)
class TensorEntry:
    """Where a tensor's raw bytes live and what they are.

    Attributes:
        rank: whose stream holds the bytes.
        offset: offset in that stream (may span consecutive parts).
        nbytes: raw size.
        dtype: torch dtype name without the ``torch.`` prefix (``"float32"``, ``"bfloat16"``).
        shape: sizes.
        checksum: ``"crc32c:..."`` of the raw bytes.
    """

    rank: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    checksum: str


@dataclass(frozen=True)
class ChunkEntry:
    """One saved piece of a sharded tensor: a box of the global tensor, row-major in a rank's stream.

    Attributes:
        offsets: where the box starts in the global tensor, per dimension.
        sizes: its extent per dimension.
        rank: whose stream holds its bytes.
        offset: where they start in that stream (may span consecutive parts).
        nbytes: ``prod(sizes)`` times the element size.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    rank: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ShardedEntry:
    """A tensor saved as chunks by the ranks that held them (a DTensor, or any tensor written
    through the DCP storage writer), restorable onto any other sharding.

    Attributes:
        dtype: torch dtype name (``"float32"``).
        shape: the global shape.
        chunks: the saved boxes; together they cover the global tensor exactly once.
        layout: how it was sharded when saved, for people (``{"mesh": [2], "dims": ["dp"],
            "placements": ["Shard(dim=0)"]}``); ``{}`` when not known. Restore never needs it.
    """

    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[ChunkEntry, ...]
    layout: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """One group of state: a JSON tree whose tensors are referenced by key.

    Attributes:
        tree: JSON-able tree (tagged encoding; tensors as references to ``tensors`` keys).
        tensors: key -> :class:`TensorEntry`.
    """

    tree: Any
    tensors: Mapping[str, TensorEntry] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ parts
def file_to_json(f: FileEntry) -> dict[str, Any]:
    doc = asdict(f)
    if f.block_size:
        doc["blocks"] = list(f.blocks)
    else:  # format 2 documents stay as they were
        del doc["block_size"], doc["blocks"]
    return doc


def file_from_json(d: Any, what: str) -> FileEntry:
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: must be an object, got {type(d).__name__}")
    compression = d.get("compression")
    if compression not in COMPRESSIONS:
        raise ManifestError(f"{what}: compression {checks.short(compression)} is not 'zstd' or null")
    entry = FileEntry(
        path=checks.relative_path(d.get("path"), what),
        rank=checks.integer(d, "rank", what),
        start=checks.integer(d, "start", what),
        raw_size=checks.integer(d, "raw_size", what),
        size=checks.integer(d, "size", what),
        checksum=checks.checksum(d, "checksum", what),
        compression=compression,
    )
    if entry.start + entry.raw_size > checks.MAX_INT:
        raise ManifestError(f"{what}: part {entry.path!r} ends at byte {entry.start + entry.raw_size} of its rank's "
                            f"stream, past 2**63 - 1")
    if compression is None and entry.size != entry.raw_size:
        raise ManifestError(
            f"{what}: uncompressed part {entry.path!r} has size {entry.size} but raw_size {entry.raw_size}"
        )
    if "block_size" in d or "blocks" in d:
        entry = _with_blocks(d, entry, what)
    return entry


def _with_blocks(d: Mapping[str, Any], entry: FileEntry, what: str) -> FileEntry:
    """``entry`` with the block checksums ``d`` declares, checked against its raw size."""
    size = checks.integer(d, "block_size", what)
    blocks = d.get("blocks")
    if size == 0 or entry.compression is not None or not isinstance(blocks, list):
        raise ManifestError(f"{what}: block checksums need a positive block_size, a list of blocks and no compression")
    expected = -(-entry.raw_size // size)
    if len(blocks) != expected:
        raise ManifestError(
            f"{what}: {len(blocks)} block checksums for {entry.raw_size} raw bytes in blocks of {size}; "
            f"expected {expected}"
        )
    checked = tuple(checks.checksum({"b": b}, "b", f"{what}, block {i}") for i, b in enumerate(blocks))
    return FileEntry(entry.path, entry.rank, entry.start, entry.raw_size, entry.size, entry.checksum,
                     entry.compression, size, checked)


def files_field(doc: Mapping[str, Any], what: str) -> tuple[FileEntry, ...]:
    return tuple(file_from_json(f, f"{what}, file {i}") for i, f in enumerate(list_field(doc, "files", what)))


# ------------------------------------------------------------------------------------ tensors
def tensor_to_json(t: TensorEntry) -> dict[str, Any]:
    return {"rank": t.rank, "offset": t.offset, "nbytes": t.nbytes, "dtype": t.dtype, "shape": list(t.shape),
            "checksum": t.checksum}


def _shape(value: Any, what: str, name: str = "shape") -> tuple[int, ...]:
    if (
        not isinstance(value, list) or len(value) > MAX_DIMS
        or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= checks.MAX_INT for s in value)
    ):
        raise ManifestError(f"{what}: invalid {name} {checks.short(value)} (at most {MAX_DIMS} non-negative integers)")
    return tuple(value)


def _dtype(d: Mapping[str, Any], what: str) -> str:
    dtype = checks.string(d, "dtype", what)
    if dtype not in DTYPE_SIZES:
        raise ManifestError(
            f"{what}: unknown tensor dtype {checks.short(dtype)}: written by a newer torch or streamio?"
        )
    return dtype


def _nbytes(d: Mapping[str, Any], shape: tuple[int, ...], dtype: str, what: str) -> int:
    """``d["nbytes"]`` if it is what ``shape`` of ``dtype`` holds."""
    nbytes, holds = checks.integer(d, "nbytes", what), math.prod(shape) * DTYPE_SIZES[dtype]
    if nbytes != holds:
        raise ManifestError(f"{what}: {dtype}{list(shape)} is {holds} bytes, but nbytes says {nbytes}")
    return nbytes


def tensor_from_json(d: Any, what: str) -> TensorEntry:
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: must be an object, got {type(d).__name__}")
    dtype, shape = _dtype(d, what), _shape(d.get("shape"), what)
    return TensorEntry(
        rank=checks.integer(d, "rank", what), offset=checks.integer(d, "offset", what),
        nbytes=_nbytes(d, shape, dtype, what),
        dtype=dtype, shape=shape, checksum=checks.checksum(d, "checksum", what),
    )


def section_to_json(s: Section) -> dict[str, Any]:
    return {"tree": s.tree, "tensors": {k: tensor_to_json(v) for k, v in s.tensors.items()}}


def section_from_json(d: Any, what: str) -> Section:
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: must be an object with 'tree' and 'tensors', got {type(d).__name__}")
    tree = d.get("tree")
    if tree is not None and not isinstance(tree, dict):
        raise ManifestError(f"{what}: 'tree' must be an object of state names, got {type(tree).__name__}")
    tensors = checks.mapping(d, "tensors", what)
    return Section(tree=tree, tensors={k: tensor_from_json(v, f"{what}, tensor {k!r}") for k, v in tensors.items()})


# ------------------------------------------------------------------------------------ sharded tensors
def sharded_to_json(entries: Mapping[str, ShardedEntry]) -> dict[str, Any]:
    return {
        key: {"dtype": e.dtype, "shape": list(e.shape), "layout": dict(e.layout),
              "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes), "rank": c.rank, "offset": c.offset,
                          "nbytes": c.nbytes} for c in e.chunks]}
        for key, e in entries.items()
    }


def sharded_from_json(d: Any, what: str, *, complete: bool = True) -> dict[str, ShardedEntry]:
    """Parse a ``sharded`` field (key -> entry).

    Args:
        complete: the chunks must cover each tensor (a manifest); a done marker holds one
            rank's chunks only.
    """
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: 'sharded' must be an object, got {type(d).__name__}")
    return {key: _sharded_entry(v, f"{what}, sharded tensor {checks.short(key)}", complete) for key, v in d.items()}


def _sharded_entry(d: Any, what: str, complete: bool) -> ShardedEntry:
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: must be an object, got {type(d).__name__}")
    shape, dtype = _shape(d.get("shape"), what), _dtype(d, what)
    if math.prod(shape) * DTYPE_SIZES[dtype] > checks.MAX_INT:
        raise ManifestError(f"{what}: its global shape {list(shape)} of {dtype} holds 2**63 bytes or more")
    layout = checks.mapping(d, "layout", what)
    chunks = tuple(_chunk(c, shape, dtype, f"{what}, chunk {i}") for i, c in enumerate(list_field(d, "chunks", what)))
    if complete:
        volume = sum(math.prod(c.sizes) for c in chunks)
        if volume != math.prod(shape):
            raise ManifestError(
                f"{what}: its chunks hold {volume} elements, its shape {list(shape)} has {math.prod(shape)}: "
                f"a rank's chunks are missing or counted twice"
            )
    return ShardedEntry(dtype=dtype, shape=shape, chunks=chunks, layout=layout)


def _chunk(d: Any, shape: tuple[int, ...], dtype: str, what: str) -> ChunkEntry:
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: must be an object, got {type(d).__name__}")
    offsets, sizes = _shape(d.get("offsets"), what, "offsets"), _shape(d.get("sizes"), what, "sizes")
    if len(offsets) != len(shape) or len(sizes) != len(shape):
        raise ManifestError(f"{what}: offsets {list(offsets)} and sizes {list(sizes)} do not have "
                            f"the {len(shape)} dimensions of shape {list(shape)}")
    if any(o + s > n for o, s, n in zip(offsets, sizes, shape, strict=True)):
        raise ManifestError(f"{what}: the box at {list(offsets)} of sizes {list(sizes)} reaches outside "
                            f"the global shape {list(shape)}")
    return ChunkEntry(offsets=offsets, sizes=sizes, rank=checks.integer(d, "rank", what),
                      offset=checks.integer(d, "offset", what), nbytes=_nbytes(d, sizes, dtype, what))


# ------------------------------------------------------------------------------------ documents
def dump(doc: dict[str, Any], what: str) -> bytes:
    """JSON bytes of a document that the readers will accept back (depth checked here, at save)."""
    depth = json_depth(doc, limit=MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise ManifestError(
            f"{what} would nest {depth}+ levels deep, over the {MAX_JSON_DEPTH} levels a checkpoint may hold: "
            f"flatten the deepest value of the state"
        )
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def load_doc(data: bytes, what: str, *, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    doc = load_json(data, what=what, error=ManifestError, max_bytes=max_bytes, max_depth=MAX_JSON_DEPTH)
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(doc).__name__}")
    return doc


def check_format(doc: Mapping[str, Any], readable: tuple[str, ...], family: str, what: str) -> str:
    """The document's format if this streamio reads it (``readable``: newest first)."""
    fmt = doc.get("format")
    if fmt in readable:
        return str(fmt)
    names = " or ".join(map(repr, readable))
    if isinstance(fmt, str) and fmt.startswith(family):
        raise ManifestError(
            f"{what} has format {checks.short(fmt)}; this streamio reads {names}: upgrade streamio to read it",
            unknown_version=True,
        )
    raise ManifestError(
        f"{what} has format {checks.short(fmt)}, not {names}: not written by streamio", unknown_version=True
    )


def optional_str(d: Mapping[str, Any], key: str, what: str) -> str:
    return checks.string(d, key, what) if d.get(key) is not None else ""


def list_field(d: Mapping[str, Any], key: str, what: str) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list):
        raise ManifestError(f"{what}: field {key!r} must be a list, got {type(v).__name__}")
    return v
