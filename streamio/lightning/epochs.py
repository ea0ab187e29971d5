"""Lightning's batch count of an epoch resumed in its middle, for a ``StreamingDataLoader``.

Lightning counts an epoch's batches from its start (``batch_idx`` and the progress it restores
run on from the batch the checkpoint was saved after) and ends the epoch when that count reaches
``trainer.num_training_batches`` (``fit_loop.max_batches``), or when its data fetcher, counting
on from the same batch, has fetched ``len(loader)``. It takes both from ``len(loader)`` *after*
loading the loader's state, where a ``StreamingDataLoader``'s length is the rest of the epoch, and
keeps ``max_batches`` for every later epoch: the resumed epoch would end early and every later one
too. :func:`count_whole_epochs` sets it back to the whole epoch's batch count, which
Lightning measured before loading the state (``CombinedLoader.limits``); the resumed epoch then
ends when the loader does, at the same batch as an uninterrupted run's.

The Lightning internals read here (``fit_loop.max_batches``, ``_combined_loader``, ``limits``,
``_data_fetcher.length``, ``val_check_batch``) are those of Lightning 2.5 and 2.6 (with 2.4 the
resumed epoch's ``batch_idx`` comes out one lower).
"""

from __future__ import annotations

import math
from typing import Any

from streamio.data.loader import StreamingDataLoader

__all__ = ["count_whole_epochs"]


def count_whole_epochs(trainer: Any) -> None:
    """Make ``trainer`` count whole epochs of its ``StreamingDataLoader`` after a mid-epoch resume
    (nothing otherwise: another loader, no resume, or a loader of unknown length)."""
    loop = trainer.fit_loop
    combined = getattr(loop, "_combined_loader", None)
    if combined is None or not any(isinstance(dl, StreamingDataLoader) for dl in combined.flattened):
        return
    limits = combined.limits
    if not limits or not all(isinstance(n, int) for n in limits):
        return
    whole = min(limits) if combined._mode == "min_size" else max(limits)
    if whole == loop.max_batches or math.isinf(loop.max_batches):
        return
    loop.max_batches = whole
    fetcher = getattr(loop, "_data_fetcher", None)
    if fetcher is not None and fetcher.length is not None:
        fetcher.length = whole  # it counts on from the saved batch too (the next epoch's iter() measures anew)
    interval = trainer.val_check_interval
    if isinstance(interval, float) and getattr(trainer, "_val_check_time_interval", None) is None:
        trainer.val_check_batch = max(1, int(whole * interval))
