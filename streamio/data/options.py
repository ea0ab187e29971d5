"""``DatasetOptions``: the settings of a :class:`~streamio.data.dataset.StreamingDataset` most jobs leave alone.

One frozen value (tail policy, cache, prefetch, fault handler, a mixture's samples per epoch, the
collective timeout) so that the dataset's constructor keeps the keywords a job changes; it
validates itself where it is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamio.data.cache import CacheConfig
from streamio.data.format.samples import Handler
from streamio.data.plan import Sampling, TailPolicy
from streamio.data.read.prefetch import PrefetchConfig
from streamio.errors import ConfigError

__all__ = ["DatasetOptions"]


@dataclass(frozen=True)
class DatasetOptions:
    """The settings of a :class:`StreamingDataset` that most jobs leave at their defaults.

    Attributes:
        policy: ``"pad"`` (wrap around so every sample is seen) or ``"drop"``: what happens to the
            samples that do not divide evenly across ranks (stated in the plan).
        cache: node-local cache settings, or None to stream without caching.
        prefetch: read-ahead settings (depth in runs, memory bound).
        handler: ``handler(exc) -> bool`` for a shard that is missing, truncated or corrupt: True
            skips the rest of that run (logged, counted in :attr:`StreamingDataset.lost_samples`;
            this rank then yields that many fewer samples, so equal work no longer holds), False or
            None raises.
        epoch_samples: samples per epoch of a mixture; the weighted sources are scaled to fill it.
            None = the sum of the sources' contributions.
        collective_timeout_s: under ``torch.distributed``, how long a rank waits for the others
            while the dataset is constructed (rank 0 reads every index for all of them; the ranks
            check that they agree on seed and settings) before it raises ``PlanError``.

    Raises:
        PlanError: ``policy`` is not a tail policy.
        ConfigError: ``collective_timeout_s`` is not a positive number of seconds.
    """

    policy: TailPolicy = "pad"
    cache: CacheConfig | None = None
    prefetch: PrefetchConfig = PrefetchConfig()
    handler: Handler | None = None
    epoch_samples: int | None = None
    collective_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        Sampling(policy=self.policy)  # validates the policy where it was written
        timeout = self.collective_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ConfigError(
                f"DatasetOptions(collective_timeout_s={self.collective_timeout_s!r}): give a positive, finite "
                f"number of seconds (the default is 300)"
            )
