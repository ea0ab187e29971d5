"""``streamio.load_index`` takes a URL like every other public function (issue 34): it raised a raw
``AttributeError`` on ``"s3://..."`` because it took only a ``Store``. Against moto S3 over HTTP."""

from __future__ import annotations

import pathlib

import pytest

import streamio
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ConfigError, IndexNotFoundError
from streamio.storage import Store
from streamio.testing import S3Endpoint


def _samples(n: int) -> list[dict]:
    return [{"__key__": f"{i:05d}", "bin": bytes([i % 256]) * 300} for i in range(n)]


def test_load_index_takes_an_s3_url_with_storage_options(s3: S3Endpoint) -> None:
    written = write_dataset(_samples(7), s3.url("ds"), s3.storage_options(), spec=ShardSpec(max_count=3))
    options = s3.storage_options()
    index = streamio.load_index(s3.url("ds"), storage_options=options)
    assert index.fingerprint == written.fingerprint and index.samples == 7 and len(index.shards) == 3
    assert streamio.load_index(s3.url("ds/index.json"), storage_options=options).fingerprint == written.fingerprint
    assert streamio.load_index(Store(s3.url("ds"), options)).fingerprint == written.fingerprint  # a Store, as before
    assert streamio.load_index(s3.url("ds") + "/", storage_options=options).fingerprint == written.fingerprint
    assert options == s3.storage_options()  # the caller's options are not changed


def test_load_index_on_a_url_without_a_dataset_names_it(s3: S3Endpoint) -> None:
    with pytest.raises(IndexNotFoundError, match=rf"no index.json at {s3.url('nothing/index.json')}: .*streamio index"):
        streamio.load_index(s3.url("nothing"), storage_options=s3.storage_options())


def test_load_index_takes_a_local_path_as_str_or_pathlib(tmp_path: pathlib.Path) -> None:
    written = write_dataset(_samples(4), str(tmp_path / "ds"))
    assert streamio.load_index(tmp_path / "ds").fingerprint == written.fingerprint
    assert streamio.load_index(str(tmp_path / "ds" / "index.json")).fingerprint == written.fingerprint
    assert streamio.load_index((tmp_path / "ds").as_uri()).fingerprint == written.fingerprint


def test_a_store_with_storage_options_is_refused_by_name(s3: S3Endpoint) -> None:
    store = Store(s3.url("ds"), s3.storage_options())
    with pytest.raises(ConfigError, match=r"load_index\('s3://.*/ds', storage_options=...\): a Store carries its own"):
        streamio.load_index(store, storage_options=s3.storage_options())


@pytest.mark.parametrize("target", [None, 42, b"s3://bucket/ds", ["s3://bucket/ds"]])
def test_what_is_not_a_url_path_or_store_is_refused_by_name(target: object) -> None:
    refused = rf"load_index takes a URL, a local path or a Store, got {type(target).__name__}"
    with pytest.raises(ConfigError, match=refused):
        streamio.load_index(target)  # type: ignore[arg-type]
