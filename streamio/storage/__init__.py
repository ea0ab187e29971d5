"""Every byte to and from storage goes through here (fsspec underneath); knows nothing of torch."""

from streamio.storage.retry import RetryPolicy, is_transient
from streamio.storage.store import ObjectInfo, Store, WriteMode

__all__ = ["ObjectInfo", "RetryPolicy", "Store", "WriteMode", "is_transient"]
