"""How checkpoints are cut and uploaded (:class:`SaveOptions`) and what one save cost (:class:`SaveStats`).

Plain frozen values (PURE: no torch, fsspec or storage), shared by the facade
(:mod:`.manager`), the commit protocol (:mod:`.save.commit`) and the restore walk (:mod:`.restore.walk`).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamio.errors import ConfigError

__all__ = ["SaveOptions", "SaveStats"]


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
    """

    part_size: int = 64 << 20
    concurrency: int = 8
    compression: str | None = None
    zstd_level: int = 3
    per_rank: frozenset[str] = frozenset({"rng", "data"})
    collective_timeout_s: float = 300.0
    block_size: int = 1 << 20

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
        object.__setattr__(self, "per_rank", frozenset(self.per_rank))


@dataclass(frozen=True)
class SaveStats:
    """What one save cost.

    Attributes:
        step: the step saved.
        blocked_s: seconds ``save`` blocked the caller (waiting for the previous save + snapshot).
        durable_s: seconds from the ``save`` call until the pointer named this step.
        bytes_written: stored bytes this rank uploaded.
        files: part objects this rank uploaded.
    """

    step: int
    blocked_s: float
    durable_s: float
    bytes_written: int
    files: int
