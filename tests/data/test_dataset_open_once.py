"""Opening a dataset under torch.distributed reads its index once per job (issue 26, "one read per job").

Real rank processes (torchrun, gloo: 4 ranks x 2 DataLoader workers) open a dataset whose layouts
are in sidecars and a mixture of two sources, through the fault proxy in front of moto, which
counts every request. Each rank reads exactly the samples a rank of the same topology reads
without a process group (torchrun's RANK/WORLD_SIZE only, simulated in this process). Rank 0's
error is raised on every rank; a rank that never opens the dataset stops the others after
``collective_timeout_s``. Without a process group, DataLoader workers (forked or spawned) read no
index either.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.data.dataset import StreamingDataset
from streamio.data.format.index import write_index
from streamio.data.loader import StreamingDataLoader
from streamio.data.options import DatasetOptions
from streamio.data.sharing import encode_failure, raise_failure
from streamio.data.write.indexer import build_index
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ConfigError, DatasetError, IndexNotFoundError, ObjectNotFoundError, StreamioError
from streamio.storage import Store
from streamio.testing import FaultProxy, RequestRecord, S3Endpoint
from support.dataset import UNEVEN_37, make_dataset
from support.open_once_worker import MIX_BATCHES, mixture, plain, read

pytestmark = pytest.mark.timeout(150)
WORKER = str(Path(__file__).parents[1] / "support" / "open_once_worker.py")
WORLD = 4
MIX = [("mixa", 0.7, [9, 4, 12, 7]), ("mixb", 0.3, [5, 6, 3])]


def _make_source(url: str, options: dict[str, Any], name: str, counts: list[int]) -> None:
    store = Store(url, options)
    for shard, n in enumerate(counts):
        samples = ({"__key__": f"{name}{shard}-{i:03d}", "txt": b"x"} for i in range(n))
        write_dataset(samples, store, spec=ShardSpec(max_count=n, prefix=f"part{shard:03d}"))
        store.delete("index.json")  # one shard per write, its index dropped: the shards add up
    write_index(store, build_index(store))


@pytest.fixture
def datasets(s3: S3Endpoint) -> tuple[str, list[list[Any]]]:
    """A dataset whose layouts are in sidecars (``inline_limit=0``), and a mixture of two sources."""
    index = make_dataset(s3.url("plain"), s3.storage_options(), UNEVEN_37)
    write_index(Store(s3.url("plain"), s3.storage_options()), index, inline_limit=0)
    for name, _, counts in MIX:
        _make_source(s3.url(name), s3.storage_options(), name, counts)
    return s3.url("plain"), [[s3.url(name), weight] for name, weight, _ in MIX]


def _run_ranks(s3: S3Endpoint, proxy: FaultProxy, plain_url: str, mix: list[list[Any]], out: Path) -> list[Any]:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env.update(
        OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[1]), OPEN_ONCE_PLAIN=plain_url,
        OPEN_ONCE_MIX=json.dumps(mix), OPEN_ONCE_MISSING=s3.url("missing"),
        OPEN_ONCE_OPTIONS=json.dumps(s3.storage_options(proxy.endpoint_url)),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD), WORKER,
           str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]


def _kind(r: RequestRecord) -> str:
    key = r.path.split("/", 2)[-1]  # /bucket/key (path-style)
    if key.endswith("index.json"):
        return f"{r.method} {key}"
    if "/_layout/" in key:
        return f"{r.method} {key.split('/', 1)[0]}/_layout/*"
    if key.endswith(".tar"):
        return f"{r.method} {key.split('/', 1)[0]}/*.tar"
    return f"{r.method} {key}?{r.query}"


def requests_by_kind(proxy: FaultProxy) -> dict[str, int]:
    """Requests seen through the proxy, by method and document (shards and sidecars pooled)."""
    return dict(sorted(collections.Counter(_kind(r) for r in proxy.log()).items()))


@pytest.mark.slow
def test_four_ranks_with_two_workers_read_each_index_once_per_job(
    s3: S3Endpoint, proxy: FaultProxy, datasets: tuple[str, list[list[Any]]], tmp_path: Path, as_rank: Any
) -> None:
    plain_url, mix = datasets
    got = _run_ranks(s3, proxy, plain_url, mix, tmp_path / "out")
    seen = requests_by_kind(proxy)
    print(json.dumps(seen, indent=1))  # the figures in docs/design.md (-s shows them)
    # rank 0 read each index once for the 4 ranks; their 8 workers read none (4 each before)
    assert {k: n for k, n in seen.items() if k.endswith(".json")} == {
        "GET plain/index.json": 1, "GET mixa/index.json": 1, "GET mixb/index.json": 1, "GET missing/index.json": 1,
    }
    # a sidecar is read where its shard is read: once, or once more by each worker its shard is split with
    shards = len(UNEVEN_37)
    assert shards <= seen["GET plain/_layout/*"] <= shards + WORLD * 2
    # nothing else but shards; a missing index: what rank 0 looked at to say why, once
    assert set(seen) - {"GET plain/_layout/*", "GET plain/*.tar", "GET mixa/*.tar", "GET mixb/*.tar"} == {
        "GET plain/index.json", "GET mixa/index.json", "GET mixb/index.json", *(k for k in seen if "missing" in k)
    }, seen
    assert all(n <= 2 for k, n in seen.items() if "missing" in k), seen  # rank 0's alone (marker, listings)
    for r in got:  # rank 0's error, raised on every rank alike
        assert r["missing"]["type"] == "IndexNotFoundError"
        assert r["missing"]["message"] == got[0]["missing"]["message"]
        assert f"no index.json at {s3.url('missing')}/index.json" in r["missing"]["message"]
    for r in got[:3]:  # rank 3 never opened it: the others gave up after collective_timeout_s
        assert r["alone"]["type"] == "PlanError", r["alone"]
        assert "did not all open it within 2 s (DatasetOptions.collective_timeout_s)" in r["alone"]["message"]
    for rank in range(WORLD):  # the same samples as ranks of the same topology without a process group
        as_rank(rank, WORLD)
        assert got[rank]["plain"] == read(plain(plain_url, s3.storage_options()))
        assert got[rank]["mix"] == read(mixture(mix, s3.storage_options()), MIX_BATCHES)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_without_a_process_group_workers_read_no_index(
    s3: S3Endpoint, proxy: FaultProxy, datasets: tuple[str, list[list[Any]]], monkeypatch: pytest.MonkeyPatch,
    context: str,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key)  # a spawned worker takes credentials from here
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    options = {"endpoint_url": proxy.endpoint_url, "client_kwargs": {"region_name": s3.region}}
    ds = StreamingDataset(datasets[0], batch_size=4, storage_options=options, options=DatasetOptions(policy="drop"))
    assert proxy.count("GET", "index.json") == 1
    loader = StreamingDataLoader(ds, num_workers=2, collate_fn=len, multiprocessing_context=context)
    assert sum(loader) == len(ds)
    assert proxy.count("GET", "index.json") == 1  # the workers got the parsed index with the dataset
    assert proxy.count("GET", ".tar") > 0


def test_rank_0s_error_is_raised_alike_on_every_rank() -> None:
    exc = IndexNotFoundError("no index.json at s3://b/ds/index.json: write the dataset with `streamio shard`")
    with pytest.raises(IndexNotFoundError) as err:
        raise_failure(encode_failure(exc), "StreamingDataset('s3://b/ds')")
    assert str(err.value) == str(exc)
    with pytest.raises(ObjectNotFoundError, match="^gone$"):  # also a FileNotFoundError, as on rank 0
        raise_failure(encode_failure(ObjectNotFoundError("gone")), "x")
    for foreign in (ValueError("bad value"), KeyError("k")):  # not ours: named in a DatasetError
        with pytest.raises(DatasetError, match=f"StreamingDataset.'s3://b/ds'.: rank 0 could not read the index "
                                               f"for every rank: {type(foreign).__name__}: "):
            raise_failure(encode_failure(foreign), "StreamingDataset('s3://b/ds')")
    for odd in (b'{"type": "annotations", "message": "m"}', b"[1, 2]", b"{}"):  # a name in errors that is no error
        with pytest.raises(DatasetError, match="rank 0 could not read the index"):
            raise_failure(odd, "x")
    with pytest.raises(DatasetError, match="rank 0's error opening x is not"):
        raise_failure(b"\xff not json", "x")
    long = encode_failure(ValueError("x" * 100_000))
    assert len(long) < 70_000  # the message is cut before it is sent


@given(st.one_of(st.binary(max_size=200), st.builds(
    lambda t, m: json.dumps({"type": t, "message": m}).encode(), st.text(max_size=30), st.text(max_size=30)
)))
def test_whatever_arrives_as_rank_0s_error_raises_one_of_ours(payload: bytes) -> None:
    with pytest.raises(StreamioError):
        raise_failure(payload, "x")


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), True, "300"])
def test_collective_timeout_must_be_a_positive_finite_number(timeout: Any) -> None:
    with pytest.raises(ConfigError, match=r"DatasetOptions\(collective_timeout_s=.*\): give a positive, finite"):
        DatasetOptions(collective_timeout_s=timeout)
