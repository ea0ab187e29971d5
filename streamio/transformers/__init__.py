"""The transformers ``Trainer`` with streamio: data and checkpoints from S3/GCS, resumed without replay.

``streamio.transformers`` is importable without transformers; using a name from it without
transformers installed raises :class:`~streamio.errors.MissingDependencyError` saying what to
install (``pip install 'streamio-torch[transformers]'``). ``import streamio`` never imports it.

* :class:`StreamioTrainer`, a ``transformers.Trainer`` whose training data is a
  ``StreamingDataLoader`` over a ``StreamingDataset`` (streamio's own rank and worker sharding,
  never Accelerate's) and whose checkpoints go to a streamio checkpoint root (every rank saves its
  part, the pointer last, nothing pickled); ``train(resume_from_checkpoint=True)`` continues at the
  exact next batch from the loader's saved position instead of replaying the skipped batches;
  ``preemption=streamio.Preemption()`` makes a signal to any rank end in one save of one step.

docs/transformers.md is the guide; docs/design.md "The transformers Trainer" the design.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamio.lazy import lazy_exports

__all__ = ["StreamioTrainer"]

_EXPORTS = {"StreamioTrainer": "streamio.transformers.trainer"}

if TYPE_CHECKING:
    from streamio.transformers.trainer import StreamioTrainer


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each name imported on first use


def __dir__() -> list[str]:
    return __all__
