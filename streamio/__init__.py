"""streamio: streaming datasets and atomic checkpoints from object storage for PyTorch training.

This module only re-exports the public API (``__all__`` is pinned by a test).
"""

from streamio import errors
from streamio.checkpoint import (
    CheckpointManager,
    KeepAll,
    KeepBest,
    KeepEvery,
    KeepLast,
    RetentionPolicy,
    RNGState,
    SaveOptions,
    SaveStats,
)
from streamio.data.cache import CacheConfig
from streamio.data.dataset import DatasetOptions, StreamingDataset
from streamio.data.index import DatasetIndex, load_index
from streamio.data.indexer import build_index
from streamio.data.loader import StreamingDataLoader
from streamio.data.mixing import Stream
from streamio.data.plan import Shuffle
from streamio.data.prefetch import PrefetchConfig
from streamio.data.writer import ShardSpec, write_dataset
from streamio.storage import RetryPolicy, Store

__version__ = "0.1.0"

__all__ = [
    "CacheConfig",
    "CheckpointManager",
    "DatasetIndex",
    "DatasetOptions",
    "KeepAll",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "PrefetchConfig",
    "RNGState",
    "RetentionPolicy",
    "RetryPolicy",
    "SaveOptions",
    "SaveStats",
    "ShardSpec",
    "Shuffle",
    "Stream",
    "Store",
    "StreamingDataLoader",
    "StreamingDataset",
    "__version__",
    "build_index",
    "errors",
    "load_index",
    "write_dataset",
]
