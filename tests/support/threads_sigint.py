"""A training loop over StreamingDataLoader(threads=2) that a test interrupts with SIGINT mid-epoch.

Prints ``batches 2`` after its second batch. ``slow``: every sample's transform takes 50 ms, so
batches are always being made on the loader's threads when the signal comes; ``stuck``: from the
third batch on the transform does not return (for a minute), so the loop waits in ``next()`` and
the loader's threads are busy when the signal comes. The test checks that the process ends with
KeyboardInterrupt at once either way, with no thread holding it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader


def slow(sample: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.05)
    return sample


def stuck(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["__index__"] >= 4:
        time.sleep(60)
    return sample


def main(url: str, mode: str) -> None:
    transform = slow if mode == "slow" else stuck
    loader = StreamingDataLoader(StreamingDataset(url, batch_size=2, shuffle=False, transform=transform), threads=2)
    for epoch in range(1000):  # epochs of a few seconds: the signal always comes mid-epoch
        for n, _ in enumerate(loader, 1):
            if n == 2 and epoch == 0:
                print("batches 2", flush=True)
            time.sleep(0.02)  # the training step


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
