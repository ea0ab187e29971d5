"""Shared fixtures: environment hygiene, a loopback S3 server (moto over real HTTP), stores."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import s3fs
from hypothesis import HealthCheck, settings

from streamio.storage import Store
from streamio.testing import FakeGcsServer, GcsEndpoint, MotoProcess, S3Endpoint

settings.register_profile("ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("default", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests control every AWS_* / GCS variable they depend on (the host sets some)."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "STORAGE_EMULATOR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(autouse=True)
def _fresh_s3fs() -> None:
    """fsspec caches an ``S3FileSystem`` per set of arguments, not per environment: one made from
    the environment earlier in a worker (a benchmark's, Lightning's) would serve a later test the
    endpoint of another server. (gcsfs's cache is left alone: clearing it hung the next GCS test.)"""
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One moto server (real HTTP on 127.0.0.1) for the whole session, in a process of its own: the
    tests fork DataLoader workers, which must not inherit locks that moto's threads hold."""
    server = MotoProcess()
    yield server.start()
    server.stop()


@pytest.fixture
def s3(moto_endpoint: str) -> S3Endpoint:
    """A fresh, empty bucket on the session's moto server."""
    return S3Endpoint(moto_endpoint, "unused").new_bucket()


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """One fake-gcs-server (in memory, real HTTP on 127.0.0.1) for the whole session."""
    server = FakeGcsServer()
    yield server.start()
    server.stop()


@pytest.fixture
def gcs(gcs_endpoint: str) -> GcsEndpoint:
    """A fresh, empty bucket on the session's fake-gcs-server."""
    return GcsEndpoint(gcs_endpoint, "unused").new_bucket()


@pytest.fixture(params=["file", "memory", "s3", "gcs"])
def store(request: pytest.FixtureRequest, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    """The same contract on every backend: a fresh empty root."""
    kind = request.param
    if kind == "file":
        return Store(str(tmp_path / "root"))
    if kind == "memory":
        return Store(f"memory://streamio-{uuid.uuid4().hex}")
    if kind == "gcs":
        gcs: GcsEndpoint = request.getfixturevalue("gcs")
        return Store(gcs.url("root"), gcs.storage_options())
    s3: S3Endpoint = request.getfixturevalue("s3")
    return Store(s3.url("root"), s3.storage_options())
