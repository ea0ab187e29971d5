"""One rank of the StreamingDataset DDP test (run by torchrun from test_dataset_ddp.py).

argv: URL OUT_DIR MODE [STATE_FILE]; MODE is full | stop | resume. Storage comes from
the AWS_* environment the test sets. Writes OUT_DIR/rank-K.json with what this rank read.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.data.options import DatasetOptions
from streamio.distributed import leave
from streamio.errors import PlanError

BATCH = 4


def collate(batch: list[dict]) -> tuple[list[str], torch.Tensor]:
    return [s["__key__"] for s in batch], torch.tensor([[float(s["cls"])] for s in batch])


def main() -> None:
    url, out_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = int(os.environ.get("TEST_WORKERS", "2"))
    result: dict = {"rank": rank, "world": world}
    if mode == "full":  # first: ranks that disagree on the seed are stopped at construction
        try:
            StreamingDataset(url, seed=rank, batch_size=BATCH, decode="auto", options=DatasetOptions(policy="drop"))
            result["seed_error"] = None
        except PlanError as exc:
            result["seed_error"] = str(exc)
    ds = StreamingDataset(url, batch_size=BATCH, decode="auto", options=DatasetOptions(policy="drop"))
    loader = StreamingDataLoader(ds, num_workers=workers, collate_fn=collate)
    model = DDP(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    epochs = [0, 1] if mode == "full" else [1]
    if mode == "resume":
        with open(sys.argv[4]) as f:
            loader.load_state_dict(json.load(f))
    for epoch in epochs:
        ds.set_epoch(epoch)
        keys: list[str] = []
        nbatches = 0
        result[f"len{epoch}"] = len(ds)
        for names, x in loader:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # a DDP all-reduce per batch: unequal batch counts would hang here
            opt.step()
            keys += names
            nbatches += 1
            if mode == "stop" and nbatches == int(0.4 * len(ds) / BATCH):
                if rank == 0:
                    with open(sys.argv[4], "w") as f:
                        json.dump(loader.state_dict(), f)
                break
        result[f"epoch{epoch}"] = keys
        result[f"batches{epoch}"] = nbatches
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    leave(0)


if __name__ == "__main__":
    main()
