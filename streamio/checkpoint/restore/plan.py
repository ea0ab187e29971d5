"""Restore in two phases: decode and check everything first, then touch the live objects.

A restore must never leave a job half-loaded (docs/design.md "Restore"). So once the manifest and
every part have verified, the whole state is decoded *against* the live objects before any of
them changes (:func:`decode_state`): every tree is decoded (a malformed one raises
:class:`~streamio.errors.CheckpointFormatError`, and the caller walks back to the previous
checkpoint), copies into live tensors are only *planned*, and fresh values are built beside the
live ones. Then :func:`mismatches` compares what was decoded with what is live: the state names,
a module's keys, every tensor's shape and dtype, an optimizer's parameter groups. A mismatch
means the checkpoint belongs to another model, and restore raises naming the entry, with
nothing loaded. Only then :func:`apply` runs the planned copies, the ``load_state_dict`` calls
and the replacements of plain values.

A module is compared and decoded under wrapper-independent keys (:mod:`~..tensors.wrappers`), and its
``load_state_dict`` gets them mapped back onto its own: a checkpoint of ``DDP(model)`` loads into
``model`` and into ``torch.compile(model)``, and the other way round.

What this cannot make atomic: a user's own ``load_state_dict`` that raises after the checks
passed. That surfaces as a :class:`~streamio.errors.CheckpointError` saying which entry failed
and that the entries before it were loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import torch

from streamio.checkpoint.tensors.app_state import ShardedModelState
from streamio.checkpoint.tensors.copies import CopySource, run_copies
from streamio.checkpoint.tensors.tree import decode_tree
from streamio.checkpoint.tensors.wrappers import ModuleKeys
from streamio.errors import CheckpointError


@dataclass
class _Entry:
    name: str
    obj: Any
    template: Any  # the live state_dict() (objects with load_state_dict) or the live value
    value: Any  # decoded; its tensors are the template's own where a copy is planned
    loadable: bool
    keys: ModuleKeys | None = None  # a module's: canonical keys -> its own, for load_state_dict


@dataclass
class RestorePlan:
    """A decoded state, ready to load. Nothing live has changed while it was built."""

    entries: list[_Entry] = field(default_factory=list)
    copies: list[tuple[CopySource, torch.Tensor]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)


def decode_state(
    state: Mapping[str, Any], replicated: Mapping[str, Any] | None, per_rank: Mapping[str, Any] | None,
    tensors: Mapping[str, Any],
) -> RestorePlan:
    """Decode every entry of ``state`` from the checkpoint's trees, modifying nothing.

    Args:
        state: the caller's live state (name -> object or value).
        replicated: the manifest's replicated tree (name -> encoded state).
        per_rank: this rank's per-rank tree.
        tensors: the verified tensors the trees refer to, and a source per sharded tensor
            (:class:`~.tensors.resharding.ShardedSource`: bound to the live tensor at its place).

    Raises:
        CheckpointFormatError: a tree does not decode (the checkpoint is damaged or foreign).
    """
    replicated, per_rank = replicated or {}, per_rank or {}
    plan = RestorePlan(saved=sorted(set(replicated) | set(per_rank)))
    for name, obj in state.items():
        if name in replicated:
            tree = replicated[name]
        elif name in per_rank:
            tree = per_rank[name]
        else:
            plan.missing.append(name)
            continue
        loadable = callable(getattr(obj, "load_state_dict", None))
        keys = ModuleKeys(obj) if isinstance(obj, torch.nn.Module) else None
        if keys is not None:
            template = keys.canonical(obj.state_dict())
        elif loadable:
            template = obj.state_dict() if callable(getattr(obj, "state_dict", None)) else None
        else:
            template = obj
        value = decode_tree(tree, tensors, template, path=name, defer=plan.copies)
        if keys is not None:
            value = ModuleKeys.adopt_saved(value, template)
        plan.entries.append(_Entry(name, obj, template, value, loadable, keys))
    return plan


def mismatches(plan: RestorePlan) -> str | None:
    """What of the live state does not fit the decoded checkpoint (``None``: everything fits).

    Checked: every name was saved; a module's state keys are the saved ones and each tensor has
    the saved shape and dtype; an optimizer has as many parameter groups and parameters per
    group (both also inside a :class:`~.tensors.app_state.ShardedModelState`); elsewhere, a
    live tensor has the shape and dtype of the saved tensor at its place.
    Plain values are replaced whatever they were, so they are not compared.
    """
    if plan.missing:
        return (f"the checkpoint has no {plan.missing!r} (it holds {plan.saved!r}): "
                f"restore with the names that were saved")
    for e in plan.entries:
        if not e.loadable:
            continue
        problem = None
        if isinstance(e.obj, torch.nn.Module):
            problem = _module_keys(e.template, e.value)
        elif isinstance(e.obj, torch.optim.Optimizer):
            problem = _optimizer_groups(e.template, e.value)
        elif isinstance(e.obj, ShardedModelState):
            problem = _model_state(e.template, e.value)
        problem = problem or _tensors(e.template, e.value, "")
        if problem:
            return f"state entry {e.name!r}: {problem}"
    return None


def apply(plan: RestorePlan, state: MutableMapping[str, Any], *, concurrency: int, where: str) -> None:
    """Load a checked plan into the live objects: copies, then ``load_state_dict``, then values.

    Args:
        where: names the checkpoint in an error (``"step 5 under s3://..."``).
    """
    run_copies(plan.copies, concurrency)
    done: list[str] = []
    for e in plan.entries:
        if e.loadable:
            try:
                e.obj.load_state_dict(e.value if e.keys is None else e.keys.to_live(e.value))
            except Exception as exc:
                raise CheckpointError(
                    f"loading checkpoint {where} into state entry {e.name!r} failed after the checks passed "
                    f"({type(exc).__name__}: {exc}); entries {done!r} and the tensors were already loaded"
                ) from exc
        else:
            state[e.name] = e.value
        done.append(e.name)


def _module_keys(template: Any, value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return f"the checkpoint holds a {type(value).__name__}, not a module's state dict"
    live, saved = set(template), set(value)
    if live != saved:
        return (f"the module's state keys differ: missing from the checkpoint {sorted(live - saved)[:5]!r}, "
                f"not in the live module {sorted(saved - live)[:5]!r}")
    for key, t in template.items():
        if isinstance(t, torch.Tensor) and not isinstance(value[key], torch.Tensor):
            return f"{key!r} is not a tensor in the checkpoint ({type(value[key]).__name__}) but one in the live module"
    return None


def _model_state(template: Any, value: Any) -> str | None:
    """A :class:`~.tensors.app_state.ShardedModelState`: the model's keys, the optimizer's groups."""
    if not isinstance(value, Mapping) or not isinstance(value.get("model"), Mapping):
        return "the checkpoint holds no model state for it"
    problem = _module_keys(template["model"], value["model"])
    if problem is None and template.get("optim"):
        problem = _optimizer_groups(template["optim"], value.get("optim"))
    return f"its model or optimizer: {problem}" if problem else None


def _optimizer_groups(template: Any, value: Any) -> str | None:
    groups = value.get("param_groups") if isinstance(value, Mapping) else None
    live = template.get("param_groups", [])
    if not isinstance(groups, list) or len(groups) != len(live):
        count = len(groups) if isinstance(groups, list) else "no"
        return f"the checkpoint has {count} parameter groups, the live optimizer {len(live)}"
    for i, (g, lg) in enumerate(zip(groups, live, strict=True)):
        params = g.get("params") if isinstance(g, Mapping) else None
        if not isinstance(params, list) or len(params) != len(lg["params"]):
            count = len(params) if isinstance(params, list) else "no"
            return (f"parameter group {i} has {count} parameters in the checkpoint, "
                    f"{len(lg['params'])} in the live optimizer")
    return None


def _tensors(template: Any, value: Any, path: str) -> str | None:
    """The first tensor of ``template`` whose saved counterpart has another shape or dtype."""
    if isinstance(template, torch.Tensor):
        if isinstance(value, torch.Tensor) and (value.shape != template.shape or value.dtype != template.dtype):
            return (f"tensor {path or '.'!r} is {_describe(value)} in the checkpoint "
                    f"but {_describe(template)} in the live object")
        return None
    if isinstance(template, Mapping) and isinstance(value, Mapping):
        for k, t in template.items():
            if k in value:
                found = _tensors(t, value[k], f"{path}/{k}" if path else str(k))
                if found:
                    return found
    elif isinstance(template, (list, tuple)) and isinstance(value, (list, tuple)):
        for i, (t, v) in enumerate(zip(template, value, strict=False)):
            found = _tensors(t, v, f"{path}/{i}" if path else str(i))
            if found:
                return found
    return None


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
