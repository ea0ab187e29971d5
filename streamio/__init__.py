"""streamio: streaming datasets and atomic checkpoints from object storage for PyTorch training.

This module only re-exports the public API (``__all__`` is pinned by a test).
"""

from streamio import errors
from streamio.storage import RetryPolicy, Store

__version__ = "0.1.0"

__all__ = ["RetryPolicy", "Store", "__version__", "errors"]
