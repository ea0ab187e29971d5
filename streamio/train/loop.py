"""The reference DDP / FSDP2 training loop: small, readable, and exact on resume.

What it shows, in the order a step runs:

* **Process group** (:mod:`~streamio.train.distributed`): NCCL on GPUs, gloo on CPUs, with a
  finite collective timeout so a lost rank fails the job instead of hanging it. Without torchrun's
  environment it runs as one plain process.
* **Model, optimizer, schedule** (:mod:`~streamio.train.model`): the same initial weights on
  every rank, each rank's own dropout stream, warmup then cosine decay. DDP by default; with
  ``--fsdp`` the model and optimizer state are sharded over the ranks with FSDP2 and checkpointed
  shard by shard (:mod:`~streamio.train.distributed` lists what that changes here).
* **Data**: a resumable loader (:mod:`streamio.train.data`); batches are copied to the GPU from
  pinned memory with ``non_blocking=True``; time spent waiting for the next batch is the *data stall*.
* **Gradient accumulation**: ``grad_accum`` micro-batches per optimizer step, all but the last
  under ``DDP.no_sync()`` (one all-reduce per optimizer step); the LR scheduler steps once per
  optimizer step, never per micro-batch. bf16 autocast on GPUs (no grad scaler needed for bf16).
* **Validation** (:func:`validate`): each rank sums loss / correct / count over its share, however
  many batches that is, then ONE ``all_reduce`` of those sums: every rank makes the same collective
  calls even when the validation set does not divide evenly, so no rank waits forever for another,
  and every rank gets the same result. The forward pass uses the bare module (not its DDP
  wrapper), so it makes no collective call either.
* **Early stopping** (:class:`~streamio.train.checkpointing.EarlyStopping`) with its patience
  counter and best value in every checkpoint.
* **Checkpoints** (:mod:`~streamio.train.checkpointing`): asynchronous every ``ckpt_every``
  optimizer steps, automatic resume from ``latest.json`` at start. Everything that decides the
  next loss is in the checkpoint: model, optimizer, scheduler, every RNG
  (:class:`~streamio.checkpoint.rng.RNGState`), the data position, progress counters and early
  stopping. So a crashed and resumed run reproduces the uninterrupted run's losses and weights bit
  for bit on CPU.
* **Telemetry** (:mod:`~streamio.train.telemetry`): a log line every ``log_every`` steps
  (samples/s, data-stall fraction, checkpoint blocked ms), a line per epoch (data wait and checkpoint
  blocked shares, store bytes and requests), one JSON line per step and per
  validation in ``out_dir/rank-NNNNN.jsonl``, and a final :class:`~streamio.train.telemetry.Summary`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from streamio.checkpoint.rng import RNGState
from streamio.errors import CheckpointNotFoundError
from streamio.preemption import Preemption
from streamio.train.checkpointing import Checkpointer, EarlyStopping, Progress, make_checkpointer
from streamio.train.config import TrainConfig
from streamio.train.data import Batch, TrainData, make_data
from streamio.train.distributed import Distributed, full_weights, model_state
from streamio.train.model import build_components
from streamio.train.telemetry import EpochMeter, Meter, MetricsLog, Summary

log = logging.getLogger(__name__)

FAIL_EXIT_CODE = 17
"""Exit status of a run crashed on purpose by ``--fail-at-step``."""

Evaluate = Callable[[int], Mapping[str, float]]


def to_device(batch: Batch, device: torch.device) -> Batch:
    """``(x, y)`` on ``device``, copied asynchronously (from pinned memory on GPUs)."""
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@torch.no_grad()
def validate(
    net: nn.Module, batches: Iterable[Batch], d: Distributed, autocast: contextlib.AbstractContextManager[Any]
) -> dict[str, float]:
    """``val_loss``, ``val_accuracy`` and ``val_count`` over every rank's ``batches``, identical on every rank."""
    net.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=d.device)
    for batch in batches:
        x, y = to_device(batch, d.device)
        with autocast:
            logits = net(x).float()
        totals[0] += F.cross_entropy(logits, y, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == y).sum().double()
        totals[2] += len(y)
    if d.initialized:
        dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return {"val_loss": loss_sum / max(count, 1), "val_accuracy": correct / max(count, 1), "val_count": count}


def _hard_exit(step: int) -> None:
    log.warning("--fail-at-step %d: simulating a crash now (no cleanup, no checkpoint wait)", step)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FAIL_EXIT_CODE)


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
        self.stop = Preemption(grace_s=cfg.grace_s) if cfg.preemption else None  # before the loaders' workers
        init = None if self.stop is None else self.stop.worker_init_fn
        self.data = data or make_data(cfg, rank=d.rank, world_size=d.world_size, pin_memory=cuda, worker_init_fn=init)
        self.ckpt = checkpointer if checkpointer is not None else make_checkpointer(
            cfg.ckpt_url, keep_last=cfg.keep_last, keep_best=cfg.keep_best, local_dir=cfg.local_ckpt,
            durable_every=cfg.durable_every,
        )
        self._evaluate = evaluate or self.validate
        self._crash = crash or _hard_exit
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
        parts = build_components(cfg, d, len(self.data.train))  # not resumed yet: a whole epoch
        self.net, self.model, self.sharded = parts.net, parts.model, parts.sharded
        self.optimizer, self.scheduler, self.total_steps = parts.optimizer, parts.scheduler, parts.total_steps
        self.rng = RNGState(seed=cfg.seed)
        self.progress = Progress()
        self.early = EarlyStopping(cfg.patience, min_delta=cfg.min_delta)
        self.metrics = MetricsLog(cfg.out_dir, d.rank)
        self.summary = Summary()
        self._last_saved = -1
        self._meter = Meter()  # the current log interval
        self._stall_s = 0.0  # data stall of the log intervals before it
        self._epoch = EpochMeter(lambda: (self._stall_s + self._meter.stall_s, self.summary.ckpt_blocked_ms_total))

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint holds, by name (all stateful objects).

        With ``--fsdp`` the model and optimizer are one ``"app"`` entry
        (:func:`streamio.train.distributed.model_state`).
        """
        model = model_state(self.net, self.optimizer) if self.cfg.fsdp else {
            "model": self.net, "optimizer": self.optimizer,
        }
        return {
            **model,
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

    def save(
        self, meter: Meter | None = None, metrics: Mapping[str, float] | None = None, *, durable: bool = False
    ) -> None:
        """Checkpoint the current step asynchronously (the loop blocks only for the snapshot).

        ``metrics`` (``val_loss``) is given only right after a validation of exactly these
        weights, so that keep-best retention compares like with like. With a local tier, the
        run's last checkpoint (and a preemption save: ``durable=True``) is made durable whatever
        ``durable_every`` says.
        """
        if self.ckpt is None or self._last_saved == self.progress.step:
            return
        start = time.perf_counter()
        last = {"durable": True} if durable or not self._epochs_left() else {}
        self.ckpt.save(self.progress.step, self.state(), metrics=metrics, **last)
        blocked_ms = self.summary.saved(1000 * (time.perf_counter() - start))
        self._last_saved = self.progress.step
        if meter is not None:
            meter.ckpt_ms += blocked_ms

    # ------------------------------------------------------------------ one optimizer step
    def train_step(self, batches: Iterator[Batch], meter: Meter) -> torch.Tensor:
        """``grad_accum`` micro-batches, then one optimizer and one scheduler step; the mean loss."""
        self.model.train()
        losses = []
        accum = self.cfg.grad_accum
        for micro in range(accum):
            t0 = time.perf_counter()
            x, y = to_device(next(batches), self.d.device)
            meter.stall_s += time.perf_counter() - t0
            meter.samples += len(y) * self.d.world_size
            last = micro == accum - 1
            # DDP: one all-reduce per optimizer step; FSDP reduce-scatters each micro-batch (streamio.train.distributed)
            no_sync = self.d.initialized and not self.sharded and not last
            sync = self.model.no_sync() if no_sync else contextlib.nullcontext()
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
    def validate(self, epoch: int) -> dict[str, float]:
        """Loss and accuracy over the whole validation set, identical on every rank.

        Each rank sums over its own batches, then one ``all_reduce`` of the sums (see
        :func:`validate`). ``epoch`` names the epoch just trained, for an
        injected ``evaluate`` that needs it; this default does not.
        """
        return validate(self.net, self.data.val, self.d, self.autocast)

    # ------------------------------------------------------------------ the run
    def run(self) -> Summary:
        """Resume if possible, train until done (epochs, max steps or early stop), return the summary."""
        started = time.perf_counter()
        if self.d.is_main:
            log.info(
                "data: %s; %d rank(s) on %s; %d optimizer steps per epoch of %d micro-batches of %d",
                self.data.source, self.d.world_size, self.d.device, len(self.data.train) // self.cfg.grad_accum,
                self.cfg.grad_accum, self.cfg.batch_size,
            )
        self.summary.resumed_from = self.resume()
        first_step = self.progress.step
        self._meter, self._stall_s = Meter(), 0.0
        while self._epochs_left():
            if not self._train_epoch():
                break  # max_steps ended training inside the epoch: no validation of a partial epoch
            if self._end_epoch():
                break  # early stopping
        self.progress.done = True
        just_validated = self.early.last is not None and self.progress.epoch_step == 0
        self.save(metrics={"val_loss": self.early.last} if just_validated else None)
        if self.ckpt is not None:
            self.ckpt.wait()
        return self._finish(started, first_step, self._stall_s + self._meter.stall_s)

    def _epochs_left(self) -> bool:
        p = self.progress
        return not p.done and not self.early.should_stop and p.epoch < self.cfg.epochs and not self._max_steps_reached()

    def _train_epoch(self) -> bool:
        """Train the rest of the current epoch; False when max_steps ended it before its last step."""
        p = self.progress
        self._epoch.begin()
        self.data.train.set_epoch(p.epoch)
        # len() is what is left of the epoch: all of it, or the rest after a resume
        epoch_steps = p.epoch_step + len(self.data.train) // self.cfg.grad_accum
        batches = iter(self.data.train)
        while p.epoch_step < epoch_steps and not self._max_steps_reached():
            if self._step(batches, last=p.epoch_step + 1 == epoch_steps) and self.stop is not None:
                del batches  # this rank's DataLoader workers end now, before torchrun's SIGTERM can kill them
                leave_preempted(self, self.stop)
        del batches  # shuts this epoch's workers down
        return p.epoch_step >= epoch_steps

    def _step(self, batches: Iterator[Batch], *, last: bool) -> bool:
        """One optimizer step, then metrics, a save, a planned crash, a log line; True: preempted (and saved)."""
        cfg, p = self.cfg, self.progress
        lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
        loss = self.train_step(batches, self._meter)
        p.step += 1
        p.epoch_step += 1
        loss_value = loss.item()
        self.metrics.write(event="step", step=p.step, epoch=p.epoch, loss=loss_value, lr=lr)
        preempted = self.stop is not None and self.stop.requested(p.step)  # a collective: every rank
        if preempted:
            self.save(self._meter, durable=True)
        elif self._save_due() and not last:
            self.save(self._meter)  # an epoch's last step is saved after its validation (_end_epoch)
        if p.step == cfg.fail_at_step:
            self._crash(p.step)
        if cfg.log_every and p.step % cfg.log_every == 0:
            if self.d.is_main:
                log.info("%s", self._meter.line(p.step, p.epoch, loss_value, lr))
            self._stall_s += self._meter.stall_s
            self._meter = Meter()
        return preempted

    def _end_epoch(self) -> bool:
        """Validate the epoch just trained, update early stopping, save if due; True to stop early."""
        cfg, p = self.cfg, self.progress
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
            self.save(self._meter, metrics={"val_loss": float(result["val_loss"])})
        self._epoch.end(p.epoch - 1, log if self.d.is_main else None)  # its summary line (rank 0)
        if stop and self.d.is_main:
            log.info("early stopping after epoch %d: no improvement for %d epochs", p.epoch - 1, self.early.counter)
        return stop

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
        weights = full_weights(self.net, sharded=self.sharded)  # under FSDP: a gather, on every rank
        if self.d.is_main:
            torch.save(weights, Path(self.cfg.out_dir) / "final_model.pt")
            log.info("summary: %s", json.dumps(asdict(s)))
        return s

    def close(self) -> None:
        """Finish the checkpoint in flight, close the metrics file, restore the signal handlers."""
        if self.ckpt is not None:
            self.ckpt.close()
        self.metrics.close()
        if self.stop is not None:
            self.stop.close()


def leave_preempted(trainer: Trainer, stop: Preemption) -> NoReturn:
    """After a preemption save: wait until it is durable, wait for every rank, exit ``Preemption.EXIT_CODE``.

    ``close()`` waits for this rank's part of the commit (with a local tier: for the local commit,
    and for the upload until ``--grace-s`` after the signal; the local copy stays if it is late);
    ``Preemption.exit`` then waits for every rank, so no rank exits (and makes torchrun SIGTERM the
    others) while another is still saving.
    The signal handlers stay installed until the process ends: a rank that torchrun SIGTERMs
    while it is leaving anyway is not killed half-way.
    """
    p = trainer.progress
    trainer.metrics.write(event="preempted", step=p.step, epoch=p.epoch)
    if trainer.ckpt is not None:
        trainer.ckpt.close(timeout_s=stop.remaining_s)
    trainer.metrics.close()
    stop.exit()
