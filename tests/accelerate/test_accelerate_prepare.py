"""``streamio.accelerate`` in one process with a real ``Accelerator``: what ``prepare`` keeps and
refuses, and ``save_state`` / ``load_state`` against S3 (moto). The 2-rank runs are in
test_accelerate_ddp.py."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader

from streamio import CheckpointManager, StreamingDataLoader, StreamingDataset
from streamio.accelerate import DeviceLoader, load_state, prepare, save_state
from streamio.accelerate.requirement import INSTALL, require
from streamio.checkpoint import SaveOptions
from streamio.errors import (
    ArgumentError,
    CheckpointError,
    CheckpointFormatError,
    ConfigError,
    MissingDependencyError,
)
from streamio.testing import S3Endpoint
from support.dataset import all_keys, make_dataset

COUNTS = [7, 5, 9]  # 21 samples: 6 batches of 4 on one rank (the last of 1)


def features(sample: dict[str, Any]) -> dict[str, Any]:
    g = torch.Generator().manual_seed(zlib.crc32(sample["__key__"].encode()))
    return {"__key__": sample["__key__"], "x": torch.randn(4, generator=g)}


class Counter:
    """An object registered for checkpointing (``accelerator.register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


@pytest.fixture
def url(s3: S3Endpoint) -> str:
    make_dataset(s3.url("ds"), s3.storage_options(), COUNTS)
    return s3.url("ds")


def _loader(url: str, s3: S3Endpoint) -> StreamingDataLoader:
    return StreamingDataLoader(StreamingDataset(url, batch_size=4, seed=1, transform=features,
                                                storage_options=s3.storage_options()))


def _parts() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def _train(accelerator: Accelerator, model: Any, optimizer: Any, scheduler: Any, batch: Any) -> float:
    loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["x"].sum(1, keepdim=True))
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(loss.detach())


def test_prepare_keeps_the_loader_and_prepares_the_rest_in_place(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = _parts()
    loader = _loader(url, s3)
    p_model, p_optimizer, p_loader, p_scheduler = prepare(accelerator, model, optimizer, loader, scheduler)
    assert isinstance(p_loader, DeviceLoader) and p_loader.loader is loader
    assert type(p_optimizer).__name__ == "AcceleratedOptimizer" and p_optimizer.optimizer is optimizer
    assert type(p_scheduler).__name__ == "AcceleratedScheduler" and p_scheduler.scheduler is scheduler
    assert accelerator._models == [p_model] and accelerator._dataloaders == []  # Accelerate never saw the loader
    batches = list(p_loader)
    assert [len(b["__key__"]) for b in batches] == [4, 4, 4, 4, 4, 1] and len(p_loader) == 6
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(all_keys(COUNTS))  # strings pass through
    assert all(b["x"].device.type == accelerator.device.type for b in batches)
    assert p_loader.state_dict() == loader.state_dict() and p_loader.dataset is loader.dataset
    # the same loader again: the same wrapper; one object alone comes back as itself
    assert prepare(accelerator, loader) is p_loader and prepare(accelerator, p_loader) is p_loader


def test_the_epoch_end_reaches_gradient_accumulation(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer, scheduler = _parts()
    model, optimizer, loader, scheduler = prepare(accelerator, model, optimizer, _loader(url, s3), scheduler)
    synced = []
    for epoch in range(2):
        for batch in loader:
            with accelerator.accumulate(model):
                _train(accelerator, model, optimizer, scheduler, batch)
                synced.append(accelerator.sync_gradients)
        assert not accelerator.gradient_state.in_dataloader, epoch
    # 6 batches an epoch: a sync after 4, and at the epoch's last batch (not 2 batches into the next epoch)
    assert synced == [False, False, False, True, False, True] * 2


@pytest.mark.parametrize("option", ["dispatch_batches", "split_batches"])
def test_prepare_refuses_an_accelerator_that_dispatches_or_splits_batches(
    url: str, s3: S3Endpoint, option: str,
) -> None:
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**{option: True}))
    model, optimizer, _ = _parts()
    with pytest.raises(ConfigError, match=rf"DataLoaderConfiguration\({option}=True\).*leave {option} unset"):
        prepare(accelerator, model, optimizer, _loader(url, s3))
    assert accelerator._models == [] and accelerator._optimizers == []  # refused before anything was prepared


def test_prepare_refuses_a_dataset_sharded_over_other_ranks_than_the_accelerator(
    url: str, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    accelerator = Accelerator(cpu=True)  # one process: no process group
    monkeypatch.setenv("RANK", "1")  # what torchrun sets for its second process (Accelerator() ignores it on CPUs)
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = _loader(url, s3)
    with pytest.raises(ConfigError, match=r"rank 1 of 2 .* runs as process 0 of 1: .*Accelerator\(cpu=True\)"):
        prepare(accelerator, torch.nn.Linear(2, 2), loader)
    assert accelerator._models == []


def test_prepare_refuses_the_dataset_itself_and_loaders_accelerate_would_shard_again(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    dataset = _loader(url, s3).dataset
    with pytest.raises(ArgumentError, match=r"got the dataset .* itself: pass a streamio.StreamingDataLoader") as info:
        prepare(accelerator, dataset)
    assert isinstance(info.value, TypeError)
    with pytest.raises(ConfigError, match=r"got a DataLoader over .*half the data on 2 ranks"):
        prepare(accelerator, torch.nn.Linear(2, 2), DataLoader(dataset, batch_size=None))
    assert accelerator._models == []
    wrapped = accelerator.prepare(_loader(url, s3))  # what the issue describes: Accelerate wraps it
    with pytest.raises(ConfigError, match=r"got a DataLoaderDispatcher over .*pass a streamio.StreamingDataLoader"):
        prepare(Accelerator(cpu=True), wrapped)  # another accelerator, given the wrapped loader
    # the accelerator that made it is refused by every entry point
    ckpt = CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options())
    for call in (lambda: prepare(accelerator, _loader(url, s3)), lambda: save_state(accelerator, ckpt, 1),
                 lambda: load_state(accelerator, ckpt)):
        with pytest.raises(ConfigError, match=r"accelerator.prepare already made a DataLoaderDispatcher over"):
            call()
    ckpt.close()
    assert ckpt.steps() == []


def test_save_then_load_restores_every_object_and_the_loader_position(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    model, optimizer, scheduler = _parts()
    model, optimizer, loader, scheduler = prepare(accelerator, model, optimizer, _loader(url, s3), scheduler)
    ckpt = CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options())
    assert load_state(accelerator, ckpt) is None  # nothing to resume: nothing touched
    it = iter(loader)
    for _ in range(3):
        _train(accelerator, model, optimizer, scheduler, next(it))
    counter.n, accelerator.step = 7, 3
    save_state(accelerator, ckpt, 3)
    ckpt.wait()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    lr, torch_rng = scheduler.get_last_lr(), torch.get_rng_state()
    rest = [b["__key__"] for b in it]
    after = [_train(accelerator, model, optimizer, scheduler, b) for b in loader]  # the next epoch changes it all
    counter.n, accelerator.step = 0, 0

    assert load_state(accelerator, ckpt) == 3
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert scheduler.get_last_lr() == lr and counter.n == 7 and accelerator.step == 3
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert [b["__key__"] for b in loader] == rest  # the rest of epoch 0, as before the save
    assert len(after) == 6
    ckpt.close()


def test_load_state_refuses_a_checkpoint_of_other_objects(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.register_for_checkpointing(Counter())
    model, optimizer, _ = _parts()
    model, optimizer, loader = prepare(accelerator, model, optimizer, _loader(url, s3))
    with CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options()) as ckpt:
        save_state(accelerator, ckpt, 1)
    accelerator._custom_objects.clear()  # the next run registers nothing
    with CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options()) as ckpt:
        with pytest.raises(CheckpointError, match=r"'custom': 1.*this accelerator has .*'custom': 0") as info:
            load_state(accelerator, ckpt)
    assert isinstance(info.value.__cause__, CheckpointFormatError)
    accelerator.register_for_checkpointing(Counter())
    accelerator.register_for_checkpointing(Counter())  # two now: the checkpoint has no custom_1
    with CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options()) as ckpt:
        with pytest.raises(CheckpointError, match=r"the checkpoint has no \['custom_1'\]"):
            load_state(accelerator, ckpt)
        assert ckpt.steps() == [1]


def test_a_manager_that_saves_rng_or_data_as_replicated_is_refused(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    prepare(accelerator, _loader(url, s3))
    with CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options(),
                           options=SaveOptions(per_rank={"rng"})) as ckpt:
        with pytest.raises(ConfigError, match=r"saves \['data'\] as replicated state.*SaveOptions\(per_rank="):
            save_state(accelerator, ckpt, 1)
        assert ckpt.steps() == []


def test_save_and_load_take_a_manager_not_a_url(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    prepare(accelerator, _loader(url, s3))
    with pytest.raises(ArgumentError, match=r"take a streamio.CheckpointManager, not str 's3://.*CheckpointManager\(url\)"):
        save_state(accelerator, s3.url("ckpt"), 1)
    with pytest.raises(ArgumentError, match=r"take a streamio.CheckpointManager, not str"):
        load_state(accelerator, s3.url("ckpt"))


def test_a_checkpoint_of_another_dataset_stops_before_the_optimizer_is_loaded(url: str, s3: S3Endpoint) -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer, _ = _parts()
    model, optimizer, loader = prepare(accelerator, model, optimizer, _loader(url, s3))
    with CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options()) as ckpt:
        save_state(accelerator, ckpt, 1)
    make_dataset(s3.url("other"), s3.storage_options(), [3, 3])
    AcceleratorState._reset_state(True)
    accelerator = Accelerator(cpu=True)
    model, optimizer, _ = _parts()
    model, optimizer, loader = prepare(accelerator, model, optimizer, _loader(s3.url("other"), s3))
    with CheckpointManager(s3.url("ckpt"), storage_options=s3.storage_options()) as ckpt:
        with pytest.raises(CheckpointError, match=r"into state entry 'data' failed.*StateMismatchError"):
            load_state(accelerator, ckpt)
    assert optimizer.state_dict()["state"] == {}  # the saved optimizer (one without steps too) was not loaded
    assert loader.state_dict() == _loader(s3.url("other"), s3).state_dict()


def test_a_missing_accelerate_names_the_extra_to_install() -> None:
    with pytest.raises(MissingDependencyError, match=r"needs HF Accelerate \(accelerate_gone cannot be imported") as e:
        require("accelerate_gone")
    assert INSTALL in str(e.value) and isinstance(e.value, ImportError)
