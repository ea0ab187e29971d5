"""The trainer and its subprocesses find S3 through fsspec with the endpoint from the environment.

fsspec caches a filesystem per set of arguments, not per environment: an ``S3FileSystem()`` made
earlier in the session (a benchmark's ``TorchCheckpointIO`` in tests/core) would serve these tests
the endpoint of a server that is gone.
"""

from __future__ import annotations

import pytest
import s3fs


@pytest.fixture(autouse=True)
def _fresh_s3fs() -> None:
    s3fs.S3FileSystem.clear_instance_cache()
