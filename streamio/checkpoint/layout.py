"""Where every object of a checkpoint root lives: the step, rank, part and marker paths (PURE).

Layout of a checkpoint root::

    ROOT/latest.json                         the only mutable object (the pointer), replaced last
    ROOT/step-000045000/manifest.json        written last of the step, create-only: the checkpoint
    ROOT/step-000045000/rank-00003/part-<save id>-00000.bin   rank 3's raw tensor bytes
    ROOT/step-000045000/rank-00003/done-<save id>.json        rank 3's done marker

Step directories are zero-padded so that names sort by step. Part and marker names carry the
*save id* (random per save) so that two jobs writing the same step can never overwrite each
other's parts: whichever commits its manifest first wins, and the loser's objects are orphans
that ``streamio ckpt gc`` removes.

Each rank writes a byte *stream* (its tensors, 64-byte aligned, one after another) cut into parts
of bounded size (:func:`split_ranges`); a tensor is located by ``(rank, offset, nbytes)`` in that
stream and may span consecutive parts.

Plain functions of their arguments: no torch, fsspec, storage, clock or environment (an
import-linter contract checks it), so tools and tests can name a checkpoint's objects without a
training stack.
"""

from __future__ import annotations

import re

__all__ = [
    "LATEST",
    "MANIFEST",
    "manifest_path",
    "marker_path",
    "parse_step_dir",
    "part_path",
    "rank_dir",
    "split_ranges",
    "step_dir",
]

LATEST = "latest.json"
MANIFEST = "manifest.json"

_STEP_RE = re.compile(r"^step-(\d{9,})$")


def step_dir(step: int) -> str:
    """``45000`` -> ``"step-000045000"`` (zero-padded so names sort by step).

    Raises:
        ValueError: ``step`` is not a non-negative int.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"step-{step:09d}"


def parse_step_dir(name: str) -> int | None:
    """``"step-000045000"`` -> ``45000``; ``None`` for anything else."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


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
        raise ValueError(f"part_size must be positive, got {part_size}")
    return [(s, min(s + part_size, total)) for s in range(0, total, part_size)]
