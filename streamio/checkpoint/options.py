"""How checkpoints are cut and uploaded (:class:`SaveOptions`), where the local tier is
(:class:`LocalTier`), and what one save cost (:class:`SaveStats`).

Plain frozen values (PURE: no torch, fsspec or storage), shared by the facade
(:mod:`.manager`), the commit protocol (:mod:`.save.commit`) and the restore walk (:mod:`.restore.walk`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from streamio.errors import ConfigError

__all__ = ["LocalTier", "SaveOptions", "SaveStats", "part_size_for"]


@dataclass(frozen=True)
class SaveOptions:
    """How checkpoints are cut and uploaded.

    Attributes:
        part_size: most raw bytes per part object (a tensor may span parts); bounds each PUT.
            Smaller states are cut finer, down to 4 MiB, so every upload thread has work.
        concurrency: parallel PUTs / GETs.
        compression: ``None`` or ``"zstd"`` (per part; pays off for sparse or low-entropy state).
        zstd_level: zstd level when compressing.
        per_rank: state names saved by every rank (RNG, data position); all others are
            replicated across ranks and divided among them for upload.
        collective_timeout_s: under ``torch.distributed``, how long a rank waits for every other
            rank to reach the same ``save`` or ``restore`` (and to construct its manager) before
            it raises ``CheckpointError`` naming the ranks that did not come. Raise it if one
            rank does long work alone before a save (an evaluation on rank 0 only). Every wait
            is bounded: once all ranks are in, waits for the slowest rank's uploads or downloads
            are bounded by the larger of this and 30 minutes (a rank that dies is noticed at once).
        block_size: raw bytes per checksummed block of a part, in saves that hold sharded
            (DTensor) state: the unit of a verified ranged read when a restore onto another
            sharding needs only some rows of a part. Smaller blocks read less around each
            needed span; each block costs one CRC32C string in the manifest.
        durable_every: with a local tier, every ``durable_every``-th save also goes to the root
            (``save(durable=True)`` whatever it says, ``save(durable="local")`` never); 1 (the
            default) makes every save durable.
            Without a local tier every save goes to the root.
        parts_per_save: the most part objects one save of the whole job aims for: at large world
            sizes a rank's share is cut into ``parts_per_save / world`` parts (never more than
            ``part_size`` each) instead of two per upload thread, so the job's requests, not only
            its bytes, stay bounded (a store serves a few thousand writes per second per prefix:
            docs/design.md "Request rates").
        write_rate: the most write requests per second the whole job's save sends to the store,
            shared among the ranks in proportion to their writes, so that even a job's first save
            does not burst past the store's limit. ``"store"`` (the default): the limit the
            provider documents for a new prefix (AWS S3: 3,500; Google Cloud Storage: 1,000),
            doubled after 20 minutes of saves the store never throttled, up to ``key_prefixes``
            times it, halved after a throttled save; none for other endpoints (MinIO,
            emulators); a number: that cap, fixed; ``None``: no cap. Either way the ranks pace
            together at the rate the store taught them (docs/design.md "Request rates").
        key_prefixes: how many key prefixes below the root a save of many ranks spreads its
            parts and done markers over (rank ``r`` writes below ``p-{r mod N:02x}/``; at most the
            world size, at most 256; 1: everything in the save directory, as before format 4).
            Every save reuses the same prefixes, which an object store that partitions its key
            space under sustained load (S3) can serve beyond one prefix's limit; a new
            ``step-*/`` prefix never gets that far (docs/design.md "Request rates").
        restore_fanout: under ``torch.distributed``, a restore reads the parts several ranks
            need (replicated state) from the store once per job, each rank a share balanced by
            bytes, and the ranks exchange them over the process group; ``False`` makes every
            rank read all it needs from the store itself.
    """

    part_size: int = 64 << 20
    concurrency: int = 8
    compression: str | None = None
    zstd_level: int = 3
    per_rank: frozenset[str] = frozenset({"rng", "data"})
    collective_timeout_s: float = 300.0
    block_size: int = 1 << 20
    durable_every: int = 1
    parts_per_save: int = 16384
    restore_fanout: bool = True
    write_rate: float | str | None = "store"
    key_prefixes: int = 16
    save_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.part_size < 4096:
            raise ConfigError(f"part_size must be at least 4096 bytes, got {self.part_size}")
        if self.compression not in (None, "zstd"):
            raise ConfigError(f"compression must be None or 'zstd', got {self.compression!r}")
        if not self.collective_timeout_s > 0:
            raise ConfigError(f"collective_timeout_s must be a positive number of seconds, got "
                             f"{self.collective_timeout_s}")
        if self.block_size < 1024:
            raise ConfigError(f"block_size must be at least 1024 bytes, got {self.block_size}")
        if isinstance(self.parts_per_save, bool) or not isinstance(self.parts_per_save, int) or self.parts_per_save < 1:
            raise ConfigError(f"parts_per_save must be a whole number >= 1, got {self.parts_per_save!r}")
        if isinstance(self.durable_every, bool) or not isinstance(self.durable_every, int) or self.durable_every < 1:
            raise ConfigError(f"durable_every must be a whole number >= 1, got {self.durable_every!r}")
        if self.write_rate not in (None, "store") and not _positive_finite(self.write_rate):
            raise ConfigError(f"write_rate must be a positive number of writes per second, 'store' or None, got "
                              f"{self.write_rate!r}")
        if isinstance(self.key_prefixes, bool) or not isinstance(self.key_prefixes, int) or not (
            1 <= self.key_prefixes <= 256  # format.layout.MAX_PREFIXES (p-00 ... p-ff)
        ):
            raise ConfigError(f"key_prefixes must be a whole number in 1..256, got {self.key_prefixes!r}")
        if self.save_timeout_s is not None and not _positive_finite(self.save_timeout_s):
            raise ConfigError(f"save_timeout_s must be a positive finite number of seconds or None, got "
                              f"{self.save_timeout_s!r}")
        object.__setattr__(self, "per_rank", frozenset(self.per_rank))


@dataclass(frozen=True)
class LocalTier:
    """A checkpoint tier on node-local storage: saves commit here first, the root in the background.

    Each rank keeps its copy in a directory of its own below ``path`` (``rank-00003/``), a
    checkpoint root of the same layout as the durable one; ranks of one node may share ``path``
    and read each other's copies. NVMe is the usual place; a ``/dev/shm/...`` path is a RAM tier
    (lost with the node, not with the process). The directory belongs to the first root that uses
    it (each rank's directory records it, ``owner.json``): a manager of another root given the same
    path raises :class:`~streamio.errors.ConfigError` naming both, and never restores, writes or
    prunes the other's copies. docs/design.md "Local tier".

    Attributes:
        path: a local directory (created if missing).
        keep: the newest local saves of the job's timeline each rank keeps (everything else in its
            directory is deleted at each save: older saves, superseded ones, what a killed save
            left); the root's retention is its own.
    """

    path: str
    keep: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ConfigError(f"LocalTier.path must be a local directory (a str or os.PathLike), got {self.path!r}")
        path = os.fspath(self.path)
        if not isinstance(path, str) or not path or "://" in path and not path.startswith("file://"):
            raise ConfigError(f"LocalTier.path must be a local directory, got {self.path!r}")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ConfigError(f"LocalTier.keep must be a whole number >= 1, got {self.keep!r}")
        object.__setattr__(self, "path", path)

    def rank_root(self, rank: int) -> str:
        """The local root of ``rank``'s copies."""
        return f"{self.path.rstrip('/')}/rank-{rank:05d}"


@dataclass(frozen=True)
class SaveStats:
    """What one save cost.

    Attributes:
        step: the step saved.
        blocked_s: seconds ``save`` blocked the caller (waiting for the previous save + snapshot).
        durable_s: seconds from the ``save`` call until the pointer named this step.
        bytes_written: stored bytes this rank uploaded.
        files: part objects this rank uploaded.
        local_s: with a local tier, seconds from the ``save`` call until every rank's local
            pointer named this step (``None`` without one; local retention runs after it);
            ``durable_s`` is then ``None`` for a save that went to the local tier alone.
    """

    step: int
    blocked_s: float
    durable_s: float | None
    bytes_written: int
    files: int
    local_s: float | None = None


def part_size_for(total: int, options: SaveOptions, *, local: bool = False, world: int = 1) -> int:
    """Part size for a stream of ``total`` bytes: at most ``options.part_size``, but small enough
    that there are about two parts per upload thread (never below 4 MiB), so a small state still
    uploads in parallel; and large enough that the ``world`` ranks write at most about
    ``options.parts_per_save`` parts together (a store's request rate, not its bandwidth, bounds a
    save of many ranks: docs/design.md "Request rates").

    On a local root (``local``) each part costs a temp file, an fsync, a link and a directory
    fsync, and there are no slow requests to balance, so it is one part per upload thread: on
    local disk 8 parts of a 300 MB state reached durable in ~0.25 s after the snapshot against
    ~0.3-0.55 s for 16 (benchmarks/bench_checkpoint.py, 2 shared CPUs).
    """
    per_thread = -(-total // max(1, (1 if local else 2) * options.concurrency))
    per_job = -(-total // max(1, options.parts_per_save // max(1, world)))
    return min(options.part_size, max(per_thread, per_job, 4 << 20))


def _positive_finite(value: object) -> bool:
    """A real number in (0, inf) (``True`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf
