"""The records of a checkpoint's documents: parts, tensors, sections, manifest, marker, pointer.

Plain frozen dataclasses (PURE, like :mod:`.manifest`, which reads and writes them as JSON and
re-exports them). A ``Manifest`` built here is trusted; one parsed from storage has passed every
check of :mod:`.validate` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamio.checkpoint.timeline import Timeline


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


@dataclass(frozen=True)
class Manifest:
    """The checkpoint of one step: written last, create-only.

    Attributes:
        step: the training step.
        save_id: random id of the save that wrote it (names its parts and markers).
        world_size: ranks that wrote it.
        replicated: the state that was identical on every rank (tensors spread over ranks).
        per_rank: one section per rank (RNG, data position ...), index = rank.
        files: every object of the checkpoint other than the manifest itself.
        metrics: user metrics (what ``KeepBest`` ranks by).
        software: versions of streamio / torch / CUDA / Python that wrote it.
        created: ISO-8601 UTC time of the commit.
        checksum: the seal the stored manifest carried (verified when parsed); ``""`` when it
            was built here or written before manifests sealed themselves.
        timeline: the timeline of the job that wrote it (:mod:`.timeline`); ``None`` when
            written before timelines (format 1: the timeline ``""``).
        parent: the save directory of the save it follows (the previous save of its job, or the
            one the job restored); ``""`` if none or not recorded.
        sharded: key -> tensor saved as chunks (format 3; the trees refer to them with
            ``{"$t": "dtensor", "k": key}``); empty when the state held no sharded tensor.
    """

    step: int
    save_id: str
    world_size: int
    replicated: Section
    per_rank: tuple[Section, ...]
    files: tuple[FileEntry, ...]
    metrics: Mapping[str, Any] = field(default_factory=dict)
    software: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""
    checksum: str = field(default="", compare=False)
    timeline: Timeline | None = None
    parent: str = ""
    sharded: Mapping[str, ShardedEntry] = field(default_factory=dict)

    @property
    def line(self) -> Timeline:
        """Its timeline (``Timeline()``, the timeline ``""``, for format 1)."""
        return self.timeline if self.timeline is not None else Timeline()

    @property
    def total_bytes(self) -> int:
        """Stored bytes of all files."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class DoneMarker:
    """What a rank uploaded, written create-only after its parts are verified in the store."""

    rank: int
    save_id: str
    files: tuple[FileEntry, ...]
    replicated_tensors: Mapping[str, TensorEntry]
    per_rank: Section
    replicated_tree: Any = None  # rank 0 only
    sharded: Mapping[str, ShardedEntry] = field(default_factory=dict)  # the chunks this rank wrote


@dataclass(frozen=True)
class Pointer:
    """``latest.json``: which checkpoint is current, and the timeline it is on.

    Attributes:
        step: the step of the current checkpoint.
        path: its save directory (:func:`~.layout.save_dir`).
        manifest_checksum: the checksum of its manifest's bytes.
        save_id: the id of the save that wrote it.
        created: ISO-8601 UTC time of the commit.
        timeline: the current timeline (the checkpoint's, with its whole history), so the
            pointer alone says which saves are current even when that manifest is damaged.
    """

    step: int
    path: str
    manifest_checksum: str
    save_id: str
    created: str = ""
    timeline: Timeline = field(default_factory=Timeline)
