"""The reference trainer: DDP or FSDP2 over streamio's datasets and checkpoints, exact on resume.

``python -m streamio.train`` is one rank (launch several with torchrun); ``make demo`` runs
``python -m streamio.train.demo``, which crashes a run and shows that its resume reproduces the
uninterrupted run bit for bit. Not part of the library's public API: a worked example to read and
copy. The map of its modules: docs/design.md "Layout and the direction of dependencies"; what it
shows: docs/design.md "Bit-exact resume: what is captured".
"""

from __future__ import annotations

import importlib
from typing import Any

from streamio.deprecation import moved_name

__all__: list[str] = []  # import from the modules: streamio.train.loop, .config, ...

# streamio 0.1 re-exported these from the package; each use still works until 0.3.0, with a warning.
_MOVED = {
    "Distributed": "streamio.train.distributed",
    "EarlyStopping": "streamio.train.checkpointing",
    "Summary": "streamio.train.telemetry",
    "TrainConfig": "streamio.train.config",
    "Trainer": "streamio.train.loop",
    "parse_args": "streamio.train.config",
    "setup_distributed": "streamio.train.distributed",
    "teardown_distributed": "streamio.train.distributed",
}


def __getattr__(name: str) -> Any:
    """The names streamio 0.1 re-exported here, from their modules, with a ``DeprecationWarning``."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MOVED[name]), name)
    return moved_name(f"streamio.train.{name}", f"{_MOVED[name]}.{name}", value)
