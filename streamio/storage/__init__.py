"""Every byte to and from storage goes through here (fsspec underneath); knows nothing of torch."""

from streamio.storage.retry import RetryPolicy, classify, is_transient
from streamio.storage.store import IncompleteUpload, ObjectInfo, Store, WriteMode

__all__ = ["IncompleteUpload", "ObjectInfo", "RetryPolicy", "Store", "WriteMode", "classify", "is_transient"]
