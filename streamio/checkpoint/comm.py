"""The collectives the commit protocol and the restore walk need, each with a bounded wait.

Saving and restoring are collective: ranks agree on a save id, on whether every rank's parts
are in the store (the barrier), and on the outcome of each restore attempt. These run in the
manager's background thread while the training loop runs its own collectives (NCCL or gloo) on
the default group, so they go through gloo groups of their own and never interleave with those;
in an NCCL job a restore's large broadcasts take an NCCL group of their own (:mod:`.lane`).
Without an initialised process group everything is a single process: rank 0 of 1, and every
collective returns this rank's own value. A ``solo`` Comm is that too while a group exists: for a
framework that saves on one rank only (Lightning's ``CheckpointIO`` runs on global rank 0), whose
saves are then the state of that one process, with no collective to wait for.

Why two groups and two bounds. A rank that calls ``save`` alone (``if rank == 0: save(...)``,
the ``torch.save`` habit) must get an error naming the ranks that never came, within a timeout
the user sets (``SaveOptions.collective_timeout_s``, minutes). But the barrier after the uploads
legitimately waits for the slowest rank's uploads, which may take longer than that. So each save
and restore starts with :meth:`Comm.arrive` on a small gloo group whose every wait is bounded by
the timeout: rank 0 collects every rank's "I am at save step N" against one deadline, so it knows
*which* ranks did not come (``monitored_barrier`` waits the whole timeout once per missing rank,
and on other ranks not at all), and answers every rank that did come with the same table, so
all of them raise alike, also when they arrived at different operations (a save of another step,
a restore). Only once every rank is known to be in the same operation do the later collectives
run, on the second group, whose gloo timeout (the larger of the same setting and
:data:`TRANSFER_BACKSTOP_S`) only bounds waits for ranks that are alive and transferring. A rank
that dies mid-save closes its connections, which gloo reports at once.

A failed wait leaves gloo's connection to that peer closed, so a Comm whose collective failed
refuses every later one (:class:`~streamio.errors.CheckpointError`) instead of hanging or pairing
messages of different saves; the job has to be restarted. What it refuses with names the first
failure (:attr:`Comm.failure`: a rank that died or stopped mid-collective is not a usage mistake),
and the restore walk raises that failure at once instead of trying to agree on anything after it.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any

import numpy
import torch
import torch.distributed as dist

from streamio.checkpoint.lane import MIN_BYTES, broadcast_staged, lane_device
from streamio.checkpoint.options import SaveOptions
from streamio.distributed import group_initialized, rank_and_world
from streamio.errors import CheckpointError

__all__ = ["TRANSFER_BACKSTOP_S", "Comm"]

TRANSFER_BACKSTOP_S = 1800.0
"""Bound of the waits after every rank arrived (for the slowest rank's uploads or downloads),
unless the collective timeout is larger: torch's own default for gloo groups."""

_OPS = {"save": 1, "restore": 2}
_MISSING = 0
_GONE = -1  # in the arrival table: the rank's connection was closed (it exited or crashed)
_TAG_INFO, _TAG_HERE, _TAG_TABLE = 1, 2, 3
_CALL_ON_EVERY_RANK = (
    "save() and restore() are collective: call them on every rank, with the same step (not only on rank 0, "
    "as with torch.save)"
)


class Comm:
    """This rank's place in the job and the collectives of saving and restoring (see module docstring).

    Args:
        timeout_s: how long a rank waits for every other rank to reach the same save or restore
            (also: to construct its manager).
        solo: this process saves and restores alone, as rank 0 of 1, even under a process group.

    Attributes:
        active: a default process group exists (else a single process, rank 0 of 1).
        rank: this process's rank.
        world: the number of ranks.
        timeout_s: the arrival timeout.
        failure: the error of the first collective that failed after every rank arrived (a
            rank died or stopped answering), ``None`` while none did: every later collective
            is refused, naming it.

    Raises:
        CheckpointError: under ``torch.distributed``, not every rank constructed its manager
            within ``timeout_s``.
    """

    def __init__(self, *, timeout_s: float = SaveOptions.collective_timeout_s, solo: bool = False) -> None:
        self.active = group_initialized() and not solo
        # torchrun's RANK/WORLD_SIZE alone do not make this a rank of a job: without a group
        # there are no collectives, so the process saves and restores on its own.
        self.rank, self.world = rank_and_world() if self.active else (0, 1)
        self.timeout_s = timeout_s
        self._broken: str | None = None
        self.failure: CheckpointError | None = None  # the first collective that failed (a rank died or stopped)
        self._stranded: list[Any] = []  # works of a failed arrival: their buffers stay alive
        self._arrivals: dist.ProcessGroup | None = None
        self._group: dist.ProcessGroup | None = None
        self._lane: dist.ProcessGroup | None = None  # NCCL jobs: large broadcasts over the GPUs
        if self.active and self.world > 1:
            try:
                # gloo connects every pair when a group is made: a rank that never makes its
                # manager stops this one here, after the arrival timeout
                self._arrivals = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                backstop = max(timeout_s, TRANSFER_BACKSTOP_S)
                self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=backstop))
                if lane_device() is not None:
                    self._lane = dist.new_group(backend="nccl", timeout=timedelta(seconds=backstop))
            except RuntimeError as exc:  # DistStoreError, DistBackendError
                raise CheckpointError(
                    f"rank {self.rank}: not every one of the {self.world} ranks constructed its CheckpointManager "
                    f"within {timeout_s:g} s (SaveOptions.collective_timeout_s): construct it on every rank; "
                    f"{_CALL_ON_EVERY_RANK} ({type(exc).__name__}: {exc})"
                ) from exc

    # ------------------------------------------------------------------------------ arrival
    def arrive(self, op: str, step: int | None, *, where: str) -> None:
        """Wait, at most ``timeout_s``, until every rank has reached the same ``op`` and ``step``.

        Args:
            op: ``"save"`` or ``"restore"``.
            step: the step saved or asked for (``None``: restore's newest).
            where: names the operation in errors (``"saving step 5 to s3://..."``).

        Raises:
            CheckpointError: a rank did not arrive in time (named), ranks arrived at different
                operations or steps (named), or an earlier collective of this Comm failed.
        """
        if self._arrivals is None:
            return
        self._check_usable(where)
        mine = torch.tensor([_OPS[op], -1 if step is None else step], dtype=torch.int64)
        try:
            table = self._gather_at_rank0(mine) if self.rank == 0 else self._ask_rank0(mine)
        except _NoAnswer as exc:
            self._broken = f"{where} waited in vain for rank 0"
            raise CheckpointError(
                f"{where} on rank {self.rank}: {exc} (SaveOptions.collective_timeout_s): {_CALL_ON_EVERY_RANK}; "
                f"nothing was done"
            ) from None
        missing = [r for r in range(self.world) if int(table[r, 0]) == _MISSING]
        gone = [r for r in range(self.world) if int(table[r, 0]) == _GONE]
        if missing or gone:
            self._broken = f"{where} waited in vain for {_ranks(missing + gone)}"
            why = [f"{_ranks(gone)} had closed its connections (the process exited or crashed)"] if gone else []
            why += [f"{_ranks(missing)} did not reach it within {self.timeout_s:g} s "
                    f"(SaveOptions.collective_timeout_s)"] if missing else []
            raise CheckpointError(
                f"{where} on rank {self.rank}: {' and '.join(why)}: {_CALL_ON_EVERY_RANK}; nothing was done"
            )
        odd = [r for r in range(1, self.world) if not torch.equal(table[r], table[0])]
        if odd:
            calls = "; ".join(f"rank {r} {_describe(table[r])}" for r in [0, *odd][:6])
            raise CheckpointError(
                f"{where} on rank {self.rank}: the ranks called different operations ({calls}): "
                f"{_CALL_ON_EVERY_RANK}; nothing was done"
            )

    def _gather_at_rank0(self, mine: torch.Tensor) -> torch.Tensor:
        """Rank 0: every rank's call, against one deadline; answer every rank that came."""
        group, deadline = self._arrivals, time.monotonic() + self.timeout_s
        table = torch.zeros((self.world, 2), dtype=torch.int64)
        table[0] = mine
        calls = {r: torch.zeros(2, dtype=torch.int64) for r in range(1, self.world)}
        here = torch.ones(1, dtype=torch.int64)
        recvs, sends = {}, {}
        for r in calls:
            try:
                recvs[r] = dist.irecv(calls[r], src=r, group=group, tag=_TAG_INFO)
                sends[r] = dist.isend(here, dst=r, group=group, tag=_TAG_HERE)
            except RuntimeError:  # gloo: the connection to it is closed: it exited or crashed
                table[r, 0] = _GONE
        self._stranded += [calls, here, *recvs.values(), *sends.values()]
        came = []
        for r, work in recvs.items():
            arrived = _wait(work, deadline) if r in sends else None
            if arrived:
                came.append(r)
            elif arrived is None:
                table[r, 0] = _GONE
        for r in came:
            table[r] = calls[r]
        answers = {r: dist.isend(table, dst=r, group=group, tag=_TAG_TABLE) for r in came}
        self._stranded += [table, *answers.values()]
        answer_by = time.monotonic() + self.timeout_s
        for r, work in answers.items():
            # it gave up meanwhile: it is not in this operation
            if not (_wait(sends[r], answer_by) and _wait(work, answer_by)):
                table[r, 0] = _MISSING
        if len(came) == self.world - 1 and bool((table[:, 0] > _MISSING).all()):
            self._stranded.clear()  # every work finished (else this Comm is done for: keep them)
        return table

    def _ask_rank0(self, mine: torch.Tensor) -> torch.Tensor:
        """Any other rank: tell rank 0 what this rank calls, and wait for the table it sends."""
        group, start = self._arrivals, time.monotonic()
        here = torch.zeros(1, dtype=torch.int64)
        table = torch.zeros((self.world, 2), dtype=torch.int64)
        try:
            send = dist.isend(mine, dst=0, group=group, tag=_TAG_INFO)
            got_here = dist.irecv(here, src=0, group=group, tag=_TAG_HERE)
            got_table = dist.irecv(table, src=0, group=group, tag=_TAG_TABLE)
        except RuntimeError as exc:  # gloo: the connection to rank 0 is closed
            raise _NoAnswer("rank 0 had closed its connections (the process exited or crashed)") from exc
        self._stranded += [mine, here, table, send, got_here, got_table]
        arrived = _wait(got_here, start + self.timeout_s)
        if arrived is None:
            raise _NoAnswer("rank 0 had closed its connections (the process exited or crashed)")
        if not arrived:
            raise _NoAnswer(f"rank 0 did not reach it within {self.timeout_s:g} s")
        # rank 0 came: it answers once every rank came or its own timeout ran out
        if not _wait(got_table, time.monotonic() + 2 * self.timeout_s):
            raise _NoAnswer(f"rank 0 reached it but sent no answer within {time.monotonic() - start:.0f} s")
        _wait(send, time.monotonic() + self.timeout_s)
        self._stranded.clear()
        return table

    # ------------------------------------------------------------------------------ collectives
    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, index = rank (picklable values the library built itself)."""
        if self._group is None:
            return [obj]
        self._check_usable("a checkpoint collective")
        out: list[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj, group=self._group)
        except RuntimeError as exc:  # DistBackendError: a timeout, or a rank that died
            raise self._lost(exc, "exchanging every rank's state") from exc
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self._group is None:
            return obj
        self._check_usable("a checkpoint collective")
        box = [obj]
        try:
            dist.broadcast_object_list(box, src=0, group=self._group)
        except RuntimeError as exc:
            raise self._lost(exc, _sharing(0, self.rank)) from exc
        return box[0]

    def broadcast_bytes(self, data: bytes | memoryview | None, *, src: int, size: int) -> memoryview:
        """Rank ``src``'s ``size`` bytes ``data`` on every rank (raw bytes: nothing is pickled);
        in an NCCL job, payloads from :data:`~.lane.MIN_BYTES` up go over the GPUs (:mod:`.lane`)."""
        if self._group is None:
            assert data is not None
            return memoryview(data)
        self._check_usable("a checkpoint collective")
        buf = torch.empty(size, dtype=torch.uint8)
        if self.rank == src:
            assert data is not None and len(data) == size, (size, None if data is None else len(data))
            buf.numpy()[:] = numpy.frombuffer(data, dtype=numpy.uint8)
        if size:
            try:
                device = lane_device() if self._lane is not None and size >= MIN_BYTES else None
                if device is not None:  # the device the rank uses now (set_device may follow the manager)
                    broadcast_staged(buf, src=src, rank=self.rank, group=self._lane, device=device)
                else:
                    dist.broadcast(buf, src=src, group=self._group)
            except RuntimeError as exc:
                raise self._lost(exc, _sharing(src, self.rank)) from exc
        return memoryview(buf.numpy()).cast("B")

    def _lost(self, exc: BaseException, doing: str) -> CheckpointError:
        """The error of a collective that failed while ``doing``; the first one is kept (:attr:`failure`)."""
        backstop = max(self.timeout_s, TRANSFER_BACKSTOP_S)
        lost = CheckpointError(
            f"rank {self.rank}: a checkpoint collective among the {self.world} ranks failed while {doing} "
            f"({type(exc).__name__}: {exc}): a rank died, or did not finish its share within {backstop:g} s; a save "
            f"in progress is abandoned (the previous checkpoint stays current), a restore loads nothing; restart "
            f"the job"
        )
        if self.failure is None:
            self._broken, self.failure = f"a collective failed ({type(exc).__name__})", lost
        return lost

    def _check_usable(self, where: str) -> None:
        if self.failure is not None:  # a rank died or stopped: not a usage mistake
            raise CheckpointError(
                f"{where} on rank {self.rank}: an earlier checkpoint collective of this CheckpointManager failed, "
                f"so it cannot save or restore any more; restart the job. It failed with: {self.failure}"
            ) from self.failure
        if self._broken is not None:
            raise CheckpointError(
                f"{where} on rank {self.rank}: this CheckpointManager's ranks fell out of step earlier "
                f"({self._broken}), so it cannot save or restore any more; {_CALL_ON_EVERY_RANK}, and restart "
                f"the job"
            )


class _NoAnswer(Exception):
    """Rank 0 did not answer in time (the message says how)."""


def _wait(work: Any, deadline: float) -> bool | None:
    """Whether ``work`` completed before ``deadline`` (``time.monotonic()``): ``True``; ``False``
    if the deadline passed (gloo then closes the connection to the peer); ``None`` if it failed
    before (the peer's connection closed: it exited or crashed)."""
    # torch hands gloo whole milliseconds, cut down: a wait of 50.99 ms could time out before the
    # deadline and read as a closed connection, so round up (at least 1: 0 means the group's default)
    remaining_ms = max(math.ceil((deadline - time.monotonic()) * 1000), 1)
    try:
        work.wait(timeout=timedelta(milliseconds=remaining_ms))
    except RuntimeError:  # gloo: "Timed out waiting ...", or the pair was closed
        return None if time.monotonic() < deadline else False
    return True


def _sharing(src: int, rank: int) -> str:
    """What a broadcast from ``src`` was doing, as rank ``rank`` saw it."""
    return "sending this rank's bytes to the others" if src == rank else f"receiving rank {src}'s bytes"


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:16])
    more = f" and {len(ranks) - 16} more" if len(ranks) > 16 else ""
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}{more}"


def _describe(call: torch.Tensor) -> str:
    op = {v: k for k, v in _OPS.items()}.get(int(call[0]), "?")
    step = int(call[1])
    return f"called {op}({'newest' if step < 0 and op == 'restore' else f'step={step}'})"
