"""The reference DDP training loop: small, readable, and exact on resume.

What it shows, in the order a step runs:

* **Process group**: NCCL on GPUs, gloo on CPUs, with a finite collective timeout so a lost rank
  fails the job instead of hanging it. Without torchrun's environment it runs as one plain process.
* **Data**: a resumable loader (:mod:`streamio.train.data`); batches are copied to the GPU from
  pinned memory with ``non_blocking=True``; time spent waiting for the next batch is the *data stall*.
* **Gradient accumulation**: ``grad_accum`` micro-batches per optimizer step, all but the last
  under ``DDP.no_sync()`` (one all-reduce per optimizer step); the LR scheduler steps once per
  optimizer step, never per micro-batch. bf16 autocast on GPUs (no grad scaler needed for bf16).
* **Validation**: each rank sums loss / correct / count over its share, however many batches that
  is, then ONE ``all_reduce`` of those sums: every rank makes the same collective calls even when
  the validation set does not divide evenly, so no rank waits forever for another.
* **Early stopping** (:class:`~streamio.train.early_stopping.EarlyStopping`) with its patience
  counter and best value in every checkpoint.
* **Checkpoints**: asynchronous every ``ckpt_every`` optimizer steps, automatic resume from
  ``latest.json`` at start. Everything that decides the next loss is in the checkpoint: model,
  optimizer, scheduler, every RNG (:class:`~streamio.state.RNGState`), the data position,
  progress counters and early stopping. So a crashed and resumed run reproduces the uninterrupted
  run's losses and weights bit for bit on CPU.
* **Telemetry**: a log line every ``log_every`` steps (samples/s, data-stall fraction, checkpoint
  blocked ms), one JSON line per step and per validation in ``out_dir/rank-NNNNN.jsonl``, and a
  final :class:`Summary`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from streamio.errors import CheckpointFormatError, CheckpointNotFoundError
from streamio.state import RNGState
from streamio.train.checkpointing import Checkpointer, make_checkpointer
from streamio.train.config import TrainConfig
from streamio.train.data import Batch, TrainData, make_data
from streamio.train.early_stopping import EarlyStopping
from streamio.train.model import make_model

log = logging.getLogger(__name__)

FAIL_EXIT_CODE = 17
"""Exit status of a run crashed on purpose by ``--fail-at-step``."""

Evaluate = Callable[[int], Mapping[str, float]]


# ---------------------------------------------------------------------------- distributed setup
@dataclass(frozen=True)
class Distributed:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    initialized: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(cfg: TrainConfig) -> Distributed:
    """Join the process group torchrun describes (NCCL on CUDA, gloo on CPU), or run alone.

    The collective timeout is finite (``cfg.collective_timeout_s``): a rank that died or diverged
    makes the others fail with a clear error instead of hanging the job forever.
    """
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {cfg.device!r} is not one of auto, cpu, cuda")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"--device cuda, but this torch {torch.__version__} sees no CUDA device: "
            "use --device auto (or cpu), or install a CUDA build of torch"
        )
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        # ranks share the cores: one thread pool each of the right size, no oversubscription
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if "WORLD_SIZE" not in os.environ:
        return Distributed(0, 1, 0, device, initialized=False)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        timeout=datetime.timedelta(seconds=cfg.collective_timeout_s),
        device_id=device if use_cuda else None,
    )
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, device, initialized=True)


def teardown_distributed(d: Distributed) -> None:
    """Leave the process group (the caller then flushes and ``os._exit``s; see ``__main__``)."""
    if d.initialized and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- small stateful pieces
@dataclass
class Progress:
    """Counters that say where training is; saved in every checkpoint."""

    epoch: int = 0
    step: int = 0
    epoch_step: int = 0
    done: bool = False

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, **asdict(self)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != 1:
            raise CheckpointFormatError(f"progress state {dict(state)!r} is not version 1: resume with the trainer that saved it")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.epoch_step, self.done = int(state["epoch_step"]), bool(state["done"])


@dataclass
class Summary:
    """What a run did; returned by :meth:`Trainer.run` and logged by rank 0."""

    resumed_from: int | None = None
    steps: int = 0
    epochs: int = 0
    stopped_early: bool = False
    stop_epoch: int | None = None
    best_val_loss: float | None = None
    best_epoch: int | None = None
    last_val_loss: float | None = None
    patience_counter: int = 0
    wall_s: float = 0.0
    samples_per_s: float = 0.0
    data_stall_fraction: float = 0.0
    ckpt_blocked_ms_total: float = 0.0
    ckpt_blocked_ms_max: float = 0.0
    checkpoints: int = 0


@dataclass
class _Meter:
    """Telemetry over one log interval."""

    start: float = field(default_factory=time.perf_counter)
    samples: int = 0
    stall_s: float = 0.0
    ckpt_ms: float = 0.0

    def line(self, step: int, epoch: int, loss: float, lr: float) -> str:
        wall = max(time.perf_counter() - self.start, 1e-9)
        return (
            f"step {step} epoch {epoch} loss {loss:.4f} lr {lr:.2e} | {self.samples / wall:,.0f} samples/s, "
            f"data stall {100 * self.stall_s / wall:.1f}%, ckpt blocked {self.ckpt_ms:.1f} ms"
        )


class MetricsLog:
    """One JSON object per line in ``out_dir/rank-NNNNN.jsonl``, flushed at every write."""

    def __init__(self, out_dir: str | os.PathLike[str], rank: int) -> None:
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"rank-{rank:05d}.jsonl"
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, **record: Any) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``rank-NNNNN.jsonl`` file (for tests and the demo's comparison)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, cosine decay to 0.1 by ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _hard_exit(step: int) -> None:
    log.warning("--fail-at-step %d: simulating a crash now (no cleanup, no checkpoint wait)", step)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FAIL_EXIT_CODE)


# ---------------------------------------------------------------------------- the trainer
class Trainer:
    """One rank of the reference trainer; ``Trainer(cfg, d).run()``.

    The pieces are injectable so tests can drive them: ``data`` (default :func:`make_data`),
    ``checkpointer`` (default :func:`make_checkpointer` on ``cfg.ckpt_url``), ``evaluate`` (epoch ->
    ``{"val_loss": ...}``; default: the model on the validation set) and ``crash`` (what
    ``--fail-at-step`` calls; default ``os._exit``).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        d: Distributed,
        *,
        data: TrainData | None = None,
        checkpointer: Checkpointer | None = None,
        evaluate: Evaluate | None = None,
        crash: Callable[[int], None] | None = None,
    ) -> None:
        self.cfg, self.d = cfg, d
        cuda = d.device.type == "cuda"
        self.data = data or make_data(cfg, rank=d.rank, world_size=d.world_size, pin_memory=cuda)
        self.ckpt = checkpointer if checkpointer is not None else make_checkpointer(
            cfg.ckpt_url, keep_last=cfg.keep_last, keep_best=cfg.keep_best
        )
        self._evaluate = evaluate or self.validate
        self._crash = crash or _hard_exit
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        net = make_model(hidden=cfg.hidden, dropout=cfg.dropout).to(d.device)
        self.net = net
        self.model: nn.Module = DistributedDataParallel(net, device_ids=[d.local_rank] if cuda else None) if d.initialized else net
        # each rank's own dropout stream, seeded with structure (seed, rank), never seed + rank
        torch.manual_seed(int(np.random.SeedSequence([cfg.seed, d.rank]).generate_state(1)[0]))
        self.optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        steps_per_epoch = len(self.data.train) // cfg.grad_accum  # not resumed yet: a whole epoch
        if steps_per_epoch == 0:
            raise ValueError(
                f"{len(self.data.train)} batches per epoch per rank cannot make one optimizer step of "
                f"{cfg.grad_accum} micro-batches: lower --grad-accum or --batch-size, or add data"
            )
        self.total_steps = min(cfg.max_steps or 1 << 62, steps_per_epoch * cfg.epochs)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_cosine(cfg.warmup_steps, self.total_steps))
        self.rng = RNGState(seed=cfg.seed)
        self.progress = Progress()
        self.early = EarlyStopping(cfg.patience, min_delta=cfg.min_delta)
        self.metrics = MetricsLog(cfg.out_dir, d.rank)
        self.summary = Summary()
        self._last_saved = -1

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint holds, by name (all stateful objects)."""
        return {
            "model": self.net,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "rng": self.rng,
            "data": self.data.train,
            "progress": self.progress,
            "early_stopping": self.early,
        }

    # ------------------------------------------------------------------ resume / save
    def resume(self) -> int | None:
        """Restore the latest checkpoint if there is one; return its step."""
        if self.ckpt is None:
            return None
        try:
            step = self.ckpt.restore(self.state())
        except CheckpointNotFoundError:
            log.info("no checkpoint under %s: starting from step 0", self.cfg.ckpt_url)
            return None
        self._last_saved = step
        if self.d.is_main:
            log.info("resumed from %s at step %d (epoch %d)", self.cfg.ckpt_url, step, self.progress.epoch)
        self.metrics.write(event="resume", step=step, epoch=self.progress.epoch)
        return step

    def save(self, meter: _Meter | None = None, metrics: Mapping[str, float] | None = None) -> None:
        """Checkpoint the current step asynchronously (the loop blocks only for the snapshot).

        ``metrics`` (``val_loss``) is given only right after a validation of exactly these
        weights, so that keep-best retention compares like with like.
        """
        if self.ckpt is None or self._last_saved == self.progress.step:
            return
        start = time.perf_counter()
        self.ckpt.save(self.progress.step, self.state(), metrics=metrics)
        blocked_ms = 1000 * (time.perf_counter() - start)
        self._last_saved = self.progress.step
        self.summary.checkpoints += 1
        self.summary.ckpt_blocked_ms_total += blocked_ms
        self.summary.ckpt_blocked_ms_max = max(self.summary.ckpt_blocked_ms_max, blocked_ms)
        if meter is not None:
            meter.ckpt_ms += blocked_ms

    # ------------------------------------------------------------------ one optimizer step
    def _to_device(self, batch: Batch) -> Batch:
        x, y = batch
        return x.to(self.d.device, non_blocking=True), y.to(self.d.device, non_blocking=True)

    def train_step(self, batches: Iterator[Batch], meter: _Meter) -> torch.Tensor:
        """``grad_accum`` micro-batches, then one optimizer and one scheduler step; the mean loss."""
        self.model.train()
        losses = []
        accum = self.cfg.grad_accum
        for micro in range(accum):
            t0 = time.perf_counter()
            x, y = self._to_device(next(batches))
            meter.stall_s += time.perf_counter() - t0
            meter.samples += len(y) * self.d.world_size
            last = micro == accum - 1
            sync = contextlib.nullcontext() if last or not self.d.initialized else self.model.no_sync()
            with sync:
                with self.autocast:
                    loss = F.cross_entropy(self.model(x).float(), y)
                (loss / accum).backward()
            losses.append(loss.detach())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return torch.stack(losses).mean()

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self, epoch: int) -> dict[str, float]:
        """Loss and accuracy over the whole validation set, identical on every rank.

        Each rank sums over its own batches (their number may differ between ranks), then one
        ``all_reduce`` of ``[loss sum, correct, count]``: the same collective calls on every rank.
        The forward pass uses the bare module, so it makes no collective call either.
        """
        self.net.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.d.device)
        for batch in self.data.val:
            x, y = self._to_device(batch)
            with self.autocast:
                logits = self.net(x).float()
            totals[0] += F.cross_entropy(logits, y, reduction="sum").double()
            totals[1] += (logits.argmax(dim=1) == y).sum().double()
            totals[2] += len(y)
        if self.d.initialized:
            dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()
        return {"val_loss": loss_sum / max(count, 1), "val_accuracy": correct / max(count, 1), "val_count": count}

    # ------------------------------------------------------------------ the run
    def run(self) -> Summary:
        """Resume if possible, train until done (epochs, max steps or early stop), return the summary."""
        cfg, p = self.cfg, self.progress
        started = time.perf_counter()
        if self.d.is_main:
            log.info(
                "data: %s; %d rank(s) on %s; %d optimizer steps per epoch of %d micro-batches of %d",
                self.data.source, self.d.world_size, self.d.device, len(self.data.train) // cfg.grad_accum,
                cfg.grad_accum, cfg.batch_size,
            )
        self.summary.resumed_from = self.resume()
        first_step = p.step
        stall_total = 0.0
        meter = _Meter()
        while not p.done and not self.early.should_stop and p.epoch < cfg.epochs and not self._max_steps_reached():
            self.data.train.set_epoch(p.epoch)
            # len() is what is left of the epoch: all of it, or the rest after a resume
            epoch_steps = p.epoch_step + len(self.data.train) // cfg.grad_accum
            batches = iter(self.data.train)
            while p.epoch_step < epoch_steps and not self._max_steps_reached():
                lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
                loss = self.train_step(batches, meter)
                p.step += 1
                p.epoch_step += 1
                loss_value = loss.item()
                self.metrics.write(event="step", step=p.step, epoch=p.epoch, loss=loss_value, lr=lr)
                if self._save_due() and p.epoch_step < epoch_steps:
                    self.save(meter)  # an epoch's last step is saved after its validation, below
                if p.step == cfg.fail_at_step:
                    self._crash(p.step)
                if cfg.log_every and p.step % cfg.log_every == 0:
                    if self.d.is_main:
                        log.info("%s", meter.line(p.step, p.epoch, loss_value, lr))
                    stall_total += meter.stall_s
                    meter = _Meter()
            del batches  # shuts this epoch's workers down
            if p.epoch_step < epoch_steps:
                break  # max_steps ended training inside the epoch: no validation of a partial epoch
            result = self._evaluate(p.epoch)
            stop = self.early.update(p.epoch, float(result["val_loss"]))
            self.metrics.write(event="val", epoch=p.epoch, step=p.step, counter=self.early.counter, stop=stop, **result)
            if self.d.is_main:
                log.info(
                    "epoch %d: %s | best %.4f (epoch %s), patience %d/%d",
                    p.epoch, ", ".join(f"{k} {v:.4f}" for k, v in result.items()), self.early.best,
                    self.early.best_epoch, self.early.counter, cfg.patience,
                )
            p.epoch, p.epoch_step = p.epoch + 1, 0
            if self._save_due() or self.early.best_epoch == p.epoch - 1:
                self.save(meter, metrics={"val_loss": float(result["val_loss"])})
            if stop:
                if self.d.is_main:
                    log.info("early stopping after epoch %d: no improvement for %d epochs", p.epoch - 1, self.early.counter)
                break
        p.done = True
        just_validated = self.early.last is not None and p.epoch_step == 0
        self.save(metrics={"val_loss": self.early.last} if just_validated else None)
        if self.ckpt is not None:
            self.ckpt.wait()
        stall_total += meter.stall_s
        return self._finish(started, first_step, stall_total)

    def _save_due(self) -> bool:
        return bool(self.cfg.ckpt_every) and self.progress.step % self.cfg.ckpt_every == 0

    def _max_steps_reached(self) -> bool:
        return bool(self.cfg.max_steps) and self.progress.step >= self.cfg.max_steps

    def _finish(self, started: float, first_step: int, stall_s: float) -> Summary:
        s, p = self.summary, self.progress
        s.wall_s = time.perf_counter() - started
        s.steps, s.epochs = p.step, p.epoch
        s.stopped_early, s.stop_epoch = self.early.should_stop, self.early.stopped_epoch
        s.best_val_loss, s.best_epoch = self.early.best, self.early.best_epoch
        s.last_val_loss, s.patience_counter = self.early.last, self.early.counter
        samples = (p.step - first_step) * self.cfg.batch_size * self.cfg.grad_accum * self.d.world_size
        s.samples_per_s = samples / max(s.wall_s, 1e-9)
        s.data_stall_fraction = stall_s / max(s.wall_s, 1e-9)
        self.metrics.write(event="summary", **asdict(s))
        if self.d.is_main:
            torch.save(self.net.state_dict(), Path(self.cfg.out_dir) / "final_model.pt")
            log.info("summary: %s", json.dumps(asdict(s)))
        return s

    def close(self) -> None:
        """Finish the checkpoint in flight and close the metrics file."""
        if self.ckpt is not None:
            self.ckpt.close()
        self.metrics.close()
