"""The ``manifest.json`` and done-marker documents: their records, to and from bytes (PURE).

This module is plain data: it imports neither torch nor fsspec nor the storage layer (an
import-linter contract checks it), so the format can be read, validated and reasoned about by
the CLI, by tests and by other tools without a training stack. The entries the documents hold
(parts, tensors, sections, sharded tensors) are :mod:`.entries`; the pointer that names the
current manifest is :mod:`.pointer`; the one module that reads and writes them in a root is
:mod:`streamio.checkpoint.root`.

Files carry the size and CRC32C of the stored bytes (after optional zstd), tensors the CRC32C of
their raw bytes, so a reader verifies everything before loading anything. A checkpoint is
*complete* iff its ``manifest.json`` exists and every file it lists has the recorded size and
checksum. The manifest is written only after every rank's done marker exists; the pointer only
after the manifest; retention deletes only after the pointer naming a newer checkpoint is
written, and deletes a step's manifest first so that a half-deleted step is never mistaken for a
complete one (docs/design.md "Commit protocol").

Format 2 (timelines, docs/checkpoint-lifecycle.md) adds to the manifest the ``timeline`` of the
job that wrote it and its ``parent`` save. Format 3 (docs/sharded-checkpoints.md) is format 2 plus
a ``sharded`` section (DTensors saved as chunks by the ranks that held them) and block checksums
on the parts; it is written only when the state held sharded tensors, so other saves stay
readable by older streamio. Format 4 (docs/design.md "Request rates") is format 3 with the
``sharded`` section optional and a ``key_prefixes`` count: the ranks' parts and markers are spread
over that many key prefixes below the root (:class:`~.layout.Placement`); it is written only when
they are (saves of more than one rank, by default), so older streamio, which would look for the
parts in the save directory, refuses it as a newer format. Format 1 and 2 documents are still
read (format 1's timeline is ``""``); a newer format is refused with "upgrade streamio".

These documents are read back from storage that others can write, so the parsers here trust
nothing: size and nesting are bounded (:mod:`streamio.limits`), every field is checked, paths
must stay below the step directory and sizes must add up (:mod:`.checks`), and a manifest
carries its own checksum as its last field, which the parser verifies, so the JSON half of a
checkpoint is verified even for a step that ``latest.json`` does not name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamio.checkpoint.format import checks
from streamio.checkpoint.format import entries as ent
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.entries import FileEntry, Section, ShardedEntry, TensorEntry
from streamio.checkpoint.format.layout import MAX_PREFIXES, Placement, parse_save_dir, rank_dir
from streamio.checkpoint.format.timeline import Timeline, timeline_from_json, timeline_to_json
from streamio.checksum import checksum_bytes
from streamio.limits import MAX_JSON_BYTES

__all__ = [
    "FORMAT", "MARKER_FORMAT", "SHARDED_FORMAT", "SPREAD_FORMAT", "DoneMarker", "Manifest", "build_manifest",
    "manifest_from_bytes", "manifest_to_bytes", "marker_from_bytes", "marker_to_bytes",
]

FORMAT = "streamio.checkpoint/2"
SHARDED_FORMAT = "streamio.checkpoint/3"  # a manifest with sharded tensors (else FORMAT)
SPREAD_FORMAT = "streamio.checkpoint/4"  # a manifest whose parts are spread over key prefixes
_FORMAT_V1 = "streamio.checkpoint/1"
MARKER_FORMAT = "streamio.checkpoint.done/1"
_FORMAT_FAMILY = "streamio.checkpoint/"

_MAX_WORLD = 1 << 20


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
        key_prefixes: how many key prefixes the ranks' parts and markers are spread over
            (format 4; 1: all in the save directory).
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
    key_prefixes: int = 1

    def place(self, sdir: str) -> Placement:
        """Where the objects of this save, in the save directory ``sdir``, live."""
        return Placement(sdir, self.key_prefixes)

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


# Every parser below checks every field before it returns (see checks.py, entries.py): a
# document that parses names only confined paths, consistent sizes and well-formed checksums.


def manifest_to_bytes(m: Manifest) -> bytes:
    """Serialize a manifest (UTF-8 JSON, keys in a stable order), sealed with its own checksum."""
    doc = {
        "format": SPREAD_FORMAT if m.key_prefixes > 1 else SHARDED_FORMAT if m.sharded else FORMAT,
        "step": m.step,
        "save_id": m.save_id,
        "world_size": m.world_size,
        "created": m.created,
        "metrics": dict(m.metrics),
        "software": dict(m.software),
        "timeline": None if m.timeline is None else timeline_to_json(m.timeline),
        "parent": m.parent or None,
        "files": [ent.file_to_json(f) for f in m.files],
        "replicated": ent.section_to_json(m.replicated),
        "per_rank": [ent.section_to_json(s) for s in m.per_rank],
    }
    if m.sharded:
        doc["sharded"] = ent.sharded_to_json(m.sharded)
    if m.key_prefixes > 1:
        doc["key_prefixes"] = m.key_prefixes
    return checks.seal(ent.dump(doc, f"manifest of step {m.step}"))


def manifest_from_bytes(data: bytes, *, step: int | None = None, checksum: str | None = None) -> Manifest:
    """Parse and validate a manifest (bounded: size, nesting, every field; see checks.py).

    Args:
        data: the manifest's bytes.
        step: the step it was read for; the manifest must say the same.
        checksum: what ``latest.json`` recorded for these bytes, when it names this step.

    Raises:
        ManifestError: not JSON, too large or deep, not a streamio manifest, an unknown version
            (``unknown_version`` set), an invalid field, a path outside the step directory,
            inconsistent sizes, or bytes that do not match their seal, ``checksum`` or ``step``.
    """
    what = "manifest" if step is None else f"manifest of step {step}"
    data = bytes(data)
    doc = _load_json(data, what)
    # first: a newer format is "upgrade", not "damaged"
    fmt = ent.check_format(doc, (SPREAD_FORMAT, SHARDED_FORMAT, FORMAT, _FORMAT_V1), _FORMAT_FAMILY, what)
    if checksum is not None and checksum_bytes(data) != checksum:
        raise ManifestError(
            f"{what} has checksum {checksum_bytes(data)}, but latest.json recorded {checksum} when it was committed: "
            f"the manifest was modified or replaced after commit"
        )
    found = checks.integer(doc, "step", what)
    if step is not None and found != step:
        raise ManifestError(f"{what} says it is step {found}: it was copied from another step")
    what = f"manifest of step {found}"
    sealed = checks.unseal(data, doc, what)
    world = checks.integer(doc, "world_size", what)
    per_rank_docs = ent.list_field(doc, "per_rank", what)
    if not 1 <= world <= _MAX_WORLD or len(per_rank_docs) != world:
        raise ManifestError(f"{what} has world_size {world} but {len(per_rank_docs)} per-rank sections")
    files = ent.files_field(doc, what)
    replicated = ent.section_from_json(doc.get("replicated"), f"{what}, replicated section")
    per_rank = tuple(ent.section_from_json(s, f"{what}, rank {r}'s section") for r, s in enumerate(per_rank_docs))
    has_sharded = fmt == SHARDED_FORMAT or (fmt == SPREAD_FORMAT and "sharded" in doc)
    sharded = ent.sharded_from_json(doc.get("sharded"), what) if has_sharded else {}
    prefixes = _key_prefixes(doc, files, what) if fmt == SPREAD_FORMAT else 1
    for r, section in enumerate(per_rank):
        for key, t in section.tensors.items():
            if t.rank != r:
                raise ManifestError(f"{what}: rank {r}'s tensor {key!r} claims to live in rank {t.rank}'s stream")
    tensors = [*replicated.tensors.items(), *(item for s in per_rank for item in s.tensors.items()), *_chunks(sharded)]
    checks.streams(files, tensors, world_size=world, what=what)
    timeline, parent = _lineage(doc, what) if fmt != _FORMAT_V1 else (None, "")
    return Manifest(
        step=found,
        save_id=checks.save_id(doc, "save_id", what),
        world_size=world,
        replicated=replicated,
        per_rank=per_rank,
        files=files,
        metrics=checks.mapping(doc, "metrics", what),
        software=checks.mapping(doc, "software", what),
        created=ent.optional_str(doc, "created", what),
        checksum=sealed,
        timeline=timeline,
        parent=parent,
        sharded=sharded,
        key_prefixes=prefixes,
    )


def _key_prefixes(doc: Mapping[str, Any], files: Sequence[FileEntry], what: str) -> int:
    """The key prefixes of a format-4 manifest, whose parts must each be below their rank's
    directory (what places them: :class:`~.layout.Placement`)."""
    n = checks.integer(doc, "key_prefixes", what)
    if not 2 <= n <= MAX_PREFIXES:
        raise ManifestError(f"{what}: key_prefixes {n} is outside 2..{MAX_PREFIXES}")
    for f in files:
        if not f.path.startswith(f"{rank_dir(f.rank)}/"):
            raise ManifestError(f"{what}: part {f.path!r} of rank {f.rank} is not below {rank_dir(f.rank)}/, "
                                f"where a save spread over key prefixes keeps each rank's parts")
    return n


def _chunks(sharded: Mapping[str, ShardedEntry]) -> list[tuple[str, Any]]:
    """``(name, chunk)`` of every chunk, for the stream checks (a chunk has rank, offset, nbytes)."""
    return [(f"{key} chunk {list(c.offsets)}", c) for key, e in sharded.items() for c in e.chunks]


def _lineage(doc: Mapping[str, Any], what: str) -> tuple[Timeline | None, str]:
    """A format-2 manifest's timeline (``None`` if not recorded) and parent save directory."""
    raw = doc.get("timeline")
    timeline = None if raw is None else timeline_from_json(raw, what)
    parent = doc.get("parent")
    if parent is not None and (not isinstance(parent, str) or parse_save_dir(parent) is None):
        raise ManifestError(f"{what}: 'parent' must be a save directory name or null, got {checks.short(parent)}")
    return timeline, parent or ""


def marker_to_bytes(m: DoneMarker) -> bytes:
    doc = {
        "format": MARKER_FORMAT,
        "rank": m.rank,
        "save_id": m.save_id,
        "files": [ent.file_to_json(f) for f in m.files],
        "replicated_tensors": {k: ent.tensor_to_json(v) for k, v in m.replicated_tensors.items()},
        "per_rank": ent.section_to_json(m.per_rank),
        "replicated_tree": m.replicated_tree,
    }
    if m.sharded:
        doc["sharded"] = ent.sharded_to_json(m.sharded)
    return ent.dump(doc, f"rank {m.rank}'s done marker")


def marker_from_bytes(data: bytes) -> DoneMarker:
    """Parse and validate a rank's done marker (same checks as a manifest's)."""
    what = "done marker"
    doc = _load_json(data, what)
    ent.check_format(doc, (MARKER_FORMAT,), "streamio.checkpoint.done/", what)
    rank = checks.integer(doc, "rank", what)
    if rank >= _MAX_WORLD:
        raise ManifestError(f"{what}: rank {rank} is past the {_MAX_WORLD} ranks a checkpoint may have")
    what = f"rank {rank}'s done marker"
    files = ent.files_field(doc, what)
    rep_docs = checks.mapping(doc, "replicated_tensors", what)
    rep = {k: ent.tensor_from_json(v, f"{what}, tensor {k!r}") for k, v in rep_docs.items()}
    per_rank = ent.section_from_json(doc.get("per_rank"), f"{what}, per-rank section")
    sharded = ent.sharded_from_json(doc.get("sharded", {}), what, complete=False)
    tree = doc.get("replicated_tree")
    if tree is not None and not isinstance(tree, dict):
        raise ManifestError(f"{what}: 'replicated_tree' must be an object or null, got {type(tree).__name__}")
    for f in files:
        if f.rank != rank:
            raise ManifestError(f"{what} lists file {f.path!r} of rank {f.rank}")
    tensors = [*rep.items(), *per_rank.tensors.items(), *_chunks(sharded)]
    for key, t in tensors:
        if t.rank != rank:
            raise ManifestError(f"{what} lists tensor {key!r} in rank {t.rank}'s stream")
    checks.streams(files, tensors, world_size=rank + 1, what=what)
    return DoneMarker(rank=rank, save_id=checks.save_id(doc, "save_id", what), files=files,
                      replicated_tensors=rep, per_rank=per_rank, replicated_tree=tree, sharded=sharded)


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
        ManifestError: a rank is missing, a marker belongs to another save, two ranks claim
            the same replicated tensor, or the ranks' chunks of a sharded tensor disagree on its
            dtype or shape or do not cover it.
    """
    if not markers:
        raise ManifestError(f"no done markers for step {step}")
    save_id = markers[0].save_id
    replicated: dict[str, TensorEntry] = {}
    files: list[FileEntry] = []
    for rank, m in enumerate(markers):
        if m.rank != rank or m.save_id != save_id:
            raise ManifestError(
                f"done marker {rank} is from rank {m.rank} / save {m.save_id!r}, expected save {save_id!r}"
            )
        for key, entry in m.replicated_tensors.items():
            if key in replicated:
                raise ManifestError(f"replicated tensor {key!r} was saved by two ranks")
            replicated[key] = entry
        files.extend(m.files)
    return Manifest(
        sharded=_merge_sharded(markers),
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


def _load_json(data: bytes, what: str, *, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    return ent.load_doc(data, what, max_bytes=max_bytes)


def _merge_sharded(markers: Sequence[DoneMarker]) -> dict[str, ShardedEntry]:
    """Every rank's chunks of each sharded tensor in one entry, checked like a stored manifest's."""
    merged: dict[str, ShardedEntry] = {}
    for m in markers:
        for key, e in m.sharded.items():
            have = merged.get(key)
            if have is not None and (have.dtype, have.shape) != (e.dtype, e.shape):
                raise ManifestError(
                    f"sharded tensor {key!r} is {have.dtype}{list(have.shape)} on one rank and "
                    f"{e.dtype}{list(e.shape)} on rank {m.rank}: the ranks saved different models"
                )
            chunks = (have.chunks if have is not None else ()) + e.chunks
            merged[key] = ShardedEntry(e.dtype, e.shape, chunks, (have or e).layout)
    # the same checks as a stored manifest's (coverage by volume, boxes inside the shape)
    return ent.sharded_from_json(ent.sharded_to_json(merged), "the ranks' done markers")
