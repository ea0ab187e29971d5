"""A training loop over StreamingDataLoader(threads=2) that a test interrupts with SIGINT mid-epoch.

Prints ``batches 2`` after its second batch; every sample's transform takes 50 ms, so batches are
always being made on the loader's threads when the signal comes. The test checks that the process
ends with KeyboardInterrupt at once, with no thread left holding it.
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


def main(url: str) -> None:
    loader = StreamingDataLoader(StreamingDataset(url, batch_size=2, transform=slow), threads=2)
    for epoch in range(1000):  # epochs of a few seconds: the signal always comes mid-epoch
        for n, _ in enumerate(loader, 1):
            if n == 2 and epoch == 0:
                print("batches 2", flush=True)
            time.sleep(0.02)  # the training step


if __name__ == "__main__":
    main(sys.argv[1])
