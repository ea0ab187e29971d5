"""Every byte to and from storage goes through here (fsspec underneath); knows nothing of torch."""

from streamio.storage.retry import RetryPolicy, classify, is_transient
from streamio.storage.store import (
    IncompleteUpload,
    ObjectInfo,
    Store,
    WriteMode,
    documented_write_rate,
    store_at,
    write_pacer,
)

__all__ = [
    "IncompleteUpload", "ObjectInfo", "RetryPolicy", "Store", "WriteMode", "classify", "documented_write_rate",
    "is_transient", "store_at", "write_pacer",
]
