"""Sharded state (DTensor: FSDP2, tensor parallelism) in streamio checkpoints, and torch DCP storage.

docs/sharded-checkpoints.md explains the design. Modules:

* boxes.py: the geometry (a rank's box of a global tensor, the bytes of a chunk a box needs, the copy);
* saving.py: which local boxes a rank writes when it saves (no gather, one writer per box);
* fetch.py: ranged reads of byte spans of parts, verified against per-block CRC32C;
* loading.py: restoring onto any sharding (DCP's load planner, then verified ranged reads);
* dcp_writer.py / dcp_reader.py: ``StreamioWriter`` / ``StreamioReader``, a torch DCP
  ``StorageWriter`` / ``StorageReader`` pair over streamio's storage and commit protocol;
* app_state.py: ``ShardedModelState``, a model and its optimizers through DCP's
  ``get_state_dict`` / ``set_state_dict``.

Importing torch DCP costs over a second (it imports DTensor), so this package imports it only
where it is used, and the names of the DCP-based modules are loaded on first access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShardedModelState", "StreamioReader", "StreamioWriter"]

_LAZY = {
    "StreamioWriter": "streamio.checkpoint.sharded.dcp_writer",
    "StreamioReader": "streamio.checkpoint.sharded.dcp_reader",
    "ShardedModelState": "streamio.checkpoint.tensors.app_state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
