"""Verified bytes copied into live tensors: what a restore loads, once everything has verified.

A restore reads and verifies every byte it needs before any live tensor changes (docs/design.md
"Restore"), so what it has read is held as *copy sources* until then: :class:`VerifiedTensor`
(a tensor's verified bytes, as views of the parts they came from), :class:`LocalFill` (a tensor
saved whole, loaded into a DTensor: this rank's box of it) and :class:`~.boxes.BoxSource` (a box of
a sharded tensor's saved chunk). Decoding plans the copies (:func:`~.tree.decode_tree` with
``defer=``); :func:`run_copies` makes them, in parallel, when the restore loads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from streamio import threads
from streamio.checkpoint.tensors.boxes import local_box, narrow

__all__ = ["CopySource", "LocalFill", "VerifiedTensor", "run_copies"]


class VerifiedTensor:
    """Verified raw bytes of one tensor, copied out only when loaded.

    Loading copies the bytes straight into the live tensor that receives them (one copy, no
    temporary), or into a fresh CPU tensor when there is none.
    """

    __slots__ = ("dtype", "shape", "_segs")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], segs: list[np.ndarray]) -> None:
        self.dtype, self.shape, self._segs = dtype, torch.Size(shape), segs

    def materialize(self) -> torch.Tensor:
        """A fresh CPU tensor holding the bytes."""
        out = torch.empty(self.shape, dtype=self.dtype)
        self._fill(out)
        return out

    def copy_into(self, target: torch.Tensor) -> None:
        """Overwrite ``target`` (same shape and dtype, any device) with the bytes."""
        if target.device.type == "cpu" and target.is_contiguous() and not target.requires_grad:
            self._fill(target)
        else:
            with torch.no_grad():
                target.copy_(self.materialize())

    def _fill(self, out: torch.Tensor) -> None:
        if out.numel() == 0:
            return
        flat = out.view(-1).view(torch.uint8).numpy()
        pos = 0
        for s in self._segs:
            flat[pos : pos + len(s)] = s
            pos += len(s)


class LocalFill:
    """A tensor saved whole, copied into the local tensor of a live DTensor of the same shape:
    this rank's box of it (a plain module's checkpoint restored into an FSDP one)."""

    __slots__ = ("source", "box")

    def __init__(self, source: VerifiedTensor, live: torch.Tensor) -> None:
        self.source = source
        self.box = local_box(live)

    def copy_into(self, target: torch.Tensor) -> None:
        if self.box is None or math.prod(self.box[1]) == 0:
            return
        whole = self.source.materialize()
        with torch.no_grad():
            target.copy_(narrow(whole, *self.box))


class CopySource(Protocol):
    """Verified bytes that can be copied into a live tensor (:class:`VerifiedTensor`, or a box of
    a sharded tensor's chunk: :class:`~.boxes.BoxSource`)."""

    def copy_into(self, target: torch.Tensor) -> None: ...


def run_copies(copies: Sequence[tuple[CopySource, torch.Tensor]], workers: int = 8) -> None:
    """Make deferred in-place copies on a few threads (NumPy's copy releases the GIL)."""
    if len(copies) < 2 or workers < 2:
        for src, dst in copies:
            src.copy_into(dst)
        return

    with threads.executor(min(workers, len(copies)), "streamio-ckpt-copy") as pool:
        list(pool.map(lambda c: c[0].copy_into(c[1]), copies))
