"""Fixtures of the cache and prefetch tests: a fault proxy in front of moto and a store behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.cache import FAST_RETRY


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as p:
        yield p


@pytest.fixture
def s3_store(s3: S3Endpoint, proxy: FaultProxy) -> Store:
    """A store on a fresh bucket, reached through the proxy."""
    return Store(s3.url("ds"), s3.storage_options(proxy.endpoint_url), retry=FAST_RETRY)
