"""Lightning Fabric with streamio.lightning.CheckpointIO: ``fabric.save`` / ``fabric.load`` to S3 (moto),
in this process on one rank, and on 2 gloo ranks under torchrun (rank 0 saves, every rank loads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.checkpoint.root import committed_saves
from streamio.errors import CheckpointError, CheckpointNotFoundError
from streamio.storage import Store
from streamio.testing import S3Endpoint

L = pytest.importorskip("lightning")

from streamio.lightning import CheckpointIO  # noqa: E402

SCRIPT = Path(__file__).parents[1] / "support" / "lightning_fabric.py"


@pytest.fixture
def fabric(s3: S3Endpoint) -> Any:
    return L.Fabric(accelerator="cpu", devices=1, plugins=[CheckpointIO(storage_options=s3.storage_options())])


def _trained(fabric: Any, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    module = torch.nn.Linear(3, 2)
    model, opt = fabric.setup(module, torch.optim.Adam(module.parameters(), lr=0.1))
    fabric.backward(model(torch.randn(4, 3)).pow(2).mean())
    opt.step()
    return model, opt


def test_fabric_save_then_load_restores_modules_optimizers_and_values(fabric: Any, s3: S3Endpoint) -> None:
    path = s3.url("run/fabric.ckpt")
    model, opt = _trained(fabric, 0)
    fabric.save(path, {"model": model, "optimizer": opt, "step": 3, "note": "kept"})
    assert [s.step for s in committed_saves(Store(path, s3.storage_options()))] == [0]  # no global_step: the 1st
    fresh, fresh_opt = _trained(fabric, 1)
    state = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    rest = fabric.load(path, state)
    assert rest == {"note": "kept"} and state["step"] == 3
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))
    saved, loaded = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert saved.keys() == loaded.keys() and all(
        torch.equal(saved[k][m], loaded[k][m]) for k in saved for m in ("exp_avg", "exp_avg_sq", "step"))
    store = Store(path, s3.storage_options())
    for n in (1, 2):  # saving the same path again: the new state wins, one save stays, its step counts on
        model.weight.data.add_(1.0)
        fabric.save(path, {"model": model, "step": 3 + n})
        assert torch.equal(fabric.load(path)["model"]["weight"], model.weight.detach())
        assert [s.step for s in committed_saves(store)] == [n]
    CheckpointIO(storage_options=s3.storage_options()).save_checkpoint({"step": 6}, path)  # another job
    assert [s.step for s in committed_saves(store)] == [3]
    fabric.save(path, {"model": model, "global_step": 2})  # a step given wins, earlier or not
    assert [s.step for s in committed_saves(store)] == [2] and fabric.load(path)["global_step"] == 2


def test_fabric_errors_name_the_path_and_the_key(fabric: Any, s3: S3Endpoint) -> None:
    nothing = s3.url("run/none.ckpt")
    with pytest.raises(CheckpointNotFoundError, match=r"'s3://.*/run/none\.ckpt' names no streamio checkpoint"):
        fabric.load(nothing, {})
    for value, where in ((object(), "'lightning/extra' of type object"),
                         ({"x": [1, {"fn": len}]}, "'lightning/extra/x/1/fn' of type builtin_function_or_method")):
        with pytest.raises(CheckpointError, match=f"cannot save {where}: checkpoint state must be tensors"):
            fabric.save(s3.url("run/bad.ckpt"), {"step": 1, "extra": value})
    assert Store(s3.url("run"), s3.storage_options()).list() == []  # nothing half written


@pytest.mark.slow
def test_fabric_on_two_ranks_saves_on_rank_0_and_every_rank_loads_it(s3: S3Endpoint, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env())
    env["OMP_NUM_THREADS"] = "1"
    path = s3.url("run/fabric.ckpt")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT), path,
         str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300, start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"out.rank{rank}").read_text())
        assert result == {"weights_equal": True, "moments_equal": True, "step": 2, "rest": {"run": "fabric"}}, rank
    assert [s.step for s in committed_saves(Store(path, s3.storage_options()))] == [0]
