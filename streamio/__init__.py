"""streamio: streaming datasets and atomic checkpoints from object storage for PyTorch training.

This module only re-exports the public API (``__all__`` is pinned by a test). The names resolve
on first use (PEP 562 ``__getattr__``), so ``import streamio`` costs nothing until one is used:
``streamio --help`` and every CLI verb that does not need torch start without loading it. The map
of the package's modules: docs/design.md "Layout and the direction of dependencies".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamio import errors  # the error tree imports nothing else: cheap, and a submodule __getattr__ would miss
from streamio.lazy import lazy_exports
from streamio.version import __version__  # the same as pyproject.toml and CHANGELOG.md (tests/core/test_version.py)

#: public name -> the module that defines it
_EXPORTS = {
    "CacheConfig": "streamio.data.cache",
    "CheckpointManager": "streamio.checkpoint",
    "DatasetIndex": "streamio.data.format.index",
    "DatasetOptions": "streamio.data.options",
    "KeepAll": "streamio.checkpoint",
    "KeepBest": "streamio.checkpoint",
    "KeepEvery": "streamio.checkpoint",
    "KeepLast": "streamio.checkpoint",
    "LocalTier": "streamio.checkpoint",
    "Pack": "streamio.data.plan",
    "Preemption": "streamio.preemption",
    "PartSummary": "streamio.data.write.parts",
    "PartitionedWrite": "streamio.data.write.parts",
    "PrefetchConfig": "streamio.data.read.prefetch",
    "RNGState": "streamio.checkpoint",
    "RetentionPolicy": "streamio.checkpoint",
    "RetryPolicy": "streamio.storage",
    "SaveOptions": "streamio.checkpoint",
    "SaveStats": "streamio.checkpoint",
    "ShardSpec": "streamio.data.write.writer",
    "Shuffle": "streamio.data.plan",
    "Store": "streamio.storage",
    "Stream": "streamio.data.mixing",
    "StreamingDataLoader": "streamio.data.loader",
    "StreamingDataset": "streamio.data.dataset",
    "build_index": "streamio.data.write.indexer",
    "load_index": "streamio.data.format.index",
    "select": "streamio.data.select",
    "write_dataset": "streamio.data.write.writer",
}

__all__ = [
    "CacheConfig", "CheckpointManager", "DatasetIndex", "DatasetOptions", "KeepAll", "KeepBest", "KeepEvery",
    "KeepLast", "LocalTier", "Pack", "PartSummary", "PartitionedWrite", "Preemption", "PrefetchConfig", "RNGState",
    "RetentionPolicy", "RetryPolicy", "SaveOptions", "SaveStats", "ShardSpec", "Shuffle", "Store", "Stream",
    "StreamingDataLoader", "StreamingDataset", "__version__",
    "build_index", "errors", "load_index", "select", "write_dataset",
]

if TYPE_CHECKING:  # what type checkers and IDEs see: the names, eagerly
    from streamio.checkpoint import (
        CheckpointManager,
        KeepAll,
        KeepBest,
        KeepEvery,
        KeepLast,
        LocalTier,
        RetentionPolicy,
        RNGState,
        SaveOptions,
        SaveStats,
    )
    from streamio.data.cache import CacheConfig
    from streamio.data.dataset import StreamingDataset
    from streamio.data.format.index import DatasetIndex, load_index
    from streamio.data.loader import StreamingDataLoader
    from streamio.data.mixing import Stream
    from streamio.data.options import DatasetOptions
    from streamio.data.plan import Pack, Shuffle
    from streamio.data.read.prefetch import PrefetchConfig
    from streamio.data.select import select
    from streamio.data.write.indexer import build_index
    from streamio.data.write.parts import PartitionedWrite, PartSummary
    from streamio.data.write.writer import ShardSpec, write_dataset
    from streamio.preemption import Preemption
    from streamio.storage import RetryPolicy, Store


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each name imported on first use


def __dir__() -> list[str]:
    return __all__
