"""The trainer's pieces, in process (one rank, no process group): fast tests of the loop's contracts."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from streamio.checkpoint.root import read_pointer
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import CheckpointError, ConfigError, StateMismatchError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from streamio.train.checkpointing import EarlyStopping, retention_policy
from streamio.train.config import TrainConfig, parse_args
from streamio.train.data import AugmentedArrays, InMemoryLoader, iter_samples, make_arrays
from streamio.train.distributed import Distributed, setup_distributed
from streamio.train.loop import Trainer
from streamio.train.model import warmup_cosine
from streamio.train.telemetry import EpochMeter, Meter, StoreTotals, read_metrics

ONE = Distributed(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), initialized=False)
SCRIPT = [10.0, 8.0, 6.0] + [6.5] * 20  # the scripted validation losses


class Crash(Exception):
    """What --fail-at-step does in these tests instead of os._exit."""


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """A tiny model on a shared 2-core machine: one intra-op thread is ~30x faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _crash(step: int) -> None:
    raise Crash(step)


def _scripted(epoch: int) -> Mapping[str, float]:
    return {"val_loss": SCRIPT[epoch]}


def _cfg(tmp_path: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(
        out_dir=str(tmp_path / "out"), train_samples=256, val_samples=37, batch_size=16, grad_accum=2,
        num_workers=0, hidden=32, epochs=20, log_every=0, ckpt_every=0, warmup_steps=2,
    )
    return TrainConfig(**{**base, **kw})


# ---------------------------------------------------------------------------- early stopping
def test_early_stopping_stops_at_epoch_7_on_the_scripted_losses() -> None:
    es = EarlyStopping(patience=5)
    stops = [es.update(epoch, loss) for epoch, loss in enumerate(SCRIPT[:8])]
    assert stops == [False] * 7 + [True]
    assert (es.best, es.best_epoch, es.counter, es.stopped_epoch) == (6.0, 2, 5, 7)


def test_early_stopping_min_delta_max_mode_and_state_roundtrip() -> None:
    es = EarlyStopping(patience=2, mode="max", min_delta=0.1)
    assert not es.update(0, 0.5)
    assert not es.update(1, 0.55)  # +0.05 < min_delta: no improvement
    assert es.update(2, 0.9) is False and es.counter == 0
    restored = EarlyStopping(patience=2, mode="max", min_delta=0.1)
    restored.load_state_dict(es.state_dict())
    assert restored.state_dict() == es.state_dict()
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(patience=1).load_state_dict(es.state_dict())


def test_trainer_stops_at_epoch_7_and_a_run_crashed_after_epoch_4_does_too(tmp_path: Path) -> None:
    ref_cfg = _cfg(tmp_path / "ref", ckpt_url=str(tmp_path / "ref-ckpt"), keep_last=1, keep_best=1)
    ref = Trainer(ref_cfg, ONE, evaluate=_scripted)
    steps_per_epoch = len(ref.data.train) // 2
    summary = ref.run()
    ref.close()
    assert (summary.stop_epoch, summary.patience_counter, summary.best_val_loss, summary.best_epoch) == (7, 5, 6.0, 2)
    # keep-best kept the checkpoint taken right after the best validation (end of epoch 2), keep-last the final one
    assert ref.ckpt.steps() == [3 * steps_per_epoch, 8 * steps_per_epoch]  # type: ignore[union-attr]

    # crash at the first step of epoch 5, i.e. right after epoch 4's validation
    cfg = _cfg(
        tmp_path / "run", ckpt_url=str(tmp_path / "ckpt"), ckpt_every=steps_per_epoch,
        fail_at_step=5 * steps_per_epoch + 1,
    )
    crashed = Trainer(cfg, ONE, evaluate=_scripted, crash=_crash)
    with pytest.raises(Crash):
        crashed.run()
    crashed.close()
    assert crashed.early.counter == 2 and crashed.progress.epoch == 5

    cfg = dataclasses.replace(cfg, fail_at_step=0)
    resumed = Trainer(cfg, ONE, evaluate=_scripted)
    summary = resumed.run()
    resumed.close()
    assert summary.resumed_from == 5 * steps_per_epoch
    assert (summary.stop_epoch, summary.patience_counter, summary.best_val_loss) == (7, 5, 6.0)
    vals = [r["epoch"] for r in read_metrics(Path(cfg.out_dir) / "rank-00000.jsonl") if r["event"] == "val"]
    assert vals == [0, 1, 2, 3, 4, 5, 6, 7]  # epochs 0-4 before the crash, 5-7 after: none twice, none lost

    # a finished run restarted on the same root does nothing more
    again = Trainer(cfg, ONE, evaluate=_scripted)
    summary = again.run()
    again.close()
    assert summary.resumed_from == summary.steps and summary.stop_epoch == 7


# ---------------------------------------------------------------------------- the loop on real data
def test_loss_falls_and_validation_counts_every_sample(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path, train_samples=1024, epochs=3, lr=3e-3)
    trainer = Trainer(cfg, ONE)
    with caplog.at_level(logging.INFO, logger="streamio.train.loop"):
        summary = trainer.run()
    trainer.close()
    # one summary line per epoch; its data-wait shares add up to the run's stall (the same clock)
    lines = [re.search(r"^epoch (\d+) done in ([\d.]+) s \| data wait ([\d.]+)%, ckpt blocked ([\d.]+)%", m)
             for m in caplog.messages if " done in " in m]
    assert [int(m.group(1)) for m in lines if m] == [0, 1, 2]
    waited = sum(float(m.group(2)) * float(m.group(3)) / 100 for m in lines if m)
    assert waited == pytest.approx(summary.data_stall_fraction * summary.wall_s, abs=0.02 + 0.002 * summary.wall_s)
    records = read_metrics(Path(cfg.out_dir) / "rank-00000.jsonl")
    losses = [r["loss"] for r in records if r["event"] == "step"]
    assert len(losses) == summary.steps == 3 * (1024 // 16 // 2)
    assert np.mean(losses[-8:]) < 0.6 * np.mean(losses[:4])
    assert math.isclose(np.mean(losses[:2]), math.log(8), rel_tol=0.2)
    vals = [r for r in records if r["event"] == "val"]
    assert [v["val_count"] for v in vals] == [37.0] * 3
    assert torch.load(Path(cfg.out_dir) / "final_model.pt", weights_only=True).keys() == trainer.net.state_dict().keys()


def test_epoch_line_reports_the_epoch_s_shares_and_store_traffic_from_snapshot_deltas() -> None:
    def snap(read: float, written: float, requests: dict[str, float]) -> dict[str, Any]:
        return {"streamio_store_bytes_read_total": read, "streamio_store_bytes_written_total": written,
                "streamio_store_requests_total": requests}

    before = StoreTotals.of(snap(1e6, 0.0, {'op="get",outcome="ok"': 10.0}))
    after = StoreTotals.of(snap(13.5e6, 2e6, {
        'op="get",outcome="ok"': 40.0, 'op="get",outcome="throttled"': 3.0, 'op="put",outcome="ok"': 5.0,
        'op="get",outcome="retried"': 1.0, 'op="put",outcome="failed"': 1.0,
    }))
    meter = EpochMeter(lambda: (2.0, 100.0))
    meter.begin()
    meter.start -= 10.0  # the epoch took 10 s
    meter.store = before
    line = meter.line(4, stall_s=3.0, ckpt_ms=600.0, store=after)
    assert re.fullmatch(r"epoch 4 done in 10\.\d\d s \| data wait 10\.0%, ckpt blocked 5\.0% \| store 12\.50 MB read, "
                        r"2\.00 MB written, 40 requests \(3 throttled, 1 failed\)", line), line
    assert StoreTotals.of({}) == StoreTotals()  # a snapshot without store metrics: nothing moved


class _CountingDDP(torch.nn.Module):
    """Stands in for DistributedDataParallel: counts the micro-batches run under no_sync()."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module, self.in_no_sync, self.synced_forwards = module, False, 0
        self.no_sync_forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_no_sync:
            self.no_sync_forwards += 1
        else:
            self.synced_forwards += 1
        return self.module(x)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.in_no_sync = True
        try:
            yield
        finally:
            self.in_no_sync = False


def test_accumulation_syncs_gradients_only_on_the_last_micro_batch(tmp_path: Path) -> None:
    trainer = Trainer(_cfg(tmp_path, grad_accum=4), ONE)
    counting = _CountingDDP(trainer.net)
    trainer.model, trainer.d = counting, dataclasses.replace(ONE, initialized=True)
    batches = iter(trainer.data.train)
    for _ in range(3):
        trainer.train_step(batches, Meter())
    trainer.close()
    assert (counting.no_sync_forwards, counting.synced_forwards) == (9, 3)
    assert trainer.scheduler.last_epoch == 3


def test_scheduler_steps_once_per_optimizer_step_not_per_micro_batch(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, grad_accum=4, max_steps=3)
    trainer = Trainer(cfg, ONE)
    trainer.run()
    trainer.close()
    assert trainer.scheduler.last_epoch == 3
    assert trainer.optimizer.state_dict()["state"][0]["step"].item() == 3


def test_in_process_resume_matches_uninterrupted_on_s3(
    tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data (StreamingDataset) and checkpoints through real HTTP (moto): crash mid-epoch (batches made on
    loader threads), resume without them, identical weights and losses. (DataLoader workers: see test_train_ddp.py.)"""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    common: dict[str, Any] = dict(train_samples=512, epochs=2, ckpt_every=3, keep_last=1, keep_best=0)
    for split, n in (("train", 512), ("val", 37)):
        write_dataset(
            iter_samples(n, split=split), s3.url(f"data/{split}"), s3.storage_options(),
            spec=ShardSpec(max_count=150, prefix=split),
        )
    common.update(data_url=s3.url("data"))
    ref = Trainer(_cfg(tmp_path / "ref", **common), ONE)
    ref.run()
    ref.close()
    # the crashed run makes its batches on 2 threads, the reference and the resumed run without: the same batches
    cfg = _cfg(tmp_path / "run", ckpt_url=s3.url("ckpt"), fail_at_step=10, loader_threads=2, **common)
    crashed = Trainer(cfg, ONE, crash=_crash)
    with pytest.raises(Crash):
        crashed.run()
    crashed.close()
    cfg = dataclasses.replace(cfg, fail_at_step=0, loader_threads=0)
    resumed = Trainer(cfg, ONE)
    summary = resumed.run()
    resumed.close()
    assert summary.resumed_from == 9
    for name, tensor in ref.net.state_dict().items():
        assert torch.equal(tensor, resumed.net.state_dict()[name]), name
    ref_metrics = read_metrics(tmp_path / "ref" / "out" / "rank-00000.jsonl")
    ref_losses = {r["step"]: r["loss"] for r in ref_metrics if r["event"] == "step"}
    got = [r for r in read_metrics(Path(cfg.out_dir) / "rank-00000.jsonl") if r["event"] == "step"]
    assert len(got) == 10 + (summary.steps - 9)
    assert all(ref_losses[r["step"]] == r["loss"] for r in got)
    # retention kept the newest complete checkpoint only (keep_last=1, keep_best=0)
    assert resumed.ckpt.steps() == [summary.steps]  # type: ignore[union-attr]


def test_a_run_with_a_local_tier_resumes_from_its_newer_local_copy_and_ends_durable(
    tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--local-ckpt DIR --durable-every 3: saves at steps 3, 6, 8 (the end of epoch 0, validated) and
    9; the root has 8 when step 10 crashes, the local tier 9; the resume starts from 9, exactly,
    and the run's last save is durable."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    common: dict[str, Any] = dict(epochs=2, ckpt_every=3, keep_last=2, keep_best=0)
    ref = Trainer(_cfg(tmp_path / "ref", **common), ONE)
    ref.run()
    ref.close()
    cfg = _cfg(tmp_path / "run", ckpt_url=s3.url("ckpt"), local_ckpt=str(tmp_path / "nvme"), durable_every=3,
               fail_at_step=10, **common)
    crashed = Trainer(cfg, ONE, crash=_crash)
    with pytest.raises(Crash):
        crashed.run()
    crashed.close()
    assert read_pointer(Store(s3.url("ckpt"), s3.storage_options())).step == 8  # type: ignore[union-attr]
    resumed = Trainer(dataclasses.replace(cfg, fail_at_step=0), ONE)
    summary = resumed.run()
    resumed.close()
    assert summary.resumed_from == 9
    for name, tensor in ref.net.state_dict().items():
        assert torch.equal(tensor, resumed.net.state_dict()[name]), name
    assert read_pointer(Store(s3.url("ckpt"), s3.storage_options())).step == summary.steps  # type: ignore[union-attr]


def test_local_tier_flags_need_their_partners(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = parse_args(["--ckpt-url", "s3://b/c", "--local-ckpt", "/nvme/x", "--durable-every", "10"])
    assert (cfg.local_ckpt, cfg.durable_every) == ("/nvme/x", 10)
    assert (parse_args(["--loader-threads", "4"]).loader_threads, parse_args([]).loader_threads) == (4, 0)
    for argv, words in [(["--local-ckpt", "/nvme/x"], "--local-ckpt needs --ckpt-url"),
                        (["--ckpt-url", "s3://b/c", "--durable-every", "3"], "--durable-every needs --local-ckpt"),
                        (["--loader-threads", "-1"], "--loader-threads -1: give the threads")]:
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2 and words in capsys.readouterr().err, argv


# ---------------------------------------------------------------------------- data and checkpoint pieces
def test_in_memory_loader_resumes_exactly_with_workers() -> None:
    x, y = make_arrays(200, seed=1)

    def loader(rank: int) -> InMemoryLoader:
        return InMemoryLoader(
            AugmentedArrays(x, y, seed=1, noise=0.1), batch_size=8, rank=rank, world_size=2, seed=1, num_workers=2
        )

    full = loader(0)
    full.set_epoch(3)
    assert len(full) == 12
    everything = [b[0] for b in full]
    assert len(full) == 0  # len() is what is left of the epoch
    part = loader(0)
    part.set_epoch(3)
    it = iter(part)
    head = [next(it)[0] for _ in range(5)]
    state = part.state_dict()
    del it
    rest = loader(0)
    rest.load_state_dict(state)
    rest.set_epoch(3)
    assert len(rest) == 7
    tail = [b[0] for b in rest]
    assert len(everything) == 12 and len(head) + len(tail) == 12 and len(rest) == 0
    assert all(torch.equal(a, b) for a, b in zip(everything, head + tail, strict=False))
    # the other rank's samples are disjoint; another epoch is another order
    other = loader(1)
    other.set_epoch(3)
    assert not any(torch.equal(a, b) for a, b in zip(everything, (b[0] for b in other), strict=False))
    with pytest.raises(StateMismatchError, match="same data, seed and batch size"):
        InMemoryLoader(AugmentedArrays(x, y, seed=2, noise=0.1), batch_size=8, rank=0, world_size=2, seed=2
                       ).load_state_dict(state)


def test_in_memory_loader_resumes_on_another_world_size_with_the_rest_of_the_epoch() -> None:
    """2 ranks take 3 batches each; 3 ranks then deal the rest of the epoch's order: nothing twice."""
    x, y = make_arrays(203, seed=1)
    y = torch.arange(203).numpy()  # labels = sample indices, to see which samples were served

    def loader(rank: int, world: int) -> InMemoryLoader:
        return InMemoryLoader(AugmentedArrays(x, y, seed=1, noise=0.0), batch_size=8, rank=rank, world_size=world,
                              seed=1)

    two = [loader(r, 2) for r in (0, 1)]
    seen: list[int] = []
    for ld in two:
        ld.set_epoch(1)
        it = iter(ld)
        seen += [int(i) for _ in range(3) for i in next(it)[1]]
    state = two[0].state_dict()
    assert state == {**two[1].state_dict()} and state["start"] == 0 and state["batches"] == 3
    three = [loader(r, 3) for r in range(3)]
    for ld in three:
        ld.load_state_dict(state)
        ld.set_epoch(1)  # the epoch the state is in: a no-op
    assert [len(ld) for ld in three] == [(203 - 48) // 3 // 8] * 3 == [6] * 3
    rest = [int(i) for ld in three for b in ld for i in b[1]]
    assert len(rest) == 3 * 6 * 8 and not set(rest) & set(seen) and len(set(rest)) == len(rest)
    order = np.random.default_rng([1, 1]).permutation(203)
    assert set(seen) == set(order[:48].tolist()) and set(rest) <= set(order[48:].tolist())
    again = three[0].state_dict()
    assert (again["start"], again["batches"], again["world_size"]) == (48, 6, 3)
    three[0].set_epoch(2)
    assert three[0].state_dict()["start"] == 0 and len(three[0]) == 203 // 3 // 8  # the next epoch is whole


def test_retention_policy_keeps_last_and_best() -> None:
    from streamio.checkpoint import KeepBest, KeepLast

    assert retention_policy(2, 0) == KeepLast(2)
    assert KeepBest("val_loss", mode="min", k=1) in retention_policy(3, 1).policies  # type: ignore[attr-defined]


def test_config_flags_and_lr_schedule() -> None:
    cfg = parse_args(["--ckpt-url", "s3://b/c", "--grad-accum", "4", "--lr", "0.5", "--fail-at-step", "7"])
    assert (cfg.ckpt_url, cfg.grad_accum, cfg.lr, cfg.fail_at_step, cfg.data_url) == ("s3://b/c", 4, 0.5, 7, None)
    f = warmup_cosine(4, 20)
    assert [f(0), f(3)] == [0.25, 1.0] and math.isclose(f(20), 0.1) and f(10) < 1.0


def test_several_data_urls_with_weights_make_a_mixture() -> None:
    from streamio.train.config import data_sources

    cfg = parse_args(["--data-url", "s3://b/web:0.7", "--data-url", "gs://b/code:0.3", "--data-url", "/d/x/"])
    assert cfg.data_url == ("s3://b/web:0.7", "gs://b/code:0.3", "/d/x/")
    assert data_sources(cfg.data_url) == [("s3://b/web", 0.7), ("gs://b/code", 0.3), ("/d/x", None)]
    assert parse_args(["--data-url", "s3://b/one"]).data_url == "s3://b/one"
    assert data_sources("s3://b/one") == [("s3://b/one", None)]
    with pytest.raises(ValueError, match="must be a number > 0"):
        data_sources(("s3://b/web:-1",))


def test_synthetic_data_is_deterministic_and_samples_match_arrays() -> None:
    x, y = make_arrays(5, seed=3)
    x2, y2 = make_arrays(5, seed=3)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(make_arrays(5, seed=3, split="val")[0], x)
    first = next(iter_samples(5, seed=3))
    assert first["__key__"] == "train-0000000" and int(first["cls"]) == y[0]  # type: ignore[call-overload]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_cuda_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        setup_distributed(TrainConfig(device="cuda"))
    with pytest.raises(ValueError, match="not one of"):
        setup_distributed(TrainConfig(device="tpu"))


def test_single_process_setup_needs_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    before = torch.get_num_threads()
    try:
        d = setup_distributed(TrainConfig(device="cpu"))
    finally:
        torch.set_num_threads(before)
    assert (d.rank, d.world_size, d.initialized, d.device.type) == (0, 1, False, "cpu")


# ---------------------------------------------------------------------------- --fsdp (one process)
def test_fsdp_flag_and_validation_batches_in_lockstep() -> None:
    from streamio.train.data import _val_batches

    assert parse_args(["--fsdp"]).fsdp is True and parse_args([]).fsdp is False
    x, y = make_arrays(129, split="val")
    shares = [_val_batches(x, y, rank=r, world_size=2, batch_size=64, lockstep=True) for r in (0, 1)]
    assert [[len(b[1]) for b in s] for s in shares] == [[64, 1], [64, 0]]  # rank 1 ends with an empty batch
    assert shares[1][1][0].shape == (0, x.shape[1])
    assert len(_val_batches(x, y, rank=1, world_size=2, batch_size=64)) == 1  # without: as before
    one = [_val_batches(x[:1], y[:1], rank=r, world_size=2, batch_size=64, lockstep=True) for r in (0, 1)]
    assert [[len(b[1]) for b in s] for s in one] == [[1], [0]]  # a rank with no sample still joins


def test_fsdp_without_a_process_group_keeps_the_model_plain_and_checkpoints_it_as_app(tmp_path: Path) -> None:
    from streamio.checkpoint import ShardedModelState

    cfg = _cfg(tmp_path, fsdp=True, ckpt_url=str(tmp_path / "ckpt"), max_steps=4, ckpt_every=2, epochs=1)
    trainer = Trainer(cfg, ONE)
    state = trainer.state()
    assert not trainer.sharded and trainer.model is trainer.net and type(trainer.net) is torch.nn.Sequential
    assert isinstance(state["app"], ShardedModelState) and "model" not in state and "optimizer" not in state
    trainer.run()
    trainer.close()
    weights = torch.load(tmp_path / "out" / "final_model.pt", weights_only=True)
    assert all(torch.equal(v, trainer.net.state_dict()[k]) for k, v in weights.items())
    again = Trainer(cfg, ONE)
    try:
        assert again.resume() == 4
        assert all(torch.equal(p, q) for p, q in zip(again.net.parameters(), trainer.net.parameters(), strict=True))
    finally:
        again.close()
    # a run resumes in the mode that saved it: DDP-style entries are not in an --fsdp checkpoint
    ddp = Trainer(dataclasses.replace(cfg, fsdp=False), ONE)
    try:
        with pytest.raises(CheckpointError, match="has no \\['model', 'optimizer'\\]"):
            ddp.resume()
    finally:
        ddp.close()
