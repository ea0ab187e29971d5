"""Where every object of a checkpoint root lives: the step, rank, part and marker paths (PURE).

Layout of a checkpoint root::

    ROOT/latest.json                         the only mutable object (the pointer, :mod:`.pointer`), replaced last
    ROOT/retention.json                      the retention policy the root's jobs apply
    ROOT/step-000045000/manifest.json        written last of the save, create-only: the checkpoint
    ROOT/step-000045000/rank-00003/part-<save id>-00000.bin   rank 3's raw tensor bytes
    ROOT/step-000045000/rank-00003/done-<save id>.json        rank 3's done marker
    ROOT/step-000045000/bad.json             only if a restore rejected this save
    ROOT/step-000045000-<save id>/...        a later save of step 45000 (another timeline)
    ROOT/p-03/step-000045000/rank-00003/...  rank 3's parts and marker in a save spread over key prefixes

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

A save of many ranks spreads its ranks' objects over *key prefixes* that every save of the root
reuses (:class:`Placement`, ``SaveOptions.key_prefixes``; docs/design.md "Request rates"): rank
``r``'s parts and marker go below ``p-{r mod N:02x}/<save directory>/`` instead of ``<save
directory>/``, so one save's writes do not all land on one new prefix, which S3 serves at about
3,500 writes per second until it partitions it. The save's manifest (and ``bad.json``) stay in
the save directory, and the manifest records ``N``; a manifest that does not (every save before
format 4, and saves of one rank) has its objects in the save directory. Whatever the layout, a
part's path *within its save* (``rank-00003/part-...``) is what documents record, and
:func:`locate` maps any object of the root back to ``(save directory, path within the save)``.

Each rank writes a byte *stream* (its tensors, 64-byte aligned, one after another) cut into parts
of bounded size (:func:`split_ranges`); a tensor is located by ``(rank, offset, nbytes)`` in that
stream and may span consecutive parts.

Plain functions of their arguments: no torch, fsspec, storage, clock or environment (an
import-linter contract checks it), so tools and tests can name a checkpoint's objects without a
training stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamio.errors import ConfigError

__all__ = [
    "BAD",
    "MANIFEST",
    "MAX_PREFIXES",
    "OWNER",
    "Placement",
    "RETENTION",
    "bad_path",
    "manifest_at",
    "manifest_path",
    "marker_path",
    "is_spread_dir",
    "locate",
    "new_save_id",
    "object_save_id",
    "parents",
    "parse_save_dir",
    "parse_step_dir",
    "part_path",
    "rank_dir",
    "save_id_at",
    "save_dir",
    "save_started",
    "split_ranges",
    "spread_dir",
    "step_dir",
]

MANIFEST = "manifest.json"
BAD = "bad.json"
RETENTION = "retention.json"
OWNER = "owner.json"  # in a local tier's rank root: whose copies it holds (format/notes.py)

_STEP_RE = re.compile(r"^step-(\d{9,})$")
_SAVE_DIR_RE = re.compile(r"^step-(\d{9,})(?:-([A-Za-z0-9_-]{1,64}))?$")
_OBJECT_ID_RE = re.compile(r"^rank-\d{5,}/(?:part-(.+)-\d{5,}\.bin|done-(.+)\.json)$")
_TIMED_ID_RE = re.compile(r"^[0-9a-f]{16}$")
_SPREAD_RE = re.compile(r"^p-[0-9a-f]{2}$")

MAX_PREFIXES = 256
"""The most key prefixes a save spreads over (``p-00`` ... ``p-ff``)."""


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


# ------------------------------------------------------------------------------ key prefixes
@dataclass(frozen=True)
class Placement:
    """Where one save's objects live: its directory, and the key prefixes its ranks' objects are
    spread over (``prefixes == 1``: all in the save directory, the layout before format 4).

    Attributes:
        sdir: the save directory (holds the manifest and ``bad.json`` whatever ``prefixes`` is).
        prefixes: how many key prefixes the ranks' parts and markers are spread over.
    """

    sdir: str
    prefixes: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.prefixes, bool) or not isinstance(self.prefixes, int) or not (
            1 <= self.prefixes <= MAX_PREFIXES
        ):
            raise ConfigError(f"key prefixes must be a whole number in 1..{MAX_PREFIXES}, got {self.prefixes!r}")

    def rank_dir(self, rank: int) -> str:
        """The directory of ``rank``'s parts and marker, relative to the root."""
        return f"{self._base(rank)}/{rank_dir(rank)}"

    def path(self, rank: int, rest: str) -> str:
        """Where the object ``rest`` of ``rank`` (its path within the save, as documents record
        it: ``rank-00003/part-...bin``) lives, relative to the root."""
        return f"{self._base(rank)}/{rest}"

    def marker(self, rank: int, save_id: str) -> str:
        """Where ``rank``'s done marker of the save ``save_id`` lives, relative to the root."""
        return self.path(rank, marker_path(rank, save_id))

    def dirs(self) -> list[str]:
        """Every directory that holds objects of the save, relative to the root: the save
        directory, then one per key prefix."""
        if self.prefixes == 1:
            return [self.sdir]
        return [self.sdir, *(f"{spread_dir(i)}/{self.sdir}" for i in range(self.prefixes))]

    def _base(self, rank: int) -> str:
        return self.sdir if self.prefixes == 1 else f"{spread_dir(rank % self.prefixes)}/{self.sdir}"


def spread_dir(index: int) -> str:
    """``3`` -> ``"p-03"``: the name of key prefix ``index`` below the root."""
    return f"p-{index:02x}"


def parents(path: str) -> list[str]:
    """The directories above ``path``, deepest first (``"a/b/c"`` -> ``["a/b", "a"]``)."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def is_spread_dir(name: str) -> bool:
    """Whether ``name`` (a directory below the root) is a key prefix's (``p-03``)."""
    return _SPREAD_RE.match(name) is not None


def locate(path: str) -> tuple[str, str] | None:
    """The save directory an object of the root belongs to and its path within the save
    (``"p-03/step-000045000/rank-00003/done-x.json"`` -> ``("step-000045000", "rank-00003/done-x.json")``,
    ``"step-000045000/manifest.json"`` -> ``("step-000045000", "manifest.json")``); ``None`` for
    objects of no save (``latest.json``, ``retention.json``, anything else)."""
    head, _, rest = path.partition("/")
    if is_spread_dir(head):
        head, _, rest = rest.partition("/")
        if not rest.startswith("rank-"):  # only ranks' objects are spread
            return None
    if not rest or parse_save_dir(head) is None:
        return None
    return head, rest


def save_id_at(path: str) -> str | None:
    """The save id in the name of a part or done marker anywhere in the root (``path``: relative
    to the root, in either layout); ``None`` for any other object."""
    found = locate(path)
    return object_save_id(found[1]) if found is not None else None
