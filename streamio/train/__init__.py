"""The reference DDP trainer: ``python -m streamio.train`` under torchrun; ``make demo`` runs
``python -m streamio.train.demo``.

Modules, each one concept: :mod:`~streamio.train.config` (the flags), :mod:`~streamio.train.data`
(``make_data``: StreamingDataset or in-memory synthetic data), :mod:`~streamio.train.checkpointing`
(``make_checkpointer``: CheckpointManager), :mod:`~streamio.train.early_stopping`,
:mod:`~streamio.train.distributed` (``setup_distributed``: NCCL / gloo or one plain process; FSDP2),
:mod:`~streamio.train.model` (model, DDP wrapper, optimizer, LR schedule),
:mod:`~streamio.train.loop` (``Trainer``: the step loop, save / resume),
:mod:`~streamio.train.validation` (one ``all_reduce`` of sums, identical on every rank),
:mod:`~streamio.train.telemetry` (log lines, ``rank-NNNNN.jsonl`` metrics, ``Summary``),
:mod:`~streamio.train.demo` (crash + resume vs uninterrupted).
"""

from streamio.train.config import TrainConfig, parse_args
from streamio.train.early_stopping import EarlyStopping
from streamio.train.loop import Distributed, Summary, Trainer, setup_distributed, teardown_distributed

__all__ = [
    "Distributed",
    "EarlyStopping",
    "Summary",
    "TrainConfig",
    "Trainer",
    "parse_args",
    "setup_distributed",
    "teardown_distributed",
]
