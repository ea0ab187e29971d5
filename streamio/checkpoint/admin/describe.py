"""What ``streamio ckpt inspect`` shows of a checkpoint: everything but the tensor bytes (PURE).

A manifest holds the whole non-tensor state as tagged JSON (:mod:`~..tensors.tree`): the step and epoch,
the data position (each rank's), the scheduler, counters and early stopping, optimizer
hyper-parameters, RNG positions. :func:`describe` turns it into plain JSON for a reader: tensors
are left out of the state (they are listed with their global shapes and dtypes, and sharded ones
with the sharding they were saved with: placements over a device mesh, and each rank's chunk),
tuples and sets become lists, non-string keys strings, inf/nan strings, bytes their length. Nothing is decoded
into live objects and nothing is unpickled: this runs on a laptop without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from streamio.checkpoint.format.entries import ShardedEntry
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.timeline import timeline_to_json

__all__ = ["describe", "readable", "sharding"]

_TAG = "$t"  # tree.TAG (tree.py imports torch; this module must not)
_DROP = object()  # a tensor: shown in the tensor list, not in the state


def readable(tree: Any) -> Any:
    """The non-tensor values of a stored state tree as plain JSON (containers that held only
    tensors disappear; containers that were empty stay)."""
    value = _readable(tree)
    return None if value is _DROP else value


def _readable(tree: Any) -> Any:
    if isinstance(tree, list):
        return _container([_readable(v) for v in tree], list)
    if not isinstance(tree, dict):
        return tree if not isinstance(tree, float) or math.isfinite(tree) else repr(tree)
    tag = tree.get(_TAG)
    if tag is None:
        return _container({str(k): _readable(v) for k, v in tree.items()}, dict)
    if tag in ("tensor", "ndarray", "dtensor"):
        return _DROP
    if tag in ("tuple", "set"):
        return _container([_readable(v) for v in tree.get("v") or []], list)
    if tag == "dict":
        items = [i for i in tree.get("items") or [] if isinstance(i, list) and len(i) == 2]
        return _container({_key(k): _readable(v) for k, v in items}, dict)
    if tag == "bytes":
        return f"<{len(str(tree.get('v', ''))) * 3 // 4} bytes>"
    if tag == "dtype":
        return f"torch.{tree.get('v')}"
    if tag in ("float", "size", "device"):
        return tree.get("v")
    if tag == "npscalar":
        return _readable(tree.get("v"))
    return tree  # a tag of a newer streamio: shown as stored


def _container(items: Any, kind: type) -> Any:
    kept = [v for v in items if v is not _DROP] if kind is list else {k: v for k, v in items.items() if v is not _DROP}
    return _DROP if items and not kept else kept


def _key(k: Any) -> str:
    value = _readable(k)
    return value if isinstance(value, str) else repr(value)


def describe(
    m: Manifest, *, path: str, place: str, bad: str | None, retention: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Everything ``inspect`` shows of the save of ``m`` in directory ``path``.

    Args:
        place: where it stands on the root's timeline (``"current"``, ``"ahead"``,
            ``"abandoned"``, ``"unknown"``: see :mod:`~..format.timeline`).
        bad: why a restore rejected it, if one did.
        retention: the root's recorded retention policy (JSON), if any.
    """
    tensors = [("replicated", k, e) for k, e in m.replicated.tensors.items()]
    for r, section in enumerate(m.per_rank):
        tensors += [(f"rank {r}", k, e) for k, e in section.tensors.items()]
    return {
        "step": m.step,
        "path": path,
        "world_size": m.world_size,
        "created": m.created,
        "metrics": dict(m.metrics),
        "software": dict(m.software),
        "timeline": {**timeline_to_json(m.line), "parent": m.parent or None, "place": place},
        "bad": bad,
        "retention": dict(retention) if retention is not None else None,
        "state": readable(m.replicated.tree) or {},
        "per_rank": [readable(s.tree) or {} for s in m.per_rank],
        "bytes": m.total_bytes,
        "files": len(m.files),
        "key_prefixes": m.key_prefixes,
        "tensors": [{"section": s, "key": k, "dtype": e.dtype, "shape": list(e.shape), "nbytes": e.nbytes,
                     "rank": e.rank} for s, k, e in tensors] + [_sharded_row(k, e) for k, e in m.sharded.items()],
    }


def sharding(e: ShardedEntry) -> str:
    """How a sharded tensor was saved, in words: ``"Shard(dim=0) over mesh [2] (dp), 2 chunks"``."""
    layout, n = e.layout, len(e.chunks)
    chunks = f"{n} chunk{'s' if n != 1 else ''}"
    placements = layout.get("placements")
    if not isinstance(placements, list) or not placements:
        return chunks
    dims = layout.get("dims") or []
    named = f" ({', '.join(map(str, dims))})" if dims else ""
    return f"{', '.join(map(str, placements))} over mesh {layout.get('mesh')}{named}, {chunks}"


def _sharded_row(key: str, e: ShardedEntry) -> dict[str, Any]:
    """An ``inspect`` row of a sharded tensor: its global shape and how it was sharded."""
    return {"section": "sharded", "key": key, "dtype": e.dtype, "shape": list(e.shape),
            "nbytes": sum(c.nbytes for c in e.chunks), "rank": None, "sharding": sharding(e),
            "layout": dict(e.layout),
            "chunks": [{"rank": c.rank, "offsets": list(c.offsets), "sizes": list(c.sizes)} for c in e.chunks]}
