"""Checkpoint layout, the ``manifest.json`` / ``latest.json`` schemas and retention policies (PURE).

This module is plain data: it imports neither torch nor fsspec nor the storage layer (an
import-linter contract checks it), so the format can be read, validated and reasoned about by
the CLI, by tests and by other tools without a training stack.

Layout of a checkpoint root::

    ROOT/latest.json                         the only mutable object (the pointer), replaced last
    ROOT/step-000045000/manifest.json        written last of the step, create-only: the checkpoint
    ROOT/step-000045000/rank-00003/part-<save id>-00000.bin   rank 3's raw tensor bytes
    ROOT/step-000045000/rank-00003/done-<save id>.json        rank 3's done marker

Part and marker names carry the *save id* (random per save) so that two jobs writing the same
step can never overwrite each other's parts: whichever commits its manifest first wins, and the
loser's objects are orphans that ``streamio ckpt gc`` removes.

Each rank writes a byte *stream* (its tensors, 64-byte aligned, one after another) cut into parts
of bounded size; a tensor is located by ``(rank, offset, nbytes)`` in that stream and may span
consecutive parts. Files carry the size and CRC32C of the stored bytes (after optional zstd),
tensors the CRC32C of their raw bytes, so a reader verifies everything before loading anything.

A checkpoint is *complete* iff its ``manifest.json`` exists and every file it lists has the
recorded size and checksum. The manifest is written only after every rank's done marker exists;
the pointer only after the manifest; retention deletes only after the pointer naming a newer
checkpoint is written, and deletes a step's manifest first so that a half-deleted step is never
mistaken for a complete one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FORMAT = "streamio.checkpoint/1"
POINTER_FORMAT = "streamio.checkpoint.latest/1"
MARKER_FORMAT = "streamio.checkpoint.done/1"
LATEST = "latest.json"
MANIFEST = "manifest.json"
_FORMAT_FAMILY = "streamio.checkpoint/"
_POINTER_FAMILY = "streamio.checkpoint.latest/"

_STEP_RE = re.compile(r"^step-(\d{9,})$")
_RANK_RE = re.compile(r"^rank-(\d{5,})$")


class ManifestError(ValueError):
    """A manifest, marker or pointer document is invalid; ``unknown_version`` says why."""

    def __init__(self, message: str, *, unknown_version: bool = False) -> None:
        super().__init__(message)
        self.unknown_version = unknown_version


# ------------------------------------------------------------------------------------ paths
def step_dir(step: int) -> str:
    """``45000`` -> ``"step-000045000"`` (zero-padded so names sort by step)."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"step-{step:09d}"


def parse_step_dir(name: str) -> int | None:
    """``"step-000045000"`` -> ``45000``; ``None`` for anything else."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def rank_dir(rank: int) -> str:
    return f"rank-{rank:05d}"


def manifest_path(step: int) -> str:
    """Path of a step's manifest, relative to the root."""
    return f"{step_dir(step)}/{MANIFEST}"


def part_path(rank: int, save_id: str, index: int) -> str:
    """Path of a part, relative to the step directory."""
    return f"{rank_dir(rank)}/part-{save_id}-{index:05d}.bin"


def marker_path(rank: int, save_id: str) -> str:
    """Path of a rank's done marker, relative to the step directory."""
    return f"{rank_dir(rank)}/done-{save_id}.json"


def split_ranges(total: int, part_size: int) -> list[tuple[int, int]]:
    """Cut ``[0, total)`` into ``[start, end)`` ranges of at most ``part_size`` bytes."""
    if part_size <= 0:
        raise ValueError(f"part_size must be positive, got {part_size}")
    return [(s, min(s + part_size, total)) for s in range(0, total, part_size)]


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

    @property
    def total_bytes(self) -> int:
        """Stored bytes of all files."""
        return sum(f.size for f in self.files)

    def files_for(self, ranks: Iterable[int]) -> list[FileEntry]:
        """The parts of the given ranks' streams."""
        wanted = set(ranks)
        return [f for f in self.files if f.rank in wanted]


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
    """``latest.json``: which checkpoint is current."""

    step: int
    path: str
    manifest_checksum: str
    save_id: str
    created: str = ""


# ------------------------------------------------------------------------------------ encoding
def _file_to_json(f: FileEntry) -> dict[str, Any]:
    return asdict(f)


def _file_from_json(d: Mapping[str, Any]) -> FileEntry:
    return FileEntry(
        path=_str(d, "path"),
        rank=_int(d, "rank"),
        start=_int(d, "start"),
        raw_size=_int(d, "raw_size"),
        size=_int(d, "size"),
        checksum=_str(d, "checksum"),
        compression=d.get("compression"),
    )


def _tensor_to_json(t: TensorEntry) -> dict[str, Any]:
    return {"rank": t.rank, "offset": t.offset, "nbytes": t.nbytes, "dtype": t.dtype, "shape": list(t.shape), "checksum": t.checksum}


def _tensor_from_json(d: Mapping[str, Any]) -> TensorEntry:
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ManifestError(f"tensor entry has an invalid shape {shape!r}")
    return TensorEntry(
        rank=_int(d, "rank"), offset=_int(d, "offset"), nbytes=_int(d, "nbytes"),
        dtype=_str(d, "dtype"), shape=tuple(shape), checksum=_str(d, "checksum"),
    )


def _section_to_json(s: Section) -> dict[str, Any]:
    return {"tree": s.tree, "tensors": {k: _tensor_to_json(v) for k, v in s.tensors.items()}}


def _section_from_json(d: Any) -> Section:
    if not isinstance(d, Mapping) or not isinstance(d.get("tensors", {}), Mapping):
        raise ManifestError(f"section must be an object with 'tree' and 'tensors', got {type(d).__name__}")
    return Section(tree=d.get("tree"), tensors={str(k): _tensor_from_json(v) for k, v in d.get("tensors", {}).items()})


def manifest_to_bytes(m: Manifest) -> bytes:
    """Serialize a manifest (UTF-8 JSON, keys in a stable order)."""
    doc = {
        "format": FORMAT,
        "step": m.step,
        "save_id": m.save_id,
        "world_size": m.world_size,
        "created": m.created,
        "metrics": dict(m.metrics),
        "software": dict(m.software),
        "files": [_file_to_json(f) for f in m.files],
        "replicated": _section_to_json(m.replicated),
        "per_rank": [_section_to_json(s) for s in m.per_rank],
    }
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def manifest_from_bytes(data: bytes) -> Manifest:
    """Parse and validate a manifest.

    Raises:
        ManifestError: not JSON, not a streamio manifest, an unknown version (``unknown_version``
            set), or an invalid field.
    """
    doc = _load_json(data, "manifest")
    _check_format(doc, FORMAT, _FORMAT_FAMILY, "manifest")
    try:
        files = tuple(_file_from_json(f) for f in _list(doc, "files"))
        per_rank = tuple(_section_from_json(s) for s in _list(doc, "per_rank"))
        world = _int(doc, "world_size")
        if world < 1 or len(per_rank) != world:
            raise ManifestError(f"manifest has world_size {world} but {len(per_rank)} per-rank sections")
        return Manifest(
            step=_int(doc, "step"),
            save_id=_str(doc, "save_id"),
            world_size=world,
            replicated=_section_from_json(doc.get("replicated")),
            per_rank=per_rank,
            files=files,
            metrics=dict(doc.get("metrics") or {}),
            software=dict(doc.get("software") or {}),
            created=str(doc.get("created", "")),
        )
    except (TypeError, AttributeError) as exc:
        raise ManifestError(f"manifest has an invalid structure: {exc}") from exc


def marker_to_bytes(m: DoneMarker) -> bytes:
    doc = {
        "format": MARKER_FORMAT,
        "rank": m.rank,
        "save_id": m.save_id,
        "files": [_file_to_json(f) for f in m.files],
        "replicated_tensors": {k: _tensor_to_json(v) for k, v in m.replicated_tensors.items()},
        "per_rank": _section_to_json(m.per_rank),
        "replicated_tree": m.replicated_tree,
    }
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def marker_from_bytes(data: bytes) -> DoneMarker:
    doc = _load_json(data, "done marker")
    _check_format(doc, MARKER_FORMAT, "streamio.checkpoint.done/", "done marker")
    tensors = doc.get("replicated_tensors") or {}
    if not isinstance(tensors, Mapping):
        raise ManifestError("done marker field 'replicated_tensors' must be an object")
    return DoneMarker(
        rank=_int(doc, "rank"),
        save_id=_str(doc, "save_id"),
        files=tuple(_file_from_json(f) for f in _list(doc, "files")),
        replicated_tensors={str(k): _tensor_from_json(v) for k, v in tensors.items()},
        per_rank=_section_from_json(doc.get("per_rank")),
        replicated_tree=doc.get("replicated_tree"),
    )


def build_manifest(
    step: int,
    markers: Sequence[DoneMarker],
    *,
    metrics: Mapping[str, Any],
    software: Mapping[str, Any],
    created: str,
) -> Manifest:
    """Assemble the manifest from every rank's done marker (index = rank).

    Raises:
        ManifestError: a rank is missing, a marker belongs to another save, or two ranks claim
            the same replicated tensor.
    """
    if not markers:
        raise ManifestError(f"no done markers for step {step}")
    save_id = markers[0].save_id
    replicated: dict[str, TensorEntry] = {}
    files: list[FileEntry] = []
    for rank, m in enumerate(markers):
        if m.rank != rank or m.save_id != save_id:
            raise ManifestError(f"done marker {rank} is from rank {m.rank} / save {m.save_id!r}, expected save {save_id!r}")
        for key, entry in m.replicated_tensors.items():
            if key in replicated:
                raise ManifestError(f"replicated tensor {key!r} was saved by two ranks")
            replicated[key] = entry
        files.extend(m.files)
    return Manifest(
        step=step,
        save_id=save_id,
        world_size=len(markers),
        replicated=Section(tree=markers[0].replicated_tree, tensors=replicated),
        per_rank=tuple(m.per_rank for m in markers),
        files=tuple(files),
        metrics=dict(metrics),
        software=dict(software),
        created=created,
    )


def pointer_to_bytes(p: Pointer) -> bytes:
    doc = {"format": POINTER_FORMAT, "step": p.step, "path": p.path, "manifest_checksum": p.manifest_checksum,
           "save_id": p.save_id, "created": p.created}
    return json.dumps(doc, separators=(",", ":")).encode()


def pointer_from_bytes(data: bytes) -> Pointer:
    """Parse ``latest.json``; raises :class:`ManifestError` if it is not a valid pointer."""
    doc = _load_json(data, "latest.json")
    _check_format(doc, POINTER_FORMAT, _POINTER_FAMILY, "latest.json")
    step = _int(doc, "step")
    path = _str(doc, "path")
    if path != step_dir(step):
        raise ManifestError(f"latest.json names path {path!r} for step {step}; expected {step_dir(step)!r}")
    return Pointer(step=step, path=path, manifest_checksum=_str(doc, "manifest_checksum"),
                   save_id=str(doc.get("save_id", "")), created=str(doc.get("created", "")))


def _load_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{what} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(doc).__name__}")
    return doc


def _check_format(doc: Mapping[str, Any], expected: str, family: str, what: str) -> None:
    fmt = doc.get("format")
    if fmt == expected:
        return
    if isinstance(fmt, str) and fmt.startswith(family):
        raise ManifestError(
            f"{what} has format {fmt!r}; this streamio reads {expected!r}: upgrade streamio to read it",
            unknown_version=True,
        )
    raise ManifestError(f"{what} has format {fmt!r}, not {expected!r}: not written by streamio", unknown_version=True)


def _int(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ManifestError(f"field {key!r} must be a non-negative integer, got {v!r}")
    return v


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise ManifestError(f"field {key!r} must be a string, got {v!r}")
    return v


def _list(d: Mapping[str, Any], key: str) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list):
        raise ManifestError(f"field {key!r} must be a list, got {type(v).__name__}")
    return v


# ------------------------------------------------------------------------------------ retention
@dataclass(frozen=True)
class CheckpointRecord:
    """What retention knows of a committed checkpoint."""

    step: int
    metrics: Mapping[str, Any] = field(default_factory=dict)


class RetentionPolicy:
    """Decides which committed checkpoints to keep; combine policies with ``|`` (union).

    Subclasses implement :meth:`keep`; the manager always also keeps the newest committed
    checkpoint, whatever the policy says, so retention can never leave none.
    """

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        """Steps to keep among ``records`` (sorted by step, oldest first)."""
        raise NotImplementedError

    def __or__(self, other: RetentionPolicy) -> RetentionPolicy:
        return KeepAny((self, other))


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the ``k`` newest checkpoints."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"KeepLast(k) needs k >= 1, got {self.k}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in sorted(records, key=lambda r: r.step)[-self.k :]}


@dataclass(frozen=True)
class KeepBest(RetentionPolicy):
    """Keep the ``k`` checkpoints with the best value of ``metric`` (checkpoints without it lose)."""

    metric: str
    mode: Literal["min", "max"] = "min"
    k: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"KeepBest mode must be 'min' or 'max', got {self.mode!r}")
        if self.k < 1:
            raise ValueError(f"KeepBest(k) needs k >= 1, got {self.k}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        scored = [
            (float(r.metrics[self.metric]), r.step)
            for r in records
            if isinstance(r.metrics.get(self.metric), (int, float)) and not isinstance(r.metrics.get(self.metric), bool)
            and r.metrics[self.metric] == r.metrics[self.metric]  # not NaN
        ]
        # ties: the newer checkpoint wins
        scored.sort(key=lambda vs: (vs[0] if self.mode == "min" else -vs[0], -vs[1]))
        return {step for _, step in scored[: self.k]}


@dataclass(frozen=True)
class KeepEvery(RetentionPolicy):
    """Keep every checkpoint whose step is a multiple of ``n`` (permanent milestones)."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"KeepEvery(n) needs n >= 1, got {self.n}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in records if r.step % self.n == 0}


@dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Never delete anything."""

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in records}


@dataclass(frozen=True)
class KeepAny(RetentionPolicy):
    """The union of several policies: a checkpoint any of them keeps is kept."""

    policies: tuple[RetentionPolicy, ...]

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        kept: set[int] = set()
        for p in self.policies:
            kept |= p.keep(records)
        return kept


def steps_to_delete(policy: RetentionPolicy, records: Sequence[CheckpointRecord], *, current: int) -> list[int]:
    """Committed steps that ``policy`` drops, never ``current`` (the one the pointer names)."""
    kept = policy.keep(records) | {current}
    return sorted(r.step for r in records if r.step not in kept)
