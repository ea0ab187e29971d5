"""The older ``pytorch_lightning`` package (with ``lightning_fabric``): its Trainer and Fabric accept
streamio.lightning.CheckpointIO, on the local S3 server (moto over HTTP), one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from streamio.checkpoint.root import committed_saves, read_pointer
from streamio.storage import Store
from streamio.testing import S3Endpoint

pl = pytest.importorskip("pytorch_lightning")
lightning_fabric = pytest.importorskip("lightning_fabric")

from streamio.lightning import CheckpointIO  # noqa: E402


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.steps_run = 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.steps_run += 1
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(io: CheckpointIO, dirpath: str, max_steps: int) -> Any:
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_last=True)
    return pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, plugins=[io], callbacks=[checkpoints])


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_pytorch_lightning_trainer_saves_through_the_plugin_and_resumes_from_a_path(
        s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():  # what Lightning's own fsspec calls (ModelCheckpoint._fs) use
        monkeypatch.setenv(name, value)
    opts = s3.storage_options()
    io = CheckpointIO(storage_options=opts)
    dirpath = s3.url("run/ckpt")
    data = torch.utils.data.DataLoader(torch.randn(64, 3), batch_size=4)
    _trainer(io, dirpath, 4).fit(_Tiny(), data)
    last = Store(f"{dirpath}/last.ckpt", opts)
    assert read_pointer(last).step == 4
    roots = sorted({o.path.split("/")[0] for o in Store(dirpath, opts).list()})
    assert roots == ["epoch=0-step=4.ckpt", "last.ckpt"], roots  # streamio roots; top-1 removed step 2
    trainer, model = _trainer(io, dirpath, 6), _Tiny()
    trainer.fit(model, data, ckpt_path=f"{dirpath}/last.ckpt")  # Lightning's "last" lookup cannot read S3
    assert trainer.global_step == 6 and [s.step for s in committed_saves(last)] == [6]
    assert model.steps_run == 2  # went on from step 4, not from 0


def test_lightning_fabric_saves_and_loads_through_the_plugin(s3: S3Endpoint) -> None:
    fabric = lightning_fabric.Fabric(accelerator="cpu", devices=1,
                                     plugins=[CheckpointIO(storage_options=s3.storage_options())])
    module = torch.nn.Linear(3, 2)
    model = fabric.setup(module)
    path = s3.url("run/state.ckpt")
    fabric.save(path, {"model": model, "global_step": 5})
    fresh = fabric.setup(torch.nn.Linear(3, 2))
    state = {"model": fresh, "global_step": 0}
    assert fabric.load(path, state) == {} and state["global_step"] == 5
    assert torch.equal(fresh.weight, module.weight) and torch.equal(fresh.bias, module.bias)
    assert [s.step for s in committed_saves(Store(path, s3.storage_options()))] == [5]
