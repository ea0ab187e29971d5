"""Wrapper-independent keys for a module's state: DDP, ``torch.compile``, activation checkpointing.

``DDP(model).state_dict()`` names every entry ``module.<key>``, and ``torch.compile(model)``'s
``_orig_mod.<key>``, so a checkpoint of the wrapped model would not load into the bare one (or the
other way round: resuming on one GPU, evaluating, fine-tuning with or without compile). A module's
state is therefore saved under its *canonical* keys, the names the parameters and buffers have
in the innermost modules with every wrapper's segment removed, which is what
``torch.distributed.checkpoint.state_dict.get_model_state_dict`` calls FQNs; restore decodes
against the live module's canonical keys and maps them back onto the live module's own keys
before its ``load_state_dict`` (:class:`ModuleKeys`).

Why not DCP's ``get_model_state_dict`` / ``set_model_state_dict`` themselves: on a plain module
the first call costs ~1.3 s (it imports DCP and ``torch._dynamo``) in every process that saves;
they leave the ``_metadata`` module paths (the versions ``_load_from_state_dict`` migrates by)
wrapper-prefixed; and restore must decode and check the whole state against the live tensors and
plan in-place copies *before* anything loads, which their one-call load does not allow. The
mapping here follows the same rule as DCP's ``_get_fqns`` for the wrappers that add a prefix:

* ``DistributedDataParallel`` and ``DataParallel``: ``module``;
* ``torch.compile``'s ``OptimizedModule``: ``_orig_mod``;
* activation checkpointing's ``ActivationWrapper`` (``checkpoint_wrapper``): its state-dict hooks
  already drop ``_checkpoint_wrapped_module`` from the keys, but not from ``named_buffers()`` or
  the metadata paths, which are mapped here.

Wrappers are recognised by type, at any depth (a compiled submodule), never by name: a submodule
a model itself calls ``module`` keeps its name. The compile and checkpoint-wrapper classes are
looked up only if their modules are already imported (nothing can be wrapped by them otherwise),
so saving never imports ``torch._dynamo``. FSDP2 adds no prefix (``fully_shard`` changes the module's
class, not its keys); its DTensor state is saved by :mod:`.sharded`.

Checkpoints written before this mapping hold the wrapper's keys; restore accepts them when
removing the wrapper segments from the saved keys gives exactly the live canonical keys
(:meth:`ModuleKeys.adopt_saved`).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from streamio.errors import CheckpointError

__all__ = ["ModuleKeys"]

_DDP_TYPES = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
# (module that defines the class, class name, the attribute holding the wrapped module)
_OPTIONAL_WRAPPERS = (
    ("torch._dynamo.eval_frame", "OptimizedModule", "_orig_mod"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "ActivationWrapper", "_checkpoint_wrapped_module"),
)
_SELF_NAMED = frozenset({"_orig_mod", "_checkpoint_wrapped_module"})  # segments only wrappers add


def wrapped_attribute(module: torch.nn.Module) -> str | None:
    """The attribute under which ``module`` holds the module it wraps (``None``: not a wrapper)."""
    if isinstance(module, _DDP_TYPES):
        return "module"
    for where, name, attribute in _OPTIONAL_WRAPPERS:
        cls = getattr(sys.modules.get(where), name, None)
        if isinstance(cls, type) and isinstance(module, cls):
            return attribute
    return None


class ModuleKeys:
    """The canonical names of one live module's state: keys and metadata paths, both ways.

    Args:
        module: the live module (possibly wrapped, at any depth).

    Call :meth:`canonical` on the module's ``state_dict()`` first; :meth:`to_live` maps a
    state with those canonical keys back onto this module's own.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._paths: dict[str, str] = {}  # module path in state_dict() -> canonical path
        self._walk(module, "", "")
        self.wrapped = any(raw != canon for raw, canon in self._paths.items())
        self._raw: dict[str, str] = {}  # canonical key -> the live module's key

    def _walk(self, module: torch.nn.Module, path: str, canon: str) -> None:
        self._paths.setdefault(path, canon)
        inner = wrapped_attribute(module)
        for name, child in module._modules.items():
            if child is None:
                continue
            child_canon = canon if name == inner else (f"{canon}.{name}" if canon else name)
            self._walk(child, f"{path}.{name}" if path else name, child_canon)

    def canonical_key(self, key: str) -> str:
        """``module._orig_mod.fc.weight`` -> ``fc.weight`` (keys not under a known module path: as is)."""
        path, _, local = key.rpartition(".")
        canon = self._paths.get(path)
        if canon is None:
            return key
        return f"{canon}.{local}" if canon else local

    def canonical(self, state: Mapping[str, Any]) -> Mapping[str, Any]:
        """``state`` (this module's ``state_dict()``) under canonical keys; itself if nothing is wrapped.

        Raises:
            CheckpointError: two keys become one once the wrapper segments are removed (a
                wrapper that holds state of its own).
        """
        if not self.wrapped:
            return state
        out: OrderedDict[str, Any] = OrderedDict()
        for key, value in state.items():
            canon = self.canonical_key(key)
            if canon in out:
                raise CheckpointError(
                    f"the module's state keys {self._raw[canon]!r} and {key!r} are the same once the wrappers' "
                    f"prefixes are removed: save the unwrapped module instead"
                )
            out[canon] = value
            self._raw[canon] = key
        meta = getattr(state, "_metadata", None)
        if meta is not None:
            # in traversal order, so the innermost module's version wins over its wrappers'
            out._metadata = OrderedDict((self._paths.get(p, p), v) for p, v in meta.items())  # type: ignore[attr-defined]
        return out

    def to_live(self, value: Mapping[str, Any]) -> Mapping[str, Any]:
        """A state under canonical keys, under this module's own keys (for its ``load_state_dict``)."""
        if not self.wrapped:
            return value
        out: OrderedDict[str, Any] = OrderedDict((self._raw.get(k, k), v) for k, v in value.items())
        meta = getattr(value, "_metadata", None)
        if isinstance(meta, Mapping):
            out._metadata = OrderedDict(  # type: ignore[attr-defined]
                (raw, meta[canon]) for raw, canon in self._paths.items() if canon in meta
            )
        return out

    @staticmethod
    def adopt_saved(saved: Any, live_keys: Mapping[str, Any]) -> Any:
        """A saved module state under wrapper keys (a checkpoint from before canonical keys),
        renamed to ``live_keys`` if removing the wrapper segments gives exactly those; else as is."""
        if not isinstance(saved, Mapping) or not isinstance(live_keys, Mapping) or set(saved) == set(live_keys):
            return saved
        if not all(isinstance(k, str) for k in saved):
            return saved
        renamed = {_strip(k): k for k in saved}
        if len(renamed) != len(saved) or set(renamed) != set(live_keys):
            return saved
        out: OrderedDict[str, Any] = OrderedDict((k, saved[old]) for k, old in renamed.items())
        meta = getattr(saved, "_metadata", None)
        if isinstance(meta, Mapping):
            out._metadata = OrderedDict(  # type: ignore[attr-defined]
                (_strip(p, path=True) if isinstance(p, str) else p, v) for p, v in meta.items()
            )
        return out


def _strip(key: str, *, path: bool = False) -> str:
    """Drop wrapper segments: ``_orig_mod`` / ``_checkpoint_wrapped_module`` anywhere, then one
    leading ``module`` (DDP's; ``module._orig_mod.x`` is DDP of a compiled module). ``path``: a
    metadata module path, where a lone ``module`` is DDP's root."""
    parts = [p for p in key.split(".") if p not in _SELF_NAMED]
    if parts and parts[0] == "module" and (path or len(parts) > 1):
        parts = parts[1:]
    return ".".join(parts)
