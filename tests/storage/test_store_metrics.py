"""What streamio reports of its store requests equals what the store saw (issue 38's true counts).

Every test puts a FaultProxy between the client stack (s3fs/aiobotocore, botocore, gcsfs) and a
real server (moto, fake-gcs-server) and compares ``streamio.metrics.snapshot()`` with the proxy's
log: requests by op and outcome, object bytes read and written, equal, not "non-zero". The log is
read with a classifier of its own here (method, query, status, fault), not streamio's.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

import streamio.metrics
from streamio.errors import ObjectNotFoundError, StoragePermissionError, TransientStorageError, WriteConflictError
from streamio.storage import RetryPolicy, Store
from streamio.storage import store as store_module
from streamio.testing import FaultProxy, GcsEndpoint, RequestRecord, S3Endpoint


def _requests() -> Counter[tuple[str, str]]:
    found = streamio.metrics.snapshot()["streamio_store_requests_total"]
    out: Counter[tuple[str, str]] = Counter()
    for labels, value in found.items():
        op, outcome = (part.split("=", 1)[1].strip('"') for part in labels.split(","))
        out[(op, outcome)] = int(value)
    return +out


def _bytes() -> tuple[int, int]:
    snap = streamio.metrics.snapshot()
    return int(snap["streamio_store_bytes_read_total"]), int(snap["streamio_store_bytes_written_total"])


def _seconds_counts() -> dict[str, int]:
    found = streamio.metrics.snapshot()["streamio_store_request_seconds"]
    return {labels.split("=", 1)[1].strip('"'): row["count"] for labels, row in found.items()}


def _op(r: RequestRecord, gcs: bool = False) -> str:
    query = r.query
    batch_delete = (r.method == "POST" and "delete" in query.split("&")) or r.path.endswith("/batch/storage/v1")
    if r.method == "DELETE" or batch_delete:
        return "delete"
    if r.method in ("PUT", "POST"):
        return "put"
    if r.method == "HEAD":
        return "head"
    if gcs:
        return "get" if "alt=media" in query else ("list" if r.path.endswith("/o") else "head")
    return "list" if "list-type" in query or "uploads" in query else "get"


def _outcome(r: RequestRecord) -> str:
    if r.method == "DELETE" and "upload_id=" in r.query and r.status == 499:
        return "ok"  # GCS's answer to the cancel of a resumable upload
    if r.fault in ("reset", "truncate") or r.status == 0:
        return "retried"
    if r.status in (429, 503):
        return "throttled"
    if r.status < 400 or r.status in (404, 412):
        return "ok"
    return "retried" if r.status >= 500 else "failed"


def _logged(proxy: FaultProxy, *, gcs: bool = False) -> Counter[tuple[str, str]]:
    """What the proxy saw, by (op, outcome), where no request failed in the end."""
    return Counter((_op(r, gcs), _outcome(r)) for r in proxy.log())


def _logged_bytes(proxy: FaultProxy) -> tuple[int, int]:
    """Object body bytes the proxy forwarded: GET responses (2xx), PUT bodies (objects and parts)."""
    log = proxy.log()
    read = sum(r.response_bytes for r in log if r.method == "GET" and _op(r) == "get" and 200 <= r.status < 300)
    written = sum(r.request_bytes for r in log if r.method == "PUT")
    return read, written


@pytest.fixture
def policy() -> RetryPolicy:
    return RetryPolicy(max_attempts=5, initial_backoff=0.01, sleep=lambda s: None)


@pytest.fixture
def proxy(moto_endpoint: str):  # type: ignore[no-untyped-def]
    with FaultProxy(moto_endpoint) as p:
        yield p


@pytest.fixture
def store(s3: S3Endpoint, proxy: FaultProxy, policy: RetryPolicy) -> Store:
    out = Store(s3.url("root"), s3.storage_options(proxy.endpoint_url), retry=policy)
    out.put("warm", b"w")  # the filesystem and the bucket check made before counting
    out.read("warm")
    return out


def _start(proxy: FaultProxy) -> None:
    proxy.clear()
    streamio.metrics.reset()


# ------------------------------------------------------------------ no faults: every op, every byte
def test_s3_requests_bytes_and_seconds_equal_the_proxy_log(store: Store, proxy: FaultProxy, monkeypatch: Any) -> None:
    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 10 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    big, small = os.urandom(12 << 20), os.urandom(70_000)
    _start(proxy)
    store.put("big", big, concurrency=3)  # create, 3 parts, complete
    version = store.put("small", small)
    assert store.read("big") == big  # the botocore client, whole
    assert b"".join(store.iter_bytes("small", 1000)) == small[1000:]  # info, then s3fs streaming
    assert store.read("small", 10, 20) == small[10:20]
    assert not store.exists("missing")  # a 404 where absence is the answer: ok
    with pytest.raises(WriteConflictError):  # a refused conditional write: 412, an answer: ok
        store.put("small", b"other", mode="create")
    store.put("small", b"cas", if_match=version)
    assert [o.path for o in store.list()] == ["big", "small", "warm"]
    store.delete("big")
    logged = _logged(proxy)
    assert _requests() == logged
    assert {op for op, _ in logged} == {"get", "put", "head", "list", "delete"}
    assert _bytes() == _logged_bytes(proxy)
    assert _bytes() == (len(big) + 10 + len(small) - 1000, len(big) + len(small) + len(b"other") + len(b"cas"))
    assert _seconds_counts() == dict(Counter(_op(r) for r in proxy.log()))  # one per response


# ------------------------------------------------------------------ faults the loop recovers from
def test_s3_storm_counts_each_503_as_throttled_and_the_success_as_ok(store: Store, proxy: FaultProxy) -> None:
    store.put("obj", b"payload")
    _start(proxy)
    proxy.fail_next(3, 503, "SlowDown", method="GET")
    proxy.fail_next(2, 429, "TooManyRequests", method="PUT")
    assert store.read("obj") == b"payload"
    store.put("obj2", b"x" * 5000)
    expected = {("get", "throttled"): 3, ("get", "ok"): 1, ("put", "throttled"): 2, ("put", "ok"): 1}
    assert _requests() == Counter(expected)
    assert _requests() == _logged(proxy)
    assert _bytes() == _logged_bytes(proxy) == (7, 3 * 5000)  # a refused PUT's body was sent too


def test_s3_cut_bodies_and_5xx_are_retried_and_their_bytes_counted(store: Store, proxy: FaultProxy) -> None:
    data = os.urandom(200_000)
    store.put("obj", data)
    _start(proxy)
    proxy.truncate_next(1, 1000, method="GET")  # the whole read (botocore): cut, read again
    assert store.read("obj") == data
    proxy.truncate_next(1, 50_000, method="GET")  # the stream (s3fs): cut, resumed at the last byte
    assert b"".join(store.iter_bytes("obj", chunk_size=1 << 16)) == data
    proxy.fail_next(1, 500, "InternalError", method="HEAD")
    assert store.info("obj").size == len(data)
    assert _requests() == Counter({("get", "retried"): 2, ("get", "ok"): 2, ("head", "retried"): 1, ("head", "ok"): 1})
    assert _requests() == _logged(proxy)
    assert _bytes() == _logged_bytes(proxy)  # a cut attempt's bytes count: the store sent them
    proxy.clear()
    streamio.metrics.reset()
    proxy.reset_after(30_000, times=1, method="GET")  # a TCP reset: what the kernel dropped never arrived
    assert b"".join(store.iter_bytes("obj", chunk_size=1 << 16)) == data
    assert _requests() == Counter({("get", "retried"): 1, ("get", "ok"): 1}) == _logged(proxy)


# ------------------------------------------------------------------ requests that fail
def test_s3_a_failed_request_counts_one_failed_and_its_other_attempts(store: Store, proxy: FaultProxy) -> None:
    store.put("obj", b"payload")
    _start(proxy)
    proxy.fail_next(100, 503, "SlowDown", method="GET")
    with pytest.raises(TransientStorageError):
        store.read("obj")
    assert _requests() == Counter({("get", "throttled"): 4, ("get", "failed"): 1})
    proxy.clear()
    proxy.fail_next(100, 500, "InternalError", method="HEAD")
    with pytest.raises(TransientStorageError):
        store.info("obj")
    proxy.fail_next(1, 403, "AccessDenied", method="GET")
    with pytest.raises(StoragePermissionError):  # permanent: failed at once, never retried
        store.read("obj")
    proxy.reset_after(0, times=100, method="GET")  # every stream cut before a byte: retried, then failed once
    with pytest.raises(TransientStorageError):
        b"".join(store.iter_bytes("obj"))
    expected = {("get", "throttled"): 4, ("head", "retried"): 4, ("head", "failed"): 1, ("get", "retried"): 4}
    assert _requests() == Counter({**expected, ("get", "failed"): 1 + 1 + 1})
    assert sum(_requests().values()) == len(proxy.log()) + 5  # the first storm's 5 were cleared from the log


def test_s3_multipart_part_that_fails_counts_once_as_failed_and_the_abort_as_ok(
    store: Store, proxy: FaultProxy, monkeypatch: Any
) -> None:
    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 10 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    _start(proxy)
    proxy.fail_next(1000, method="PUT")  # every part answers 503
    with pytest.raises(TransientStorageError):
        store.put("mp", os.urandom(12 << 20), concurrency=1)
    # create ok, the one part sent 5 times (4 throttled, the last failed), the abort ok; nothing twice
    expected = {("put", "ok"): 1, ("put", "throttled"): 4, ("put", "failed"): 1, ("delete", "ok"): 1}
    assert _requests() == Counter(expected)
    assert sum(_requests().values()) == len(proxy.log())


def test_s3_a_part_whose_connection_drops_mid_body_is_one_retried_attempt(
    store: Store, proxy: FaultProxy, monkeypatch: Any
) -> None:
    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 10 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    big = os.urandom(12 << 20)
    _start(proxy)
    proxy.on_upload_bytes(6 << 20, lambda: None)  # the second part's connection dies 1 MiB into its body
    store.put("big", big, concurrency=1)
    assert store.read("big") == big
    assert [r.fault for r in proxy.log()].count("aborted") == 1
    # aiohttp would send it again inside one request() call, unseen: each attempt is counted once
    assert _requests() == _logged(proxy) == Counter({("put", "ok"): 5, ("put", "retried"): 1, ("get", "ok"): 1})
    # a body whose connection died before any answer is not counted as written (how much left is unknown)
    assert _bytes() == (len(big), len(big))


def test_aiohttp_still_has_the_switch_that_bounded_sessions_turn_off() -> None:
    import aiohttp

    assert "_retry_connection" in aiohttp.ClientSession.ATTRS  # setting an unknown attribute warns


def test_s3_a_missing_object_is_an_answer_not_a_failure(store: Store, proxy: FaultProxy) -> None:
    _start(proxy)
    with pytest.raises(ObjectNotFoundError):
        store.read("nothing-here")
    assert _requests() == _logged(proxy)
    assert _requests()[("get", "failed")] == 0 and _requests()[("get", "ok")] == 1


# ------------------------------------------------------------------ GCS through the emulator
def test_gcs_requests_and_bytes_equal_the_proxy_log(gcs: GcsEndpoint, gcs_endpoint: str, policy: RetryPolicy) -> None:
    with FaultProxy(gcs_endpoint) as proxy:
        store = Store(gcs.url("root"), gcs.storage_options(proxy.endpoint_url), retry=policy)
        store.put("warm", b"w")
        data = os.urandom(300_000)
        _start(proxy)
        store.put("obj", data)
        proxy.fail_next(2, 503, "SlowDown", method="GET")
        proxy.truncate_next(1, 1000, method="GET")
        assert store.read("obj") == data
        assert store.info("obj").size == len(data)
        assert len(store.list()) == 2
        assert not store.exists("missing")
        store.delete("obj")
        logged = _logged(proxy, gcs=True)
        assert _requests() == logged
        assert logged[("get", "throttled")] == 2 and logged[("get", "retried")] == 1
        read = sum(r.response_bytes for r in proxy.log() if "alt=media" in r.query and 200 <= r.status < 300)
        assert _bytes() == (read, len(data))  # written: the object's bytes, not the multipart envelope


# ------------------------------------------------------------------ a checkpoint save and restore
def test_checkpoint_save_with_multipart_parts_and_restore_equal_the_proxy_log(
    s3: S3Endpoint, proxy: FaultProxy, monkeypatch: Any
) -> None:
    import torch

    from streamio.checkpoint import CheckpointManager, SaveOptions

    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    state = {"w": torch.arange(3_500_000, dtype=torch.float32), "step": 7}  # 14 MB: parts of 2 S3 parts
    _start(proxy)
    proxy.fail_next(1, 503, "SlowDown", method="PUT", path_contains="part")
    with CheckpointManager(s3.url("run"), async_save=False, storage_options=s3.storage_options(proxy.endpoint_url),
                           options=SaveOptions(part_size=12 << 20, concurrency=1)) as ckpt:
        ckpt.save(1, state)
        saved, saved_bytes = _requests(), _bytes()
        assert saved == _logged(proxy) and saved[("put", "throttled")] == 1
        assert saved_bytes == _logged_bytes(proxy) and saved_bytes[1] > 14_000_000
        assert sum(r.method == "POST" and "uploads" in r.query for r in proxy.log()) >= 1, [
            (r.method, r.path, r.query, r.request_bytes) for r in proxy.log()]  # multipart, really
        fresh = {"w": torch.zeros(3_500_000), "step": 0}
        assert ckpt.restore(fresh) == 1
    assert torch.equal(fresh["w"], state["w"])
    assert _requests() == _logged(proxy)
    assert _bytes() == _logged_bytes(proxy) and _bytes()[0] > 14_000_000


def test_gcs_a_resumable_chunk_cut_mid_body_is_retried_and_the_cancel_is_ok(
    gcs: GcsEndpoint, gcs_endpoint: str, policy: RetryPolicy, monkeypatch: Any
) -> None:
    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 10 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    with FaultProxy(gcs_endpoint) as proxy:
        store = Store(gcs.url("root"), gcs.storage_options(proxy.endpoint_url), retry=policy)
        store.put("warm", b"w")
        data = os.urandom(12 << 20)
        _start(proxy)
        proxy.on_upload_bytes(6 << 20, lambda: None)  # the second chunk's connection dies 1 MiB into it
        store.put("obj", data)
        assert store.read("obj") == data
        # the failed upload is cancelled (DELETE, answered 499 by GCS) and made again whole
        assert [(r.method, r.status) for r in proxy.log()].count(("DELETE", 499)) == 1
        assert _requests() == _logged(proxy, gcs=True)
        assert _requests()[("delete", "ok")] == 1 and _requests()[("put", "retried")] == 1


# ------------------------------------------------------------------ a dataset epoch, 2 DataLoader workers
@pytest.mark.slow
def test_dataset_epoch_with_two_workers_equals_the_proxy_log(s3: S3Endpoint, proxy: FaultProxy) -> None:
    from streamio.data.loader import StreamingDataLoader
    from support.dataset import all_keys, make_dataset

    counts = [40, 30, 50, 20]
    make_dataset(s3.url("ds"), s3.storage_options(), counts)  # written around the proxy: not counted
    _start(proxy)
    proxy.fail_next(2, 503, "SlowDown", method="GET", path_contains="part001")  # a storm inside a worker
    ds = _Reporting(s3.url("ds"), batch_size=10, shuffle=False, storage_options=s3.storage_options(proxy.endpoint_url))
    loader = StreamingDataLoader(ds, num_workers=2, collate_fn=lambda batch: [s["__key__"] for s in batch])
    keys = [k for batch in loader for k in batch]
    assert sorted(keys) == sorted(all_keys(counts))
    # the workers' counts reached this process once the epoch's iterator was exhausted
    assert _requests() == _logged(proxy)
    assert _requests()[("get", "throttled")] == 2
    assert _bytes() == _logged_bytes(proxy)
    assert _bytes()[0] > 0


def _reporting_class() -> type:
    from streamio.data.dataset import StreamingDataset

    class Reporting(StreamingDataset):  # type: ignore[misc]
        """Reports a worker's metrics when its iterator ends (until StreamingDataset does it itself)."""

        def __iter__(self) -> Any:
            try:
                yield from super().__iter__()
            finally:
                streamio.metrics.report()

    return Reporting


def _Reporting(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - a class, made on first use
    return _reporting_class()(*args, **kwargs)
