"""One DataLoader epoch (2 forked workers) over a file:// dataset, under ``STREAMIO_TRACE``.

Run by tests/metrics/test_trace_files.py in a process of its own (the trace switch is read at
import). Spans: ``wait`` around each batch in the main process, ``decode`` around each sample's
transform in the workers (StreamingDataset's iterator writes a worker's file as it ends). Prints
the main pid and the batch count as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader

from streamio import StreamingDataset
from streamio.metrics.trace import span
from tests.support.dataset import make_dataset


def _decode(sample: dict[str, Any]) -> str:
    with span("decode", key=sample["__key__"]):
        return str(sample["__key__"])


def main(root: str) -> None:
    warnings.filterwarnings("ignore", message="StreamingDataset")  # a plain DataLoader's resume and epoch notes
    url = f"file://{root}/ds"
    make_dataset(url, None, [5, 7, 3, 9])
    loader = DataLoader(StreamingDataset(url, shuffle=False, transform=_decode), batch_size=4,
                        num_workers=2, collate_fn=list, multiprocessing_context="fork")
    batches = 0
    it = iter(loader)
    while True:
        with span("wait"):
            batch = next(it, None)
        if batch is None:
            break
        batches += 1
    print(json.dumps({"pid": os.getpid(), "batches": batches, "torch": torch.__version__}))


if __name__ == "__main__":
    main(sys.argv[1])
