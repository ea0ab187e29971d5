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
    """

    path: str
    rank: int
    start: int
    raw_size: int
    size: int
    checksum: str
    compression: str | None = None


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
