"""Child process of tests/data/test_transport_limits.py: one epoch under an address-space limit.

``python ring_limits.py URL BATCH WORKERS EXTRA_MIB``: builds a dataset and both loaders, then caps
its address space (RLIMIT_AS, inherited by the DataLoader workers it forks) at its current size plus
EXTRA_MIB, and reads one epoch with a plain DataLoader (the control: what a job without streamio's
transport needs) and one with StreamingDataLoader. Prints one JSON line: batches read or the error of
each, and the transport's log lines.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import warnings

warnings.simplefilter("ignore")  # torch's advice on 8 workers for 2 CPUs

from torch.utils.data import DataLoader  # noqa: E402

from streamio.data.dataset import StreamingDataset  # noqa: E402
from streamio.data.loader import StreamingDataLoader  # noqa: E402


def epoch(loader: DataLoader) -> int | str:  # type: ignore[type-arg]
    try:
        return sum(1 for _ in loader)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"


def main() -> None:
    url, batch, workers, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.environ.update(RANK="0", WORLD_SIZE="1")
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    logging.getLogger("streamio.data.dataloader.transport").addHandler(Keep(logging.WARNING))
    ds = StreamingDataset(url, batch_size=batch)
    ds.set_epoch(0)
    plain = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=len)
    streaming = StreamingDataLoader(ds, num_workers=workers)
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + (extra << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
    print(json.dumps({"plain": epoch(plain), "streaming": epoch(streaming), "logged": logged}))


if __name__ == "__main__":
    main()
