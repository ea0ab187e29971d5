"""The trainer's configuration: one frozen dataclass and its (small) command line.

Every knob has a default that makes ``python -m streamio.train`` train the bundled synthetic demo
data on whatever is present (all GPUs with NCCL, else CPU with gloo). Storage credentials and
endpoints are never flags: they come the way s3fs/gcsfs take them (environment, config files), so
they never land in a log, a checkpoint or a shell history.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class TrainConfig:
    """What the reference trainer does; see ``python -m streamio.train --help``.

    Attributes:
        data_url: prefix holding ``train/`` and ``val/`` streamio datasets (any fsspec URL), as the
            demo writes them; ``None`` trains on the bundled synthetic data generated in memory.
            Give the flag several times, each ``URL[:weight]``, to train on a weighted mixture of
            the prefixes' ``train/`` sets (validation reads every ``val/`` set).
        ckpt_url: checkpoint root (any fsspec URL); ``None`` disables checkpointing.
        out_dir: local directory for per-rank metrics (``rank-00000.jsonl``) and final weights.
        seed: base seed of everything random (model init, shuffling, dropout, augmentation).
        epochs: upper bound on epochs (early stopping may end sooner).
        max_steps: stop after this many optimizer steps in all (0: no limit).
        batch_size: samples per micro-batch per rank.
        grad_accum: micro-batches per optimizer step.
        lr: peak learning rate (linear warmup, then cosine decay, stepped per optimizer step).
        warmup_steps: optimizer steps of linear warmup.
        weight_decay: AdamW weight decay.
        dropout: dropout probability of the model.
        hidden: width of the model's hidden layers.
        num_workers: DataLoader worker processes per rank.
        loader_threads: with ``data_url``, make the batches on this many threads of each rank's own
            process instead of worker processes (``StreamingDataLoader(threads=N)``: the same
            batches as no workers, less CPU per GB); ``num_workers`` and pinned memory are then
            not used. 0: worker processes.
        val_batch_size: samples per validation batch per rank.
        ckpt_every: save a checkpoint every N optimizer steps (asynchronously).
        local_ckpt: node-local directory of a checkpoint tier (NVMe; ``/dev/shm/...`` for RAM):
            every checkpoint commits there first and a restart restores the nearest good copy;
            only every ``durable_every``-th (and the run's last) also goes to ``ckpt_url``, in the
            background. ``None``: every checkpoint goes to ``ckpt_url`` only.
        durable_every: with ``local_ckpt``, every Nth checkpoint is uploaded to ``ckpt_url``.
        keep_last: checkpoints kept by recency.
        keep_best: checkpoints kept by lowest validation loss (0: none).
        patience: epochs without improvement of the validation loss before stopping (0: never).
        min_delta: the least decrease of the validation loss that counts as an improvement.
        log_every: optimizer steps between log lines.
        collective_timeout_s: a collective that waits longer than this fails instead of hanging.
        fail_at_step: simulate a crash right after this optimizer step (exit without cleanup).
        train_samples: size of the synthetic training set (ignored with ``data_url``).
        val_samples: size of the synthetic validation set (ignored with ``data_url``).
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        fsdp: shard the model and optimizer state over the ranks with FSDP2 (``fully_shard``)
            instead of replicating them with DDP, and checkpoint the shards (each rank writes its
            own; a run resumes on any number of ranks). Without torchrun the model stays plain.
        preemption: on SIGTERM or SIGUSR1 (to any one rank), every rank saves the same step
            durably, waits for the others and exits with status 143 (streamio.Preemption;
            docs/preemption.md). Ctrl-C (SIGINT) is left alone.
        grace_s: with ``preemption`` and ``local_ckpt``, the preemption save commits on the local
            tier and its upload to ``ckpt_url`` is waited for at most this many seconds from the
            signal; past it the local copy stays (a restart on this node resumes from it) and the
            exit status is still 143. Set it a few seconds under the scheduler's grace period
            (Kubernetes' terminationGracePeriodSeconds, 30 by default; Slurm's --signal=TERM@N).
    """

    data_url: str | tuple[str, ...] | None = None
    ckpt_url: str | None = None
    out_dir: str = "demo-out/run"
    seed: int = 0
    epochs: int = 3
    max_steps: int = 0
    batch_size: int = 32
    grad_accum: int = 2
    lr: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    dropout: float = 0.1
    hidden: int = 128
    num_workers: int = 2
    loader_threads: int = 0
    val_batch_size: int = 128
    ckpt_every: int = 20
    local_ckpt: str | None = None
    durable_every: int = 1
    keep_last: int = 2
    keep_best: int = 1
    patience: int = 5
    min_delta: float = 0.0
    log_every: int = 10
    collective_timeout_s: float = 300.0
    fail_at_step: int = 0
    train_samples: int = 4096
    val_samples: int = 1001
    device: str = "auto"
    fsdp: bool = False
    preemption: bool = False
    grace_s: float = 25.0


def _attribute_help() -> dict[str, str]:
    """Each field's help text, from the ``Attributes:`` section of TrainConfig's docstring."""
    helps: dict[str, str] = {}
    name = None
    for line in (TrainConfig.__doc__ or "").split("Attributes:", 1)[-1].splitlines():
        head, sep, text = line.strip().partition(": ")
        if sep and head.isidentifier() and line.startswith(" " * 8) and not line.startswith(" " * 12):
            name = head
            helps[name] = text
        elif name and line.strip():
            helps[name] += " " + line.strip()
    return helps


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """Build a :class:`TrainConfig` from command-line flags (``--ckpt-every 20`` ...)."""
    parser = argparse.ArgumentParser(
        prog="python -m streamio.train",
        description="Reference DDP / FSDP2 trainer over streamio (launch with torchrun for several ranks).",
    )
    defaults = TrainConfig()
    helps = _attribute_help()
    for f in fields(TrainConfig):
        default = getattr(defaults, f.name)
        flag, text = f"--{f.name.replace('_', '-')}", helps.get(f.name, "").replace("%", "%%")
        if isinstance(default, bool):  # a switch: off unless given
            parser.add_argument(flag, action="store_true", help=text)
            continue
        kind = {int: int, float: float}.get(type(default), str)
        parser.add_argument(
            flag,
            type=kind,
            default=default,
            action="append" if f.name == "data_url" else "store",
            help=f"{text} (default: {default})",
        )
    args = parser.parse_args(argv)
    if args.local_ckpt is not None and args.ckpt_url is None:
        parser.error("--local-ckpt needs --ckpt-url: the local tier keeps copies of the checkpoints saved there")
    if args.preemption and args.ckpt_url is None:
        parser.error("--preemption needs --ckpt-url: a preempted run saves its last step there, and resumes from it")
    if not args.grace_s >= 0:
        parser.error(f"--grace-s {args.grace_s}: give the seconds a preemption save may take to become durable (>= 0)")
    if args.loader_threads < 0:
        parser.error(f"--loader-threads {args.loader_threads}: give the threads that make batches (0: workers)")
    if args.durable_every != 1 and args.local_ckpt is None:
        parser.error("--durable-every needs --local-ckpt: without a local tier every checkpoint goes to --ckpt-url")
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    urls = values["data_url"]
    values["data_url"] = None if not urls else urls[0] if len(urls) == 1 else tuple(urls)
    return TrainConfig(**values)


def data_sources(data_url: str | tuple[str, ...]) -> list[tuple[str, float | None]]:
    """``--data-url`` values as ``(prefix, weight)``: ``URL[:weight]``, the weight after the last colon.

    Raises:
        ConfigError: (a ValueError) a weight that is not a number > 0.
    """
    from streamio.data.mixing import parse_source

    return [parse_source(item) for item in ((data_url,) if isinstance(data_url, str) else data_url)]
