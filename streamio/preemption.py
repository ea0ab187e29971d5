"""Preemption: turn a termination notice into one agreed step at which every rank saves and leaves.

Schedulers warn before they kill: Slurm sends ``SIGUSR1`` (``--signal=USR1@120``) or ``SIGTERM``
before the time limit, Kubernetes sends ``SIGTERM`` and waits ``terminationGracePeriodSeconds``,
spot VMs give 30 s to 2 min. A process whose ``SIGTERM`` keeps its default action dies at once and
loses everything since its last checkpoint. :class:`Preemption` takes those signals and lets the
training loop decide when to stop::

    stop = streamio.Preemption(grace_s=25)     # SIGTERM and SIGUSR1; a flag, nothing else
    for step in range(first, last):
        train_step()
        if stop.requested(step):               # the same answer on every rank
            ckpt.save(step, state, durable=True)
            ckpt.close(timeout_s=stop.remaining_s)  # durable, or (local tier) past grace_s
            stop.exit()                        # waits for every rank, then exits EXIT_CODE

Why it is built this way:

1. **The handler only sets a flag.** A Python signal handler runs between two bytecodes of the
   main thread, possibly inside a lock held by logging, an upload, or a collective. It takes no
   lock and does no I/O: it records the signal number and returns. A second signal (torchrun
   forwards one to every rank; a user presses twice) sets the same flag again and does not
   interrupt the save that the first one started. The handlers stay installed until
   :meth:`Preemption.close` (or the ``with`` block's end), which restores the previous ones;
   the previous handlers are not called while ours are installed (a previous handler that raises,
   such as the default ``SIGINT`` one, would abort the save this exists to finish).
2. **Ranks agree with one tiny collective.** A signal often reaches one rank only (``kill`` of
   one pid, a node notice) or reaches ranks at different steps. If each rank stopped at its own
   step, they would save different steps and hang in each other's collectives. Every
   ``check_every`` steps, :meth:`Preemption.requested` all-reduces (MAX) the local flag over every
   rank of the default process group, so every rank answers True at the same step when any one rank was
   signalled. The vote is asynchronous: the answer at a due step is the one started at the
   previous due step, so the all-reduce's latency overlaps a step of work, and a signal is acted
   upon at the second due step after it at the latest. It is one 1-element int32 tensor, made once,
   on a gloo group of the vote's own (made at the first due step): the vote never queues behind
   the loop's collectives, and under NCCL it stays on the CPU. Without a process group there is no
   collective (and no delay). Once True, it stays True with no further collective (every rank
   latched it at the same call). Measured: docs/preemption.md "Cost".
3. **Nobody leaves early.** When one rank exits non-zero, torchrun SIGTERMs every other rank's
   process group within ~0.1 s (and SIGKILLs it 30 s later); ``srun --kill-on-bad-exit=1`` kills
   them at once. :meth:`Preemption.exit` first waits for every rank (one more all-reduce),
   so a rank whose save committed does not exit while another is still saving; the handlers
   stay installed until then, so torchrun's ``SIGTERM`` to a rank that is leaving anyway does not
   kill it half-way.
4. **DataLoader workers leave the signal to their rank.** torchrun forwards a ``SIGTERM`` it gets
   (Kubernetes) to each rank's whole process group, and Slurm signals every process of a step: a
   DataLoader worker killed by it makes the rank's ``SIGCHLD`` handler raise "DataLoader worker
   ... is killed by signal" in the middle of a step, before any save. Pass
   :attr:`Preemption.worker_init_fn` as the loader's ``worker_init_fn``: workers then ignore the
   signals (they still end when the loader shuts them down, or when their rank dies).
5. **A grace period, with a local tier.** ``grace_s`` is the scheduler's time between notice and
   ``SIGKILL``, less a margin; :attr:`Preemption.remaining_s` counts it down for
   ``ckpt.close(timeout_s=...)``, which waits for the local commit and then for the upload only
   that long. A late upload leaves the local copy (a restart on the same node resumes from it) and
   a WARNING; the exit status is :attr:`EXIT_CODE` either way (docs/preemption.md).
6. **SIGINT is not taken by default**: Ctrl-C at a terminal keeps raising ``KeyboardInterrupt``,
   as users expect. Pass ``signals=("SIGTERM", "SIGUSR1", "SIGINT")`` to have Ctrl-C save too.

**Exit status.** :attr:`Preemption.EXIT_CODE` is 143 (128 + SIGTERM), what a shell, Docker and
Kubernetes report for a process ended by ``SIGTERM``: monitoring reads it as "terminated", not
"crashed", and it is non-zero, so a Kubernetes Job or ``restartPolicy: OnFailure`` starts the pod
again and a Slurm job can be requeued (``scontrol requeue`` or ``RequeueExit=143``). Under
torchrun the job's status is torchrun's, not the rank's: torchrun turns any non-zero rank exit
into 1 (docs/preemption.md has the recipes).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from streamio.distributed import group_initialized, leave
from streamio.errors import ConfigError

__all__ = ["IgnoreSignals", "Preemption", "check_due"]

log = logging.getLogger(__name__)

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
_UNCATCHABLE = {"SIGKILL", "SIGSTOP"}


def check_due(step: int, check_every: int) -> bool:
    """Whether ``requested(step)`` runs its agreement at ``step``: every ``check_every``-th step.

    Pure, so that every rank, given the same step, makes the same collective calls.
    """
    return step % check_every == 0


def _signal_number(name: str | int) -> signal.Signals:
    if isinstance(name, bool):
        raise ConfigError(f"signals: {name!r} is not a signal; give names such as 'SIGTERM' or 'SIGUSR1'")
    try:
        number = signal.Signals[name] if isinstance(name, str) else signal.Signals(name)
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            f"signals: {name!r} is not a signal on this platform; give names such as 'SIGTERM' or 'SIGUSR1'"
        ) from exc
    if number.name in _UNCATCHABLE:
        raise ConfigError(f"signals: {number.name} cannot be caught by any process; leave it out")
    return number


@dataclass(frozen=True)
class IgnoreSignals:
    """A DataLoader ``worker_init_fn`` that makes the worker ignore ``signals`` (picklable: spawn works too)."""

    signals: tuple[int, ...]

    def __call__(self, worker_id: int) -> None:
        for number in self.signals:
            signal.signal(number, signal.SIG_IGN)


class Preemption:
    """Signal handlers that set a flag, and the step at which every rank agrees to stop.

    Args:
        signals: the signals that request a stop, by name (``"SIGTERM"``) or number. ``SIGINT``
            is left alone by default so that Ctrl-C still raises ``KeyboardInterrupt``.
        check_every: ranks agree every this many steps (one tiny all-reduce each time); raise it
            for very short steps. Steps that are not a multiple of it answer False without a
            collective.
        grace_s: the seconds the scheduler leaves between its notice and its ``SIGKILL``, less a
            margin (25 under Kubernetes' default 30): :attr:`remaining_s` counts them down, for
            ``ckpt.close(timeout_s=stop.remaining_s)`` (a local tier's upload is waited for only
            that long). ``None``: no deadline.

    Raises:
        ConfigError: (a ValueError) an unknown or uncatchable signal, ``check_every`` < 1, or
            made outside the main thread (Python runs signal handlers only there), ``grace_s``
            not a finite number >= 0.

    Use it as a context manager, or call :meth:`close`, to restore the previous handlers.
    """

    EXIT_CODE = 143
    """The rank's exit status after a preemption save: 128 + SIGTERM (see the module docstring)."""

    def __init__(
        self, signals: Sequence[str | int] = DEFAULT_SIGNALS, *, check_every: int = 1, grace_s: float | None = None
    ) -> None:
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ConfigError(f"check_every={check_every!r} must be an int >= 1 (1: agree at every step)")
        if grace_s is not None and (
            isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not math.isfinite(grace_s)
            or grace_s < 0
        ):
            raise ConfigError(
                f"grace_s={grace_s!r} must be a number of seconds >= 0 (the scheduler's grace period less a margin, "
                f"e.g. 25 under Kubernetes' default 30) or None"
            )
        if isinstance(signals, str):
            raise ConfigError(f"signals={signals!r} must be a sequence of names, e.g. ({signals!r},)")
        numbers = tuple(dict.fromkeys(_signal_number(s) for s in signals))
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "Preemption() must be made in the main thread: Python runs signal handlers only there"
            )
        self.check_every = check_every
        self.grace_s = None if grace_s is None else float(grace_s)
        self.signals = numbers
        self.received: int | None = None  # the first signal's number; set by the handler only
        self._noticed: float | None = None  # time.monotonic() when this rank learned of the stop
        self._agreed = False
        self._ballot: _Ballot | None = None  # made at the first due step under a process group
        self._previous: dict[signal.Signals, Any] = {}
        for number in numbers:
            self._previous[number] = signal.signal(number, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # no I/O, no lock, no allocation worth naming: a signal may land anywhere in the main thread
        if self.received is None:
            self._noticed = time.monotonic()
            self.received = signum

    @property
    def worker_init_fn(self) -> IgnoreSignals:
        """A DataLoader ``worker_init_fn``: the workers ignore these signals and leave them to their rank."""
        return IgnoreSignals(tuple(int(s) for s in self.signals))

    @property
    def remaining_s(self) -> float | None:
        """Seconds left of ``grace_s`` (never below 0); ``None`` without ``grace_s``.

        The grace period starts when this rank received the signal, or, on a rank that learned of
        it from the other ranks, when :meth:`requested` returned True (up to two ``check_every``
        intervals later: keep that margin in ``grace_s``). Before either, it is all of ``grace_s``.
        """
        if self.grace_s is None:
            return None
        if self._noticed is None:
            return self.grace_s
        return max(0.0, self._noticed + self.grace_s - time.monotonic())

    @property
    def signalled(self) -> bool:
        """Whether this process received one of the signals (no agreement with other ranks)."""
        return self.received is not None

    def requested(self, step: int) -> bool:
        """Whether to stop after ``step``: the same answer on every rank of the default process group.

        Collective every ``check_every`` steps under ``torch.distributed``: every rank calls it
        with the same ``step``. Under a process group the answer is the vote started at the
        previous due step (asynchronous, so its latency overlaps a step of work): True when any
        rank had been signalled by then. Without one, True when this process was signalled.
        """
        if self._agreed:
            return True
        if not check_due(step, self.check_every):
            return False
        local = self.received is not None
        if group_initialized():  # the previous due step's vote (done by now), then this one's, in flight
            if self._ballot is None:
                self._ballot = _Ballot()
            agreed = self._ballot.result()
            if not agreed:
                self._ballot.cast(local)
        else:
            agreed = local
        if agreed:
            self._agreed = True
            if self._noticed is None:
                self._noticed = time.monotonic()
            how = f"signal {signal.Signals(self.received).name}" if local else "another rank's signal"
            log.warning("preemption requested (%s): saving step %d, then exiting", how, step)
        return agreed

    def exit(self) -> NoReturn:
        """Wait for every rank to get here, then end the process with :attr:`EXIT_CODE`.

        Close the checkpoint manager first (``ckpt.close()`` waits for the save to be durable):
        nothing runs after this (``os._exit`` after destroying the process group and flushing
        stdout and stderr, :func:`streamio.distributed.leave`).
        """
        if group_initialized():
            ballot = self._ballot or _Ballot()
            ballot.result()  # every rank has one in flight, or none
            ballot.cast(False)
            ballot.result()  # a barrier that works the same on gloo and NCCL
        log.warning("preemption: exiting with status %d", self.EXIT_CODE)
        leave(self.EXIT_CODE)

    def close(self) -> None:
        """Restore the handlers that were installed before; idempotent."""
        previous, self._previous = self._previous, {}
        for number, handler in previous.items():
            signal.signal(number, handler)

    def __enter__(self) -> Preemption:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.signals)
        return f"Preemption(signals=({names}), check_every={self.check_every}, signalled={self.signalled})"


class _Ballot:
    """The vote: an asynchronous all-reduce MAX of one flag, at most one in flight, into one tensor made once.

    On a gloo group of its own, made once (collective: every rank makes it at its first due step),
    so the vote never queues behind the training loop's collectives on the default group, and
    under NCCL it stays on the CPU: reading it never waits for the GPU's stream. What a due
    step costs is mostly issuing the all-reduce (handing it to gloo's worker thread), measured in
    docs/preemption.md "Cost".
    """

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")
        self.value = torch.zeros(1, dtype=torch.int32)
        self.work: Any = None

    def cast(self, flag: bool) -> None:
        """Start the vote (the previous one must be done: :meth:`result`)."""
        self.value[0] = int(flag)
        self.work = dist.all_reduce(self.value, op=dist.ReduceOp.MAX, group=self.group, async_op=True)

    def result(self) -> bool:
        """Whether any rank voted True in the vote in flight (waits for it); False if none is."""
        work, self.work = self.work, None
        if work is None:
            return False
        work.wait()
        return bool(self.value[0])
