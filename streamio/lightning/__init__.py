"""PyTorch Lightning with streamio: checkpoints in streamio's format, ``ckpt_path="last"`` over S3/GCS.

``streamio.lightning`` is importable without Lightning; using a name from it without Lightning
installed raises :class:`~streamio.errors.MissingDependencyError` saying what to install
(``pip install 'streamio-torch[lightning]'``). ``import streamio`` never imports it.

* :class:`CheckpointIO`, a Lightning ``CheckpointIO`` plugin: each checkpoint path is a streamio
  checkpoint root holding one save, written by global rank 0 alone (as Lightning calls it) with
  its pointer last, loaded on every rank with every part CRC-checked, nothing pickled.
* :class:`AsyncCheckpointIO`, Lightning's ``AsyncCheckpointIO`` (saves in a thread, the training
  loop blocked for a copy of the tensors) whose top-k removals wait for the saves before them.
* :class:`ModelCheckpoint`, Lightning's callback whose ``ckpt_path="last"`` lookup finds the
  newest committed ``last*.ckpt`` root under ``dirpath`` on any storage.
* :class:`ModelParallelStrategy`, Lightning's sharding strategy (FSDP2, tensor parallelism) whose
  checkpoints every rank writes through streamio's torch DCP writer into one root per path, and
  loads resharded onto the current ranks.
* :class:`PreemptionCheckpoint`, a callback: ``SIGTERM`` / ``SIGUSR1`` to any rank ends with every
  rank saving ``last.ckpt`` of the same step, then exiting ``streamio.Preemption.EXIT_CODE``
  (Slurm's requeue kept when Lightning's ``SLURMEnvironment`` requeues).

``streamio.StreamingDataLoader`` is already a stateful loader for Lightning (``state_dict`` /
``load_state_dict``); its state is global, so rank 0's copy resumes every rank.
docs/lightning.md is the guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamio.lazy import lazy_exports

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "ModelCheckpoint", "ModelParallelStrategy", "PreemptionCheckpoint"]

_EXPORTS = {"AsyncCheckpointIO": "streamio.lightning.background", "CheckpointIO": "streamio.lightning.plugin",
            "ModelCheckpoint": "streamio.lightning.callback", "ModelParallelStrategy": "streamio.lightning.strategies",
            "PreemptionCheckpoint": "streamio.lightning.preemption"}

if TYPE_CHECKING:
    from streamio.lightning.background import AsyncCheckpointIO
    from streamio.lightning.callback import ModelCheckpoint
    from streamio.lightning.plugin import CheckpointIO
    from streamio.lightning.preemption import PreemptionCheckpoint
    from streamio.lightning.strategies import ModelParallelStrategy


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each name imported on first use


def __dir__() -> list[str]:
    return __all__
