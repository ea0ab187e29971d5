"""StreamingDataLoader in a real Lightning Trainer (one process, moto S3): a fit that stops inside an
epoch and a ``fit(ckpt_path="last")`` see the same batches at the same ``batch_idx`` and steps as an
uninterrupted fit, over several epochs, each sample once per epoch."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch

from streamio import StreamingDataLoader, StreamingDataset
from streamio.testing import S3Endpoint
from support.dataset import all_keys, make_dataset

L = pytest.importorskip("lightning")

from streamio.lightning import CheckpointIO, ModelCheckpoint  # noqa: E402

COUNTS = [7, 5, 9, 3]  # 24 samples: 12 batches of 2 per epoch
PER_EPOCH = 12


class _Keys(L.LightningModule):
    """Trains on vectors derived from the sample keys; records what each step saw."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.seen: list[tuple[int, int, int, tuple[str, ...]]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        keys = tuple(batch["__key__"])
        self.seen.append((self.current_epoch, self.global_step, batch_idx, keys))
        x = torch.stack([torch.randn(4, generator=torch.Generator().manual_seed(zlib.crc32(k.encode())))
                         for k in keys])
        return torch.nn.functional.mse_loss(self.net(x), x.sum(1, keepdim=True))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(s3: S3Endpoint, dirpath: str, max_steps: int, resume: bool) -> _Keys:
    ds = StreamingDataset(s3.url("ds"), batch_size=2, seed=3, storage_options=s3.storage_options())
    model = _Keys()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[CheckpointIO(storage_options=s3.storage_options())],
                        callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_last=True,
                                                   save_top_k=0)])
    trainer.fit(model, StreamingDataLoader(ds), ckpt_path="last" if resume else None)
    return model


def _env(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():  # Lightning's own file checks (ModelCheckpoint._fs) use them
        monkeypatch.setenv(name, value)
    make_dataset(s3.url("ds"), s3.storage_options(), COUNTS)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_the_resumed_epoch_is_counted_whole_and_ends_where_an_uninterrupted_one_does(
        s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(s3, monkeypatch)
    full = _fit(s3, s3.url("full"), PER_EPOCH, resume=False)
    first = _fit(s3, s3.url("ckpt"), 5, resume=False)
    rest = _fit(s3, s3.url("ckpt"), PER_EPOCH, resume=True)
    # Lightning took len(loader) = the 7 batches left for the whole epoch: it ended the epoch after 2
    assert [s[:3] for s in rest.seen] == [(0, step, step) for step in range(5, PER_EPOCH)]
    assert first.seen + rest.seen == full.seen
    assert torch.equal(rest.net.weight, full.net.weight) and torch.equal(rest.net.bias, full.net.bias)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_a_fit_resumed_inside_an_epoch_sees_what_an_uninterrupted_fit_sees(
        s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped inside the second epoch, resumed, run on past the next epoch's start (a resume inside
    the first epoch: the test above)."""
    _env(s3, monkeypatch)
    stop = PER_EPOCH + 7
    total = 3 * PER_EPOCH  # to the end of the third epoch
    full = _fit(s3, s3.url("full"), total, resume=False)
    first = _fit(s3, s3.url("ckpt"), stop, resume=False)
    rest = _fit(s3, s3.url("ckpt"), total, resume=True)
    assert first.seen + rest.seen == full.seen  # same epoch, step, batch_idx and samples at every step
    assert [s[2] for s in full.seen] == list(range(PER_EPOCH)) * 3
    for epoch in range(3):
        keys = [k for e, _, _, ks in full.seen if e == epoch for k in ks]
        assert sorted(keys) == sorted(all_keys(COUNTS))  # each sample once per epoch
    assert torch.equal(rest.net.weight, full.net.weight) and torch.equal(rest.net.bias, full.net.bias)
