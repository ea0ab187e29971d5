"""Where every object of a checkpoint root lives: the step, rank, part and marker paths (PURE).

Layout of a checkpoint root::

    ROOT/latest.json                         the only mutable object (the pointer, :mod:`.pointer`), replaced last
    ROOT/retention.json                      the retention policy the root's jobs apply
    ROOT/step-000045000/manifest.json        written last of the save, create-only: the checkpoint
    ROOT/step-000045000/rank-00003/part-<save id>-00000.bin   rank 3's raw tensor bytes
    ROOT/step-000045000/rank-00003/done-<save id>.json        rank 3's done marker
    ROOT/step-000045000/bad.json             only if a restore rejected this save
    ROOT/step-000045000-<save id>/...        a later save of step 45000 (another timeline)

A *save directory* holds one save of a step. It is the step's directory (zero-padded so that
names sort by step) unless that step already has a manifest when the save starts (a step saved
again after a restore went back past it: docs/checkpoint-lifecycle.md); then it is the step's
directory suffixed with the save id, so a save never collides with the manifest of another.
Part and marker names carry the *save id* too, so that two jobs writing the same directory can
never overwrite each other's parts: whichever creates the manifest first wins, and the loser's
objects are orphans that ``streamio ckpt gc`` removes.

A save id is 8 hex digits of the Unix time the save started and 8 random ones
(:func:`new_save_id`): unique, and it tells ``gc`` how old an unfinished save's objects are
without the store's modification times (:func:`save_started`).

Each rank writes a byte *stream* (its tensors, 64-byte aligned, one after another) cut into parts
of bounded size (:func:`split_ranges`); a tensor is located by ``(rank, offset, nbytes)`` in that
stream and may span consecutive parts.

Plain functions of their arguments: no torch, fsspec, storage, clock or environment (an
import-linter contract checks it), so tools and tests can name a checkpoint's objects without a
training stack.
"""

from __future__ import annotations

import re

from streamio.errors import ConfigError

__all__ = [
    "BAD",
    "MANIFEST",
    "RETENTION",
    "bad_path",
    "manifest_at",
    "manifest_path",
    "marker_path",
    "new_save_id",
    "object_save_id",
    "parse_save_dir",
    "parse_step_dir",
    "part_path",
    "rank_dir",
    "save_dir",
    "save_started",
    "split_ranges",
    "step_dir",
]

MANIFEST = "manifest.json"
BAD = "bad.json"
RETENTION = "retention.json"

_STEP_RE = re.compile(r"^step-(\d{9,})$")
_SAVE_DIR_RE = re.compile(r"^step-(\d{9,})(?:-([A-Za-z0-9_-]{1,64}))?$")
_OBJECT_ID_RE = re.compile(r"^rank-\d{5,}/(?:part-(.+)-\d{5,}\.bin|done-(.+)\.json)$")
_TIMED_ID_RE = re.compile(r"^[0-9a-f]{16}$")


def step_dir(step: int) -> str:
    """``45000`` -> ``"step-000045000"`` (zero-padded so names sort by step).

    Raises:
        ValueError: ``step`` is not a non-negative int.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ConfigError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"step-{step:09d}"


def parse_step_dir(name: str) -> int | None:
    """``"step-000045000"`` -> ``45000``; ``None`` for anything else."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def save_dir(step: int, save_id: str = "") -> str:
    """The directory of one save of ``step``: ``step_dir(step)``, or with ``save_id`` the step's
    directory suffixed with it (a step saved again on another timeline)."""
    return f"{step_dir(step)}-{save_id}" if save_id else step_dir(step)


def parse_save_dir(name: str) -> tuple[int, str] | None:
    """``"step-000045000"`` -> ``(45000, "")``, ``"step-000045000-<id>"`` -> ``(45000, "<id>")``;
    ``None`` for anything else."""
    m = _SAVE_DIR_RE.match(name)
    return (int(m.group(1)), m.group(2) or "") if m else None


def manifest_at(sdir: str) -> str:
    """Path of the manifest of the save in directory ``sdir``, relative to the root."""
    return f"{sdir}/{MANIFEST}"


def bad_path(sdir: str) -> str:
    """Path of the record that a restore rejected the save in ``sdir``."""
    return f"{sdir}/{BAD}"


def object_save_id(rest: str) -> str | None:
    """The save id in the name of a part or done marker (``rest``: below the save directory)."""
    m = _OBJECT_ID_RE.match(rest)
    return (m.group(1) or m.group(2)) if m else None


def new_save_id(now: float, random_hex: str) -> str:
    """A save id: 8 hex digits of ``now`` (Unix seconds), then 8 of ``random_hex``."""
    return f"{int(now) & 0xFFFFFFFF:08x}{random_hex[:8]}"


def save_started(save_id: str) -> int | None:
    """When a save with this id started (Unix seconds), or ``None`` for ids that do not say
    (written by an older streamio: 12 random hex digits)."""
    return int(save_id[:8], 16) if _TIMED_ID_RE.match(save_id) else None


def rank_dir(rank: int) -> str:
    """``3`` -> ``"rank-00003"``: the directory of a rank's parts and marker, below the step."""
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
    """Cut ``[0, total)`` into ``[start, end)`` ranges of at most ``part_size`` bytes.

    Raises:
        ValueError: ``part_size`` is not positive.
    """
    if part_size <= 0:
        raise ConfigError(f"part_size must be positive, got {part_size}")
    return [(s, min(s + part_size, total)) for s in range(0, total, part_size)]
