"""One small dataset read through each loader a framework may drive (tests/data's epoch and resume tests).

The kinds: a plain ``DataLoader`` (no workers: the dataset counts itself), ``StreamingDataLoader``
and torchdata's ``StatefulDataLoader``, each with 0 or 2 workers. A batch is the tuple of its
samples' keys, so runs compare as plain data.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from support.dataset import make_dataset

COUNTS = [5, 7, 3, 9]  # 24 samples: 6 batches of 4 per epoch
KINDS = ["plain-0", "streaming-0", "streaming-2", "stateful-0", "stateful-2"]
Batch = tuple[str, ...]


def keys_of(batch: list[dict[str, Any]]) -> Batch:
    return tuple(s["__key__"] for s in batch)


def take_batches(loader: Any, state: Any = None, stop_after: int | None = None) -> tuple[list[Any], Any]:
    """``loader``'s batches (after ``load_state_dict(state)`` when given), the first ``stop_after`` of
    them when given, and its ``state_dict()`` after the last one taken."""
    if state is not None:
        loader.load_state_dict(state)
    out: list[Any] = []
    for batch in loader:
        out.append(batch)
        if len(out) == stop_after:
            break
    return out, loader.state_dict()


def small_dataset(url: str) -> str:
    """Write the dataset of :data:`COUNTS` samples per shard at ``url``; returns ``url``."""
    make_dataset(url, None, COUNTS)
    return url


class LoaderJob:
    """A dataset and a loader of one kind, and the object whose ``state_dict()`` a framework saves."""

    def __init__(self, url: str, kind: str) -> None:
        name, workers = kind.split("-")
        n = int(workers)
        self.ds = StreamingDataset(url, batch_size=4)
        self.loader: Any
        if name == "plain":
            self.loader = DataLoader(self.ds, batch_size=4, num_workers=n, collate_fn=keys_of)
        elif name == "streaming":
            self.loader = StreamingDataLoader(self.ds, num_workers=n, collate_fn=keys_of)
        else:
            self.loader = StatefulDataLoader(self.ds, batch_size=4, num_workers=n, collate_fn=keys_of)
        self.stateful = self.ds if name == "plain" else self.loader
