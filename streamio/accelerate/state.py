"""``save_state`` / ``load_state``: what ``accelerator.save_state`` saves, as one streamio checkpoint.

``accelerator.save_state(dir)`` writes to a local directory only, the main process alone writes the
registered objects, and every rank's stateful loader state goes to one file name (the last writer
wins). Here the same things are one collective save of a :class:`~streamio.CheckpointManager`
(every rank calls it: each uploads a share of the parts, rank 0 writes the pointer last, nothing is
pickled, the manager's local tier and retention apply), under these state names:

* ``"model"``, ``"model_1"``, ...: each prepared model (streamio saves a DDP or compiled module
  under the wrapped module's keys, so a checkpoint of 2 ranks loads on 1);
* ``"optimizer"``..., ``"scheduler"``..., ``"scaler"`` (when the accelerator has a grad scaler);
* ``"custom_0"``, ``"custom_1"``, ...: the objects of ``accelerator.register_for_checkpointing``
  (like the models, saved from the ranks' common copy: rank 0's where they differ);
* ``"accelerate"``: ``accelerator.step`` (the gradient-accumulation counter) and how many objects
  of each kind were saved, checked on load before they are trusted;
* per rank (names of ``SaveOptions.per_rank``): ``"rng"``, this rank's
  :class:`~streamio.checkpoint.RNGState`, and ``"data"``, the position of every streamio loader
  :func:`~streamio.accelerate.prepare` made. On another world size each rank takes the loader state
  of rank ``rank % old_world`` (a loader's state is global: it resumes every rank exactly once
  over the rest of the epoch) and the RNG streams are re-seeded (docs/design.md "Bit-exact resume").

Sharded engines (FSDP, DeepSpeed, Megatron-LM, XLA) save through their own checkpoint code in
Accelerate and are refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamio.accelerate.attached import Attached, attached
from streamio.accelerate.loader import DeviceLoader
from streamio.accelerate.preparation import refuse_resharded
from streamio.checkpoint import CheckpointManager
from streamio.errors import ArgumentError, CheckpointFormatError, CheckpointNotFoundError, ConfigError
from streamio.state_version import check_version

__all__ = ["load_state", "save_state"]

META, RNG, DATA = "accelerate", "rng", "data"
_VERSION = 1
_UNSUPPORTED = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")
_KINDS = ("model", "optimizer", "scheduler", "scaler", "custom")



def save_state(accelerator: Any, ckpt: CheckpointManager, step: int, *,
               metrics: Mapping[str, Any] | None = None) -> None:
    """Save everything ``accelerator.save_state`` saves, every rank's RNG and loader positions, as ``step``.

    Collective: every rank calls it with the same ``step``. It returns once the state is copied to
    host memory (``ckpt.last_stats.blocked_s``); with ``async_save`` (the manager's default) the
    upload and commit run in the background (``ckpt.wait()`` waits for them).

    Args:
        accelerator: the ``accelerate.Accelerator`` the objects were prepared with.
        ckpt: the checkpoint manager (every rank made one for the same root).
        step: the training step (past the last one saved or restored).
        metrics: numbers recorded in the manifest (what ``KeepBest`` ranks by).

    Raises:
        ConfigError: a sharded engine (FSDP, DeepSpeed, ...), a manager whose ``per_rank`` lacks
            ``"rng"`` or ``"data"``, or a loader over a ``StreamingDataset`` prepared by Accelerate.
        ArgumentError: ``ckpt`` is not a :class:`~streamio.CheckpointManager` (a URL, say).
        CheckpointError: a value that cannot be saved without pickling, or the previous save failed.
    """
    state = _state(accelerator, ckpt)  # checked before ckpt is used
    ckpt.save(step, state, metrics=metrics)


def load_state(accelerator: Any, ckpt: CheckpointManager) -> int | None:
    """Restore what :func:`save_state` saved into the prepared objects; return its step.

    Collective. Call it after :func:`~streamio.accelerate.prepare`, with the same objects prepared
    in the same order as the run that saved (the names are by position, as Accelerate's are).

    Returns:
        The step restored, or ``None`` when the root holds no checkpoint (a fresh start).

    Raises:
        ConfigError: as :func:`save_state`.
        CheckpointError: no checkpoint verifies, or it does not fit the prepared objects (another
            model, another count of models, optimizers, loaders or registered objects).
        CheckpointFormatError: the checkpoint was not saved by :func:`save_state`.
    """
    state = _state(accelerator, ckpt)
    try:
        return ckpt.restore(state)
    except CheckpointNotFoundError:
        return None


def _state(accelerator: Any, ckpt: CheckpointManager) -> dict[str, Any]:
    """The named state of ``accelerator`` (see the module docstring), after the checks.

    The checked entries come first (``load_state_dict`` runs in this order once the tensors are
    copied): a checkpoint of other objects or of another dataset stops before the optimizers,
    schedulers and registered objects are loaded.
    """
    if not isinstance(ckpt, CheckpointManager):
        raise ArgumentError(
            f"streamio.accelerate.save_state/load_state take a streamio.CheckpointManager, not "
            f"{type(ckpt).__name__} {str(ckpt)[:80]!r}: make one per process, streamio.CheckpointManager(url), and "
            f"pass it to every call"
        )
    kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
    if kind in _UNSUPPORTED:
        raise ConfigError(
            f"streamio.accelerate.save_state/load_state run with DistributedType.{kind}, whose sharded state "
            f"Accelerate saves through its own engine: use accelerator.save_state for it, or DDP (MULTI_GPU / "
            f"MULTI_CPU) with streamio"
        )
    missing = sorted({RNG, DATA} - ckpt.options.per_rank)
    if missing:
        raise ConfigError(
            f"{ckpt!r} saves {missing} as replicated state (SaveOptions.per_rank="
            f"{sorted(ckpt.options.per_rank)}), but each rank has its own RNG streams and loader position: "
            f"include {sorted({RNG, DATA})} in SaveOptions(per_rank=...)"
        )
    refuse_resharded(accelerator)
    side = attached(accelerator)
    objects = _objects(accelerator)
    state: dict[str, Any] = {META: _Meta(accelerator, {k: len(v) for k, v in objects.items()}, side),
                             DATA: _Loaders(side.loaders), RNG: side.rng}
    for kind_, items in objects.items():
        for i, obj in enumerate(items):
            state[_name(kind_, i)] = obj
    return state


def _objects(accelerator: Any) -> dict[str, list[Any]]:
    scaler = accelerator.scaler
    return {"model": list(accelerator._models), "optimizer": list(accelerator._optimizers),
            "scheduler": list(accelerator._schedulers), "scaler": [] if scaler is None else [scaler],
            "custom": list(accelerator._custom_objects)}


def _name(kind: str, i: int) -> str:
    if kind == "custom":
        return f"custom_{i}"
    return kind if i == 0 else f"{kind}_{i}"


class _Meta:
    """The ``"accelerate"`` entry: ``accelerator.step`` and the count of each kind, checked on load.

    Listed first in the state, so its check runs before any other ``load_state_dict`` (tensors
    copied into modules in place may already be loaded: the error says the run cannot go on).
    """

    def __init__(self, accelerator: Any, counts: Mapping[str, int], side: Attached) -> None:
        self.accelerator = accelerator
        self.counts = {**counts, "loader": len(side.loaders)}

    def state_dict(self) -> dict[str, Any]:
        return {"version": _VERSION, "step": int(self.accelerator.step), "counts": dict(self.counts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        fix = "prepare the same models, optimizers, schedulers, loaders and registered objects as the run that saved"
        state = check_version(state, _VERSION, what="streamio.accelerate state", error=CheckpointFormatError, fix=fix)
        saved = state.get("counts")
        if saved != self.counts:
            raise CheckpointFormatError(
                f"the checkpoint holds {saved} (objects of each kind), this accelerator has {self.counts}: {fix}"
            )
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointFormatError(f"the checkpoint's accelerator step is {step!r}, not an int >= 0: {fix}")
        self.accelerator.step = step


class _Loaders:
    """The ``"data"`` entry: the position of each streamio loader, in the order they were prepared."""

    def __init__(self, loaders: list[DeviceLoader]) -> None:
        self.loaders = loaders

    def state_dict(self) -> dict[str, Any]:
        return {"version": _VERSION, "loaders": [w.state_dict() for w in self.loaders]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        state = check_version(state, _VERSION, what="streamio.accelerate loader positions",
                              error=CheckpointFormatError, fix="resume with streamio.accelerate.load_state")
        saved = state.get("loaders")
        if not isinstance(saved, list) or len(saved) != len(self.loaders):
            raise CheckpointFormatError(
                f"the checkpoint holds {len(saved) if isinstance(saved, list) else saved!r} loader positions, "
                f"streamio.accelerate.prepare made {len(self.loaders)} loaders: prepare the same loaders, in the "
                f"same order, before load_state"
            )
        for wrapper, position in zip(self.loaders, saved, strict=True):
            wrapper.load_state_dict(position)
