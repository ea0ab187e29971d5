"""streamio.data.locate: a prefix, an index URL (the index apart from its shards) and an indexed shard
pattern all open the same dataset; where an index may send a reader is limited."""

from __future__ import annotations

import json
import pickle
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from streamio.data.format.index import index_document, load_index, write_index
from streamio.data.format.layout import INDEX_NAME
from streamio.data.locate import (
    absolute_url,
    fetch_dataset,
    index_location,
    open_dataset,
    parse_dataset,
    same_location,
    split_index_url,
)
from streamio.data.write.indexer import build_index
from streamio.data.write.verify import validate
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ConfigError, IndexFormatError, IndexNotFoundError
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint


def _dataset(url: str, n: int = 9) -> None:
    write_dataset(({"__key__": f"{i:03d}", "txt": f"sample {i}"} for i in range(n)), url, spec=ShardSpec(max_count=3))


def _apart(shards: str, index_at: str, name: str = INDEX_NAME, *, inline_limit: int = 100_000) -> None:
    """What `streamio index SHARDS --index-url INDEX_AT[/NAME]` writes."""
    index = build_index(Store(shards))
    write_index(Store(index_at), replace(index, shards_url=absolute_url(shards)), path=name, inline_limit=inline_limit)


def test_a_prefix_and_its_index_url_open_the_same_dataset(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _dataset(url)
    store, index = open_dataset(url)
    assert store.root_url == url and index.samples == 9 and index.shards_url is None
    again, same = open_dataset(f"{url}/{INDEX_NAME}")
    assert again.root_url == url and same == index
    with pytest.raises(IndexNotFoundError, match=f"no {INDEX_NAME} at {tmp_path}/nothing/{INDEX_NAME}"):
        open_dataset(str(tmp_path / "nothing"))


@pytest.mark.parametrize("name", [INDEX_NAME, "web.json"])
@pytest.mark.parametrize("inline_limit", [100_000, 0], ids=["inline", "sidecars"])
def test_an_index_apart_from_its_shards(tmp_path: Path, name: str, inline_limit: int) -> None:
    shards, elsewhere = str(tmp_path / "readonly" / "ds"), str(tmp_path / "mine" / "idx")
    _dataset(shards)
    Path(shards, INDEX_NAME).unlink()  # shards only, as in a bucket one cannot write
    _apart(shards, elsewhere, name, inline_limit=inline_limit)
    doc = json.loads(Path(elsewhere, name).read_text())
    assert doc["shards_url"] == f"file://{shards}" and doc["shards"][0]["path"] == "data-000000.tar"
    if inline_limit == 0:  # sidecars beside the index, never beside the read-only shards
        sidecar = doc["shards"][0]["layout"]
        expected = "_layout/data-000000.tar.bin" if name == INDEX_NAME else f"_layout/{name}/data-000000.tar.bin"
        assert sidecar == expected
        assert Path(elsewhere, sidecar).exists() and not Path(shards, "_layout").exists()
    url = f"{elsewhere}/{name}" if name != INDEX_NAME else elsewhere
    store, index = open_dataset(url)
    assert store.root_url == f"file://{shards}" and index.shards_url == f"file://{shards}"
    assert index.layout(2, store).offsets[0] == 0  # layouts from beside the index (sidecars) or inline
    assert validate(store, index, deep=True).ok
    copy = pickle.loads(pickle.dumps(index))  # what a DataLoader worker gets
    assert copy.layout(1, store) == index.layout(1, store)
    assert index_location(url) == (elsewhere, name, None)


def test_an_old_index_without_shards_url_stays_valid_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _dataset(url)
    doc = json.loads(Path(url, INDEX_NAME).read_text())
    assert "shards_url" not in doc  # written beside its shards: nothing recorded
    for value, message in [
        ("data", "not an absolute URL"), (7, "not an absolute URL"), ("s3://b/has space", "not an absolute URL"),
        ("s3://key:secret@b/ds", "never records credentials"),
    ]:
        Path(url, INDEX_NAME).write_text(json.dumps({**doc, "shards_url": value}))
        with pytest.raises(IndexFormatError, match=message):
            load_index(Store(url))


def test_an_indexed_brace_pattern_opens_the_dataset_beside_it(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _dataset(url)
    store, index = open_dataset(f"{url}/data-{{000000..000002}}.tar")
    assert store.root_url == url and index == load_index(Store(url))
    assert open_dataset(f"{url}/data-*.tar")[1] == index  # a glob: one listing
    with pytest.raises(IndexNotFoundError) as err:
        open_dataset(f"{url}/data-{{000000..000003}}.tar")
    assert "names 4 shards but" in str(err.value) and "indexes 3: 1 named are not indexed (data-000003.tar)" in str(
        err.value)
    assert f"`streamio index '{url}/data-{{000000..000003}}.tar' --overwrite`" in str(err.value)  # drops nothing
    with pytest.raises(IndexNotFoundError, match=r"0 named are not indexed, 1 indexed are not named \(data-000002"):
        open_dataset(f"{url}/data-{{000000..000001}}.tar")


def test_a_pattern_without_an_index_says_how_to_make_one(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    _dataset(url)
    Path(url, INDEX_NAME).unlink()
    pattern = f"{url}/data-{{000000..000002}}.tar"
    with pytest.raises(IndexNotFoundError, match=rf"not indexed: no index.json .*`streamio index '{pattern}'`"):
        open_dataset(pattern)
    _dataset(str(tmp_path / "other"))
    _apart(str(tmp_path / "other"), url)  # index.json beside the pattern's shards indexes other shards
    with pytest.raises(IndexNotFoundError, match="indexes the shards at file://.*other, not those"):
        open_dataset(pattern)


def test_a_remote_index_may_only_point_at_the_same_kind_of_storage(tmp_path: Path, s3: S3Endpoint) -> None:
    opts = s3.storage_options()
    shards = s3.url(f"ds-{uuid.uuid4().hex[:8]}")
    _dataset_in = Store(shards, opts)
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(4)), _dataset_in, spec=ShardSpec(max_count=2))
    index = build_index(_dataset_in)
    elsewhere = s3.url(f"idx-{uuid.uuid4().hex[:8]}")
    write_index(Store(elsewhere, opts), replace(index, shards_url=shards))
    store, got = open_dataset(elsewhere, opts)  # s3 index -> s3 shards: fine
    assert store.root_url == shards and got.samples == 4 and validate(store, got, deep=True).ok
    local = str(tmp_path / "local-idx")
    write_index(Store(local), replace(index, shards_url=shards))
    assert open_dataset(local, opts)[0].root_url == shards  # an index on this machine may point anywhere
    for target in (f"file://{tmp_path}", "gs://bucket/ds", "memory://ds"):
        write_index(Store(elsewhere, opts), replace(index, shards_url=target))
        with pytest.raises(IndexFormatError, match=f"says its shards are at {target}, but an index read from s3://"):
            open_dataset(elsewhere, opts)


def test_the_bytes_one_rank_fetched_open_the_same_dataset_elsewhere_without_a_request(
    s3: S3Endpoint, proxy: FaultProxy
) -> None:
    opts = s3.storage_options(proxy.endpoint_url)
    url = s3.url("ds")
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(6)), Store(url, opts), spec=ShardSpec(max_count=2))
    for shown in (url, f"{url}/{INDEX_NAME}", f"{url}/data-{{000000..000002}}.tar", f"{url}/data-*.tar"):
        store, index, data = fetch_dataset(shown, opts)
        assert proxy.count("GET", INDEX_NAME) == 1  # and, for a pattern, its listing
        proxy.clear()
        again, same = parse_dataset(shown, opts, data)
        assert proxy.count() == 0  # nothing read: no GET, no listing
        assert again.root_url == store.root_url == url and same == index and same.samples == 6
    with pytest.raises(IndexFormatError, match=f"{url}/{INDEX_NAME}"):  # as untrusted as if read here
        parse_dataset(url, opts, data[:-1])


def test_the_bytes_one_rank_fetched_are_checked_again_where_they_are_parsed(tmp_path: Path, s3: S3Endpoint) -> None:
    opts = s3.storage_options()
    url = s3.url("idx")
    local = str(tmp_path / "ds")
    _dataset(local)
    index = build_index(Store(local))
    data = json.dumps(index_document(replace(index, shards_url=f"file://{local}"), Store(local))[0])
    with pytest.raises(IndexFormatError, match=f"says its shards are at file://{local}, but an index read from s3"):
        parse_dataset(url, opts, data.encode())  # an s3 index may not send a reader to local files
    pattern = f"{tmp_path}/ds/data-*.tar"  # the pattern's listing is the reader's; what needs none is checked again
    with pytest.raises(IndexNotFoundError, match="indexes the shards at file://.*, not those"):
        parse_dataset(pattern, None, data.encode())


def test_urls_as_an_index_records_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute_url("ds/") == f"file://{tmp_path}/ds" and absolute_url("s3://b/ds/") == "s3://b/ds"
    assert absolute_url("file://ds") == f"file://{tmp_path}/ds"
    with pytest.raises(ConfigError, match=r"https://\*\*\*@host/ds holds a user name or password"):
        absolute_url("https://user:pw@host/ds")
    assert same_location("ds", f"{tmp_path}/ds/") and same_location("s3://b/x/", "s3://b/x")
    assert not same_location("s3://b/x", "s3://b/y")
    assert split_index_url("s3://b/i/web.json") == ("s3://b/i", "web.json")
    assert split_index_url("s3://b/i/") == ("s3://b/i", INDEX_NAME) and split_index_url("web.json") == (".", "web.json")
    with pytest.raises(ConfigError, match="cannot name an index"):
        split_index_url("s3://b/i/bad\x01.json")
