"""The write rate a store's provider documents (the default cap of a job's saves, issue 26)."""

from __future__ import annotations

import pytest

from streamio.checkpoint import SaveOptions
from streamio.errors import ConfigError
from streamio.storage import Store, documented_write_rate


@pytest.mark.parametrize(
    ("url", "options", "env", "rate"),
    [
        ("s3://bucket/x", {}, {}, 3500.0),
        ("s3://bucket/x", {"endpoint_url": "http://127.0.0.1:9000"}, {}, None),
        ("s3://bucket/x", {"client_kwargs": {"endpoint_url": "http://minio:9000"}}, {}, None),
        ("s3://bucket/x", {}, {"AWS_ENDPOINT_URL": "http://minio:9000"}, None),
        ("gs://bucket/x", {}, {}, 1000.0),
        ("gs://bucket/x", {}, {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443"}, None),
        ("gs://bucket/x", {"endpoint_url": "http://127.0.0.1:4443"}, {}, None),
        ("file:///tmp/x", {}, {}, None),
        ("memory://x", {}, {}, None),
    ],
)
def test_documented_write_rate_only_for_the_providers_own_endpoints(
    url: str, options: dict[str, object], env: dict[str, str], rate: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert documented_write_rate(Store(url, options)) == rate


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "3", "auto"])
def test_write_rate_is_a_positive_rate_store_or_none(value: object) -> None:
    with pytest.raises(ConfigError, match="write_rate"):
        SaveOptions(write_rate=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [None, "store", 40, 3500.5])
def test_write_rate_accepts(value: object) -> None:
    assert SaveOptions(write_rate=value).write_rate == value  # type: ignore[arg-type]
