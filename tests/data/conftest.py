"""Fixtures of the data tests: a fault proxy in front of moto, a store behind it, and simulated ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

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


@pytest.fixture
def as_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int, int], None]]:
    """``as_rank(rank, world)``: this process reads as that rank (torchrun's ``RANK``/``WORLD_SIZE``)."""

    def set_rank(rank: int, world: int) -> None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))

    yield set_rank
