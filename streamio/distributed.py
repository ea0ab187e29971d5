"""This process's place in the job (rank, world size), looked up in one place.

The order is the one torch users expect: the initialised default process group when there is one
(``torch.distributed``), else the ``RANK``/``WORLD_SIZE`` environment torchrun sets before the group
exists, else a single process ``(0, 1)``. Library code asks here instead of reading either source
itself, and passes the answer down to pure code (the planner never looks).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch.distributed as dist

from streamio.errors import PlanError

__all__ = ["group_initialized", "leave", "local_rank_and_world", "rank_and_world"]


def group_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group exists (collectives can run)."""
    return dist.is_available() and dist.is_initialized()


def leave(code: int = 0) -> NoReturn:
    """End this process now: destroy the process group if there is one, flush stdout/stderr, ``os._exit(code)``.

    After DDP has run, a normal interpreter exit sometimes aborts a rank ("terminate called without
    an active exception", torch 2.13), which turns a finished run into a failed one; this is the
    measured way out (docs/design.md "Measured behaviour of dependencies"). Nothing after it runs:
    close checkpoint managers and loaders first.
    """
    if group_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)``: the process group's, else torchrun's ``RANK``/``WORLD_SIZE``, else ``(0, 1)``.

    Raises:
        PlanError: ``RANK`` or ``WORLD_SIZE`` is set but not an integer.
    """
    if group_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _env_pair("RANK", "WORLD_SIZE")


def local_rank_and_world() -> tuple[int, int]:
    """``(local_rank, local_world_size)`` on this node: torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, else ``(0, 1)``.

    Raises:
        PlanError: ``LOCAL_RANK`` or ``LOCAL_WORLD_SIZE`` is set but not an integer.
    """
    return _env_pair("LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _env_pair(rank_var: str, world_var: str) -> tuple[int, int]:
    rank, world = os.environ.get(rank_var, "0"), os.environ.get(world_var, "1")
    try:
        return int(rank), int(world)
    except ValueError as exc:
        raise PlanError(
            f"{rank_var}={rank!r} / {world_var}={world!r} are not integers; launch with torchrun, "
            "or unset both to run as a single process"
        ) from exc
