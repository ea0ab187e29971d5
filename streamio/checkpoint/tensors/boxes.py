"""Boxes of a global tensor: a rank's piece of a DTensor, the bytes of a saved chunk a box needs, the copy.

A sharded tensor is saved as *chunks*: boxes of the global tensor (``offsets``, ``sizes``), each
stored row-major in one rank's byte stream. Restoring onto another sharding copies, for every
saved chunk that overlaps the box this rank now holds, the overlap (a ``ReadItem`` of torch DCP's
load planner: offsets into the chunk, offsets into the destination, lengths). This module does
the arithmetic and the copy:

* :func:`local_box`: where this rank's local tensor lies in the global one, as DCP's save planner
  computes it (``create_default_local_save_plan``), so a box here is exactly a DCP chunk;
* :func:`byte_span`: the bytes of a chunk that hold an overlap: from its first element to its
  last, row-major. When the overlap is a run of whole rows (FSDP's dim-0 sharding onto another
  number of ranks) that is exactly the overlap; otherwise it includes the rows' gaps, never more
  than the chunk;
* :class:`BoxSource`: those bytes, verified, copied into the destination's box through strided
  NumPy views (no temporary when the destination is on the CPU with rows contiguous, the usual
  case), else through one temporary tensor and ``copy_`` (CUDA, scalars);
and a tensor saved whole, loaded into a DTensor, is copied through :func:`local_box` and
:func:`narrow` (:class:`~.copies.LocalFill`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from streamio.errors import CheckpointError

__all__ = ["BoxSource", "byte_span", "local_box", "narrow", "row_strides"]

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


def row_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a row-major array of ``sizes``."""
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def byte_span(sizes: Sequence[int], offsets: Sequence[int], lengths: Sequence[int], itemsize: int) -> tuple[int, int]:
    """``[start, end)`` bytes of a row-major chunk of ``sizes`` that hold its sub-box at
    ``offsets`` of ``lengths`` (every length positive)."""
    strides = row_strides(sizes)
    first = sum(o * s for o, s in zip(offsets, strides, strict=True))
    last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides, strict=True))
    return first * itemsize, (last + 1) * itemsize


def narrow(t: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    """The view of ``t`` at ``offsets`` of ``lengths``."""
    for dim, (o, n) in enumerate(zip(offsets, lengths, strict=True)):
        if o != 0 or n != t.shape[dim]:
            t = t.narrow(dim, o, n)
    return t


def local_box(dt: torch.Tensor) -> Box | None:
    """Where this rank's local tensor of the DTensor ``dt`` lies in the global tensor (``None``:
    this rank is not in its mesh), computed by torch DCP's own save planner."""
    from torch.distributed.checkpoint.default_planner import create_default_local_save_plan

    items = create_default_local_save_plan({"t": dt}, False).items
    if not items:
        return None
    if len(items) != 1 or items[0].tensor_data is None:
        raise CheckpointError(f"a DTensor of {type(dt).__name__} has {len(items)} local pieces; streamio saves one")
    chunk = items[0].tensor_data.chunk
    return tuple(chunk.offsets), tuple(chunk.sizes)


class BoxSource:
    """Verified bytes of a box of a saved chunk, to be copied into the destination's box.

    Args:
        dtype: the tensor's dtype.
        lengths: the box's extent (every length positive).
        chunk_sizes: the saved chunk's sizes (they give the row-major strides of the bytes).
        segments: the bytes from the box's first element to its last (:func:`byte_span`), as
            read-only views, one per stored piece they came from.
    """

    __slots__ = ("dtype", "lengths", "strides", "segments")

    def __init__(
        self, dtype: torch.dtype, lengths: Sequence[int], chunk_sizes: Sequence[int], segments: list[np.ndarray]
    ) -> None:
        self.dtype, self.lengths = dtype, tuple(lengths)
        self.strides = row_strides(chunk_sizes)
        self.segments = segments

    def _view(self) -> np.ndarray:
        """The box as a read-only uint8 array, its last axis the bytes of a row."""
        size = torch.empty((), dtype=self.dtype).element_size()
        arr = self.segments[0] if len(self.segments) == 1 else np.concatenate(self.segments)
        if not self.lengths:
            shape, strides = (size,), (1,)
        else:
            shape = (*self.lengths[:-1], self.lengths[-1] * size)
            strides = (*(s * size for s in self.strides[:-1]), 1)
        return np.lib.stride_tricks.as_strided(arr, shape=shape, strides=strides, writeable=False)

    def copy_into(self, target: torch.Tensor) -> None:
        """Overwrite ``target`` (the destination's box: shape ``lengths``, any device; another dtype
        is converted, as ``copy_`` does)."""
        src = self._view()
        if (
            target.dtype == self.dtype and target.device.type == "cpu" and target.dim() > 0
            and target.stride(-1) == 1 and not target.requires_grad
        ):
            np.copyto(target.view(torch.uint8).numpy(), src)  # strided on both sides, no temporary
            return
        tmp = torch.empty(self.lengths, dtype=self.dtype)
        np.copyto(tmp.reshape(-1).view(torch.uint8).numpy().reshape(src.shape), src)
        with torch.no_grad():
            target.copy_(tmp)
