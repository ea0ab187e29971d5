"""What the local-tier tests share: a small state, its blank, fast retries, the steps a root holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from streamio.checkpoint import SaveOptions
from streamio.storage import RetryPolicy

OPTS = SaveOptions(part_size=64 << 10, concurrency=4)


def _no_sleep(seconds: float) -> None:
    """Retries without waiting (a module function: the policy is pickled with the Store)."""


FAST = RetryPolicy(max_attempts=2, initial_backoff=0.01, sleep=_no_sleep)


def state(step: int, shape: tuple[int, int] = (64, 512)) -> dict[str, Any]:
    """A state whose tensor and counter both tell ``step`` apart."""
    return {"w": torch.randn(*shape, generator=torch.Generator().manual_seed(step)), "progress": {"step": step}}


def blank(shape: tuple[int, int] = (64, 512)) -> dict[str, Any]:
    """A state to restore :func:`state` into."""
    return {"w": torch.zeros(*shape), "progress": None}


def saved_steps(root: Path) -> list[int]:
    """The committed steps of a local root in the flat layout (a manifest in ``step-*``)."""
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "manifest.json").exists())
