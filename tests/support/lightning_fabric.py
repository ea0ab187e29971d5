"""Lightning Fabric on 2 gloo ranks (torchrun) saving and loading through streamio.lightning to S3 (moto).

``python -m torch.distributed.run --nproc_per_node 2 lightning_fabric.py PATH OUT``: each rank
takes two DDP steps of a small model with Adam, ``fabric.save(PATH, state)`` (Fabric calls the
plugin on rank 0 only), then every rank loads PATH into a fresh model and optimizer with
``fabric.load`` and writes ``OUT.rank<r>``: whether the loaded weights and Adam moments equal the
saved ones bit for bit, the restored ``step`` and what ``fabric.load`` returned unclaimed.
"""

from __future__ import annotations

import json
import sys

import lightning as L
import torch

from streamio.lightning import CheckpointIO


def _fresh(fabric: L.Fabric) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.1))


def main(path: str, out: str) -> None:
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=2, plugins=[CheckpointIO()])  # env: the endpoint
    fabric.launch()
    fabric.seed_everything(7)
    model, opt = _fresh(fabric)
    for step in range(2):
        x = torch.full((3, 4), float(fabric.global_rank + step))  # each rank its own batch: DDP averages
        fabric.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
    fabric.save(path, {"model": model, "optimizer": opt, "step": 2, "run": "fabric"})
    fresh, fresh_opt = _fresh(fabric)
    state = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    rest = fabric.load(path, state)
    moments = [(a["exp_avg"], b["exp_avg"]) for a, b in zip(opt.state_dict()["state"].values(),
                                                             fresh_opt.state_dict()["state"].values(), strict=True)]
    result = {
        "weights_equal": all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)),
        "moments_equal": bool(moments) and all(torch.equal(a, b) for a, b in moments),
        "step": state["step"], "rest": rest,
    }
    with open(f"{out}.rank{fabric.global_rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
