"""``PreemptionCheckpoint``: a termination notice to any rank ends in one checkpoint of one step on every rank.

Lightning 2.6 handles two signals itself, from the handlers its ``_SignalConnector`` installs when
``fit`` starts (after ``on_fit_start``, before ``on_train_start``):

* ``SIGTERM``: the handler sets ``trainer.received_sigterm`` (and broadcasts from rank 0, inside
  the handler); the loop broadcasts rank 0's flag at every batch and raises ``SIGTERMException``,
  a ``SystemExit``, on every rank, with no checkpoint. A ``SIGTERM`` that reaches another rank
  only is not seen by the others: that rank's broadcast from inside its handler pairs with the
  loop's next broadcast, and rank 0's 0 wins.
* ``SIGUSR1`` (``SLURMEnvironment(requeue_signal=...)``) under Slurm with ``auto_requeue``: the
  handler saves ``hpc_ckpt_N.ckpt`` from inside the handler (a collective ``save_checkpoint``
  with a barrier, on whichever rank got the signal) and rank 0 runs ``scontrol requeue``.

This callback owns those signals while training runs instead, and keeps Lightning's conventions
for the rest:

1. **Signals.** At ``on_train_start`` (after Lightning's connector) it installs a
   :class:`streamio.Preemption` over ``signals`` and Slurm's requeue signal when Lightning's
   ``SLURMEnvironment`` has ``auto_requeue``: its handlers only set a flag, so
   ``received_sigterm`` stays False and ``SIGTERMException`` is never raised. The handlers that
   were there before (Lightning's) come back at ``on_train_end`` / ``on_exception``, before
   Lightning restores its own originals when ``fit`` ends.
2. **One step.** At every ``on_train_batch_end`` every rank asks ``requested(global_step)``
   (one tiny all-reduce every ``check_every`` steps, docs/preemption.md): when any rank was
   signalled, every rank answers True at the same step.
3. **One checkpoint.** Then ``trainer.save_checkpoint(<dirpath>/last.ckpt)``: the same save as
   :class:`~.callback.ModelCheckpoint`'s ``save_last`` (every callback's state, the loader's
   position, every rank's RNG streams; written by the trainer's plugin, a barrier after it), so
   the same command with ``fit(ckpt_path="last")`` resumes exactly there. The plugin is torn
   down (Lightning's ``AsyncCheckpointIO`` waits for its writer thread; a failed save raises
   here, and the process does not exit 143), loggers are finalized.
4. **Requeue, then exit.** Under ``SLURMEnvironment(auto_requeue=True)`` global rank 0, when it
   got the requeue signal itself, runs ``scontrol requeue <job>`` as Lightning does (a ``SIGTERM``,
   e.g. ``scancel``'s, saves but does not requeue: Lightning bypasses it too). Every rank then leaves through
   :meth:`Preemption.exit`: it waits for every rank, then exits with ``Preemption.EXIT_CODE``
   (143); under torchrun the job's status is 1.

A signal during validation is acted upon at the next training batch's end; one after the last
batch lets ``fit`` end normally (its own ``save_last``, if any, is the checkpoint).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamio.errors import ConfigError
from streamio.lightning.callback import ModelCheckpoint
from streamio.lightning.requirement import require
from streamio.preemption import DEFAULT_SIGNALS, IgnoreSignals, Preemption

__all__ = ["PreemptionCheckpoint", "requeue_slurm_job", "slurm_job_id"]

log = logging.getLogger(__name__)

_Callback: Any = require("lightning.pytorch.callbacks").Callback
_SLURMEnvironment: Any = require("lightning.fabric.plugins.environments").SLURMEnvironment

LAST = "last.ckpt"
"""The name the preemption save gets under ``ModelCheckpoint.dirpath``: what ``ckpt_path="last"`` finds."""

_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


class PreemptionCheckpoint(_Callback):  # type: ignore[misc]
    """A Lightning callback: a signal to any rank -> every rank saves ``last.ckpt`` of one step, then exits 143.

    Needs a :class:`~.callback.ModelCheckpoint` with a ``dirpath`` among the trainer's callbacks
    (the save goes to ``<dirpath>/last.ckpt``, where ``fit(ckpt_path="last")`` finds it).

    Example::

        trainer = L.Trainer(plugins=[CheckpointIO()],
                            callbacks=[ModelCheckpoint(dirpath="s3://bucket/run/ckpt", every_n_train_steps=500),
                                       PreemptionCheckpoint()])
        trainer.fit(model, loader, ckpt_path="last")   # a fresh start when nothing was saved yet

    Args:
        signals: the signals that request the save, as for :class:`streamio.Preemption`.
        check_every: ranks agree every this many steps, as for :class:`streamio.Preemption`.

    Raises:
        ConfigError: (a ValueError) an unknown or uncatchable signal, ``check_every`` < 1; at
            ``on_train_start``: no streamio ``ModelCheckpoint`` with a ``dirpath``.
    """

    def __init__(self, signals: Sequence[str | int] = DEFAULT_SIGNALS, *, check_every: int = 1) -> None:
        with Preemption(signals, check_every=check_every) as probe:  # checks the arguments; installed at train start
            self.signals: tuple[int, ...] = tuple(int(s) for s in probe.signals)
        self.check_every = check_every
        self.stop: Preemption | None = None
        self.saved: str | None = None

    @property
    def worker_init_fn(self) -> IgnoreSignals:
        """A DataLoader ``worker_init_fn``: the workers ignore these signals and leave them to their rank
        (docs/preemption.md; add Slurm's requeue signal if it is another one)."""
        return IgnoreSignals(self.signals)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Take the signals over from Lightning's handlers (installed just before)."""
        _last_path(trainer)  # refused before any signal is taken
        signals = tuple(dict.fromkeys((*self.signals, *_requeue_signal(trainer))))
        self.stop = Preemption(signals, check_every=self.check_every)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Every rank: save and exit at the step the ranks agree on (nothing else at other steps)."""
        if self.stop is None or not self.stop.requested(trainer.global_step):
            return
        self.saved = _last_path(trainer)
        trainer.save_checkpoint(self.saved)  # every rank: the callbacks' states; the plugin on rank 0; a barrier
        trainer.strategy.checkpoint_io.teardown()  # an async plugin's writer thread done; its failure raised
        for logger in trainer.loggers:
            logger.finalize("finished")  # as Lightning's own Slurm handler does before a requeue
        log.warning("preemption: step %d saved to %s", trainer.global_step, self.saved)
        if trainer.is_global_zero and self.stop.received in _requeue_signal(trainer):
            requeue_slurm_job(os.environ)  # on the requeue signal only: a scancel's SIGTERM must not requeue
        self.stop.exit()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._release()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        stop, self.stop = self.stop, None
        if stop is not None:
            stop.close()  # Lightning's handlers back, before its connector restores the ones before fit


def _last_path(trainer: Any) -> str:
    """``<dirpath>/last.ckpt`` of the trainer's streamio ``ModelCheckpoint``."""
    found = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath is not None]
    if not found:
        raise ConfigError(
            "PreemptionCheckpoint saves to <dirpath>/last.ckpt of a streamio.lightning.ModelCheckpoint, and the "
            "trainer has none with a dirpath: add ModelCheckpoint(dirpath=...) to its callbacks"
        )
    return f"{str(found[0].dirpath).rstrip('/')}/{LAST}"


def _requeue_signal(trainer: Any) -> tuple[int, ...]:
    """Slurm's requeue signal when Lightning's ``SLURMEnvironment`` requeues (``auto_requeue``); else none."""
    # where Lightning's own signal connector looks (a single-device strategy has no cluster_environment)
    environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    if isinstance(environment, _SLURMEnvironment) and environment.auto_requeue:
        return (int(environment.requeue_signal),)
    return ()


def slurm_job_id(environ: Mapping[str, str]) -> str:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` in an array job, else ``SLURM_JOB_ID``.

    Raises:
        ConfigError: the variables are missing or are not ids (nothing else reaches the command).
    """
    array = environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{environ.get('SLURM_ARRAY_TASK_ID', '')}" if array is not None else environ.get("SLURM_JOB_ID", "")
    if not _JOB_ID.match(job):
        raise ConfigError(
            f"Slurm requeue: the job id {job!r} (SLURM_JOB_ID, or SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID) is not a "
            f"Slurm job id; run under sbatch, or give SLURMEnvironment(auto_requeue=False) and requeue from the script"
        )
    return job


def requeue_slurm_job(environ: Mapping[str, str], run: Callable[[list[str]], int] = subprocess.call) -> bool:
    """Run ``scontrol requeue <job>``; whether it worked. A failure is logged, not raised: the
    checkpoint is saved either way, and the exit status (143) still tells the scheduler."""
    try:
        command = ["scontrol", "requeue", slurm_job_id(environ)]
        code = run(command)
    except (ConfigError, OSError) as exc:
        log.warning("preemption: the job was not requeued: %s", exc)
        return False
    if code != 0:
        log.warning("preemption: %s exited %d: the job was not requeued", " ".join(command), code)
        return False
    log.warning("preemption: requeued Slurm job %s", command[-1])
    return True
