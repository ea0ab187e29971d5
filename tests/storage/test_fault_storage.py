"""One test per injected fault: what the Store does about it and the requests it costs.

Faults go through streamio.testing.FaultProxy over real HTTP to moto / fake-gcs-server, so the
real client stacks (s3fs/aiobotocore/aiohttp, gcsfs) see them. Retries never sleep here: the
policy gets ``sleep=`` a recorder.
"""

from __future__ import annotations

import os
import pickle
import time

import pytest

from streamio.checksum import checksum_bytes
from streamio.errors import (
    BucketNotFoundError,
    ObjectNotFoundError,
    StoragePermissionError,
    TransientStorageError,
    WriteConflictError,
)
from streamio.storage import RetryPolicy, Store
from streamio.storage import secrets as storage_secrets
from streamio.storage import store as store_module
from streamio.testing import FaultProxy, GcsEndpoint, S3Endpoint
from streamio.testing.s3 import SECRET_KEY


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def policy(sleeps: list[float]) -> RetryPolicy:
    return RetryPolicy(max_attempts=5, initial_backoff=0.2, max_backoff=1.0, sleep=sleeps.append)


@pytest.fixture
def s3_proxy(moto_endpoint: str):  # type: ignore[no-untyped-def]
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def s3_store(s3: S3Endpoint, s3_proxy: FaultProxy, policy: RetryPolicy) -> Store:
    return Store(s3.url("root"), s3.storage_options(s3_proxy.endpoint_url), retry=policy)


@pytest.fixture
def gcs_proxy(gcs_endpoint: str):  # type: ignore[no-untyped-def]
    with FaultProxy(gcs_endpoint) as proxy:
        yield proxy


@pytest.fixture
def gcs_store(gcs: GcsEndpoint, gcs_proxy: FaultProxy, policy: RetryPolicy) -> Store:
    return Store(gcs.url("root"), gcs.storage_options(gcs_proxy.endpoint_url), retry=policy)


# ------------------------------------------------------------------ 5xx / throttling
@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (500, "InternalError"), (429, "TooManyRequests")])
def test_s3_storm_of_three_is_retried_and_succeeds(
    s3_store: Store, s3_proxy: FaultProxy, sleeps: list[float], status: int, code: str
) -> None:
    s3_store.put("obj", b"payload")
    s3_proxy.clear()
    s3_proxy.fail_next(3, status, code)
    assert s3_store.read("obj") == b"payload"
    assert [r.status for r in s3_proxy.log()] == [status] * 3 + [200]
    assert len(sleeps) == 3  # one backoff per retry, full jitter under the growing cap
    assert all(0 <= s <= cap for s, cap in zip(sleeps, [0.2, 0.4, 0.8], strict=False))


def test_s3_persistent_503_costs_exactly_max_attempts(s3_store: Store, s3_proxy: FaultProxy) -> None:
    s3_store.put("obj", b"payload")
    s3_proxy.clear()
    s3_proxy.fail_next(100)
    with pytest.raises(TransientStorageError) as info:
        s3_store.read("obj")
    # botocore and s3fs retries are configured down: attempts do not multiply
    assert s3_proxy.count() == 5
    assert s3_store.url("obj") in str(info.value) and "SlowDown" in str(info.value)


def test_s3_put_storm_is_retried(s3_store: Store, s3_proxy: FaultProxy) -> None:
    s3_proxy.fail_next(3, method="PUT")
    s3_store.put("obj", b"abc")
    assert s3_proxy.count("PUT") == 4
    assert s3_store.read("obj") == b"abc"


def test_gcs_storm_of_three_is_retried_and_succeeds(gcs_store: Store, gcs_proxy: FaultProxy) -> None:
    gcs_store.put("obj", b"payload")
    gcs_proxy.clear()
    gcs_proxy.fail_next(3, 503)
    assert gcs_store.read("obj") == b"payload"
    assert [r.status for r in gcs_proxy.log()][:3] == [503] * 3
    assert gcs_proxy.count() == 4  # gcsfs's own retry decorator is bypassed: no multiplication


# ------------------------------------------------------------------ permanent errors: one attempt
@pytest.mark.parametrize("code", ["AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"])
def test_s3_403_fails_in_one_attempt_naming_the_url(s3_store: Store, s3_proxy: FaultProxy, code: str) -> None:
    s3_proxy.fail_next(1, 403, code)
    with pytest.raises(StoragePermissionError) as info:
        s3_store.read("obj")
    assert s3_proxy.count() == 1
    assert s3_store.url("obj") in str(info.value) and "credentials" in str(info.value)
    assert isinstance(info.value, PermissionError)


def test_gcs_403_fails_in_one_attempt(gcs_store: Store, gcs_proxy: FaultProxy) -> None:
    gcs_proxy.fail_next(1, 403, "Forbidden")
    with pytest.raises(StoragePermissionError) as info:
        gcs_store.read("obj")
    assert gcs_proxy.count() == 1 and gcs_store.url("obj") in str(info.value)


def test_s3_missing_bucket_fails_in_one_attempt(s3: S3Endpoint, s3_proxy: FaultProxy, policy: RetryPolicy) -> None:
    store = Store("s3://streamio-no-such-bucket/x", s3.storage_options(s3_proxy.endpoint_url), retry=policy)
    for call in (lambda: store.read("k"), lambda: store.put("k", b"1"), lambda: list(store.iter_bytes("k"))):
        s3_proxy.clear()
        with pytest.raises(BucketNotFoundError) as info:
            call()
        assert s3_proxy.count() == 1, s3_proxy.log()
        assert "s3://streamio-no-such-bucket/x/k" in str(info.value)


def test_s3_missing_key_fails_in_one_attempt(s3_store: Store, s3_proxy: FaultProxy) -> None:
    with pytest.raises(ObjectNotFoundError):
        s3_store.info("missing")
    with pytest.raises(ObjectNotFoundError):
        list(s3_store.iter_bytes("missing"))
    # + one HEAD of the bucket: a HEAD's bare 404 does not say whether the bucket exists (once per Store)
    assert s3_proxy.count() == 3 and s3_proxy.count("HEAD") == 2, s3_proxy.log()


def test_gcs_missing_bucket_fails_in_one_attempt(gcs: GcsEndpoint, gcs_proxy: FaultProxy, policy: RetryPolicy) -> None:
    store = Store("gs://streamio-no-such-bucket/x", gcs.storage_options(gcs_proxy.endpoint_url), retry=policy)
    with pytest.raises(BucketNotFoundError) as info:
        store.read("k")
    # the object's 404 does not say which is missing: one more request asks about the bucket
    assert gcs_proxy.count() == 2 and "gs://streamio-no-such-bucket/x/k" in str(info.value)


# ------------------------------------------------------------------ resets and truncation: resume
def test_s3_64mb_read_with_reset_every_8mb_resumes_by_range(s3_store: Store, s3_proxy: FaultProxy) -> None:
    data = os.urandom(64 << 20)
    s3_store.put("big", data)
    s3_proxy.clear()
    s3_proxy.reset_after(8 << 20)
    got = bytearray()
    for chunk in s3_store.iter_bytes("big"):
        got += chunk
    assert got == data
    gets = [r for r in s3_proxy.log() if r.method == "GET"]
    # each response is cut after 8 MiB; a RST also drops what the client had not read yet,
    # so a few more than 64/8 are normal. A restart from byte 0 would never finish.
    assert 8 <= len(gets) <= 16, [(r.range, r.response_bytes) for r in gets]
    assert gets[0].range is None
    starts = [int(r.range.split("=")[1].split("-")[0]) for r in gets[1:]]
    assert starts == sorted(starts) and starts[-1] > 0
    assert all(r.range.endswith(f"-{len(data) - 1}") for r in gets[1:])
    assert sum(r.response_bytes for r in gets) < 2 * len(data)


def test_s3_truncated_body_is_detected_and_resumed(s3_store: Store, s3_proxy: FaultProxy) -> None:
    data = os.urandom(1 << 20)
    s3_store.put("t", data)
    s3_proxy.clear()
    s3_proxy.set_bandwidth(20e6)  # bytes trickle in, as over a real network, and get consumed
    s3_proxy.truncate_next(1, 300_000)
    assert b"".join(s3_store.iter_bytes("t")) == data
    gets = s3_proxy.log()
    assert [r.fault for r in gets] == ["truncate", None]
    # aiohttp drops what it had buffered when it sees the short body, so the resume starts at
    # or before the cut, never at 0
    resumed_at = int(gets[1].range.split("=")[1].split("-")[0])
    assert 0 < resumed_at <= 300_000 and gets[1].range.endswith(f"-{len(data) - 1}")


def test_s3_truncated_ranged_read_is_retried(s3_store: Store, s3_proxy: FaultProxy) -> None:
    data = os.urandom(1 << 20)
    s3_store.put("t", data)
    s3_proxy.clear()
    s3_proxy.truncate_next(1, 1000)
    assert s3_store.read("t", 10, 500_000) == data[10:500_000]
    assert s3_proxy.count("GET") == 2


def test_s3_whole_read_cut_by_a_reset_starts_the_range_again(s3_store: Store, s3_proxy: FaultProxy) -> None:
    # Store.read on S3 reads in the calling thread (the backend's sync client): a body lost mid-way is fetched again
    data = os.urandom(2 << 20)
    s3_store.put("w", data)
    s3_proxy.clear()
    s3_proxy.reset_after(700_000, times=2)
    assert s3_store.read("w") == data
    gets = [r for r in s3_proxy.log() if r.method == "GET"]
    assert [(r.fault, r.range) for r in gets] == [("reset", None), ("reset", None), (None, None)]
    s3_proxy.clear()
    s3_proxy.truncate_next(1, 1000)
    assert s3_store.read("w", 5) == data[5:]
    gets = s3_proxy.log()
    # no HEAD for the length: botocore checks it
    assert [r.fault for r in gets] == ["truncate", None] and gets[1].range == "bytes=5-"


def test_s3_read_past_the_end_is_corrupt_data_not_a_retry(s3_store: Store, s3_proxy: FaultProxy) -> None:
    from streamio.errors import CorruptDataError

    s3_store.put("short", b"0123456789")
    s3_proxy.clear()
    with pytest.raises(CorruptDataError, match="ends at byte 10, before the requested end 50"):
        s3_store.read("short", 2, 50)
    assert s3_proxy.count("GET") == 1


def test_s3_reads_in_parallel_threads_use_one_client(s3_store: Store, s3_proxy: FaultProxy) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from streamio.storage.backends import s3 as s3_backend

    blobs = {f"p{i}": os.urandom(300_000 + i) for i in range(8)}
    for k, v in blobs.items():
        s3_store.put(k, v)
    assert s3_backend.cached_client(s3_store.fs) is None  # puts go through s3fs
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(s3_store.read, blobs)) == list(blobs.values())
    made = s3_backend.cached_client(s3_store.fs)  # the reads made it, once for all threads
    assert made is not None and s3_backend.sync_client(s3_store.fs) is made
    assert s3_store.read_many(list(blobs)) == list(blobs.values())


def test_s3_sync_client_mirrors_the_filesystem_settings(s3: S3Endpoint) -> None:
    from botocore import UNSIGNED

    from streamio.storage.backends import s3 as s3_backend

    opts = {
        **s3.storage_options(),
        "requester_pays": True,
        "s3_additional_kwargs": {"ACL": "private", "SSECustomerAlgorithm": "AES256"},
    }
    fs = Store(s3.url("x"), opts).fs
    client = s3_backend.sync_client(fs)
    assert client.meta.endpoint_url == s3.endpoint_url
    assert client.meta.config.retries["total_max_attempts"] == 1  # the store's policy retries, not botocore
    # only what GetObject takes (ACL is a PutObject parameter)
    assert s3_backend._extra_kwargs(fs, client) == {"RequestPayer": "requester", "SSECustomerAlgorithm": "AES256"}
    anon = Store(s3.url("x"), {"anon": True, "endpoint_url": s3.endpoint_url}).fs
    assert s3_backend.sync_client(anon).meta.config.signature_version is UNSIGNED


def test_s3_caller_session_keeps_the_s3fs_path(s3: S3Endpoint) -> None:
    from aiobotocore.session import AioSession

    from streamio.storage.backends import s3 as s3_backend

    store = Store(s3.url("sess"), {**s3.storage_options(), "session": AioSession()})
    store.put("k", b"v" * 1000)
    assert store.read("k") == b"v" * 1000 and store.read("k", 10, 20) == b"v" * 10
    assert s3_backend.cached_client(store.fs) is None


def test_s3_filesystems_alike_but_made_under_other_endpoints_get_their_own_clients(
    s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec filesystems made with the same arguments compare equal whatever ``AWS_ENDPOINT_URL``
    said when they were made; a client table keyed by them served the second one the first one's
    endpoint (a benchmark test met NoSuchBucket from another moto server)."""
    from streamio.storage.backends import s3 as s3_backend

    for name, value in s3.env("http://127.0.0.1:9").items():  # nothing listens on port 9
        monkeypatch.setenv(name, value)
    elsewhere = Store(s3.url("x")).fs
    assert s3_backend.sync_client(elsewhere).meta.endpoint_url == "http://127.0.0.1:9"
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    store = Store(s3.url("x"))
    assert store.fs == elsewhere  # the premise: equal to fsspec
    store.put("k", b"v")
    assert store.read("k") == b"v"  # not sent to port 9
    assert s3_backend.sync_client(store.fs).meta.endpoint_url == s3.endpoint_url


def test_s3_reset_with_no_progress_exhausts_the_policy(s3_store: Store, s3_proxy: FaultProxy) -> None:
    s3_store.put("r", os.urandom(100_000))
    s3_proxy.clear()
    s3_proxy.reset_after(0)
    with pytest.raises(TransientStorageError) as info:
        list(s3_store.iter_bytes("r"))
    assert s3_proxy.count("GET") == 5 and s3_store.url("r") in str(info.value)


def test_gcs_reset_mid_body_resumes(gcs_store: Store, gcs_proxy: FaultProxy) -> None:
    data = os.urandom(3 << 20)
    gcs_store.put("g", data)
    gcs_proxy.clear()
    gcs_proxy.set_bandwidth(40e6)
    gcs_proxy.reset_after(1 << 20, times=2)
    assert b"".join(gcs_store.iter_bytes("g")) == data
    gets = gcs_proxy.log()
    assert 3 <= len(gets) <= 7 and gets[0].range is None
    # a resume starts where the bytes received so far end (0 only if a RST ate them all)
    starts = [int(r.range.split("=")[1].split("-")[0]) for r in gets[1:]]
    assert starts == sorted(starts) and starts[-1] > 0


def test_first_bytes_arrive_before_the_body_completes(s3_store: Store, s3_proxy: FaultProxy) -> None:
    s3_store.put("slow", os.urandom(4 << 20))
    s3_proxy.clear()
    s3_proxy.set_bandwidth(8 << 20)  # ~0.5 s for the whole body
    stream = s3_store.iter_bytes("slow")
    first = next(stream)
    assert 0 < len(first) < 4 << 20
    assert s3_proxy.count("GET") == 0  # the proxy logs a response when its last byte leaves
    stream.close()


# ------------------------------------------------------------------ corruption: not the store's job
def test_corruption_passes_the_store_silently_and_the_checksum_catches_it(
    s3_store: Store, s3_proxy: FaultProxy
) -> None:
    data = os.urandom(200_000)
    s3_store.put("c", data)
    s3_proxy.clear()
    s3_proxy.corrupt_next(1, 12_345)
    got = b"".join(s3_store.iter_bytes("c", 1))  # a ranged read: nothing below us checks it
    assert len(got) == len(data) - 1 and got != data[1:]  # wrong bytes, no error
    assert checksum_bytes(got) != checksum_bytes(data[1:])  # what the index/manifest checks catch
    assert s3_proxy.log()[-1].fault == "corrupt"


# ------------------------------------------------------------------ conditional writes under faults
def test_gcs_create_conflict_reported_from_a_412(gcs_store: Store, gcs_proxy: FaultProxy) -> None:
    gcs_proxy.fail_next(1, 412, "PreconditionFailed", method="POST")
    with pytest.raises(WriteConflictError) as info:
        gcs_store.put("latest.json", b"{}", mode="create")
    assert gcs_proxy.count() == 1 and gcs_store.url("latest.json") in str(info.value)


def test_s3_multipart_put_parallel_parts_retry_and_conditions(
    s3: S3Endpoint, s3_store: Store, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 10 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    data = os.urandom(12 << 20)
    s3_proxy.fail_next(1, 503, method="PUT")  # one part fails once, only that part is retried
    v1 = s3_store.put("mp", data, mode="create", concurrency=3)
    assert s3_proxy.count("PUT") == 4  # 3 parts + 1 retry
    assert s3_store.read("mp") == data and s3_store.info("mp").version == v1
    with pytest.raises(WriteConflictError):
        s3_store.put("mp", data[::-1], mode="create")
    with pytest.raises(WriteConflictError):
        s3_store.put("mp", data[::-1], if_match="0123456789abcdef0123456789abcdef-3")
    assert s3_store.read("mp") == data
    s3_store.put("mp", data[::-1], if_match=v1)
    assert s3_store.read("mp") == data[::-1]
    client = s3.boto3_client()
    assert client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []  # losers were aborted


def test_s3_multipart_persistent_part_failure_does_not_multiply_attempts(
    s3: S3Endpoint, s3_store: Store, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 10 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 5 << 20)
    s3_proxy.fail_next(1000, method="PUT")  # every part upload answers 503
    with pytest.raises(TransientStorageError) as info:
        s3_store.put("mp", os.urandom(12 << 20), concurrency=1)
    # the part's own policy spends its 5 attempts; the put around it does not retry that again
    assert s3_proxy.count("PUT") == 5, s3_proxy.log()
    assert "part 1/3" in str(info.value)
    assert s3.boto3_client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []


# ------------------------------------------------------------------ credentials never pickled
def test_pickled_store_holds_no_credentials(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(s3.url("root"), s3.storage_options())
    store.put("k", b"v")
    blob = pickle.dumps(store)
    assert SECRET_KEY.encode() not in blob and s3.key.encode() not in blob
    assert pickle.loads(blob).read("k") == b"v"  # same process (or a fork): resolved
    assert SECRET_KEY not in repr(store)
    # a spawned process has none of this process's memory: simulate it with an empty vault
    monkeypatch.setattr(storage_secrets, "_VAULT", {})
    orphan = pickle.loads(blob)
    with pytest.raises(StoragePermissionError) as info:
        orphan.read("k")
    assert "never pickles secrets" in str(info.value) and s3.url("root") in str(info.value)
    assert "secret" in str(info.value) and SECRET_KEY not in str(info.value)


# ------------------------------------------------------------------ a writer killed mid-upload
def _child_put(url: str, options: dict, size: int, threshold: int) -> None:  # type: ignore[type-arg]
    """Child: one put through the proxy (killed by the parent half-way)."""
    store_module.MULTIPART_THRESHOLD = threshold
    store_module.PART_SIZE = 5 << 20
    Store(url, options, retry=RetryPolicy(max_attempts=1)).put("victim", os.urandom(size), concurrency=1)


@pytest.mark.slow
@pytest.mark.parametrize("multipart", [False, True], ids=["single-put", "multipart"])
def test_s3_writer_killed_mid_upload_leaves_nothing_visible(
    s3: S3Endpoint, s3_proxy: FaultProxy, multipart: bool
) -> None:
    import multiprocessing
    import signal

    size = 12 << 20 if multipart else 3 << 20
    threshold = 10 << 20 if multipart else 64 << 20
    store = Store(s3.url("root"), s3.storage_options())
    store.put("victim", b"old")  # a previous complete version must survive intact
    # forkserver: a clean child (no inherited server threads); the imports are paid once, in the
    # server, if this is the first forkserver use of the session (else by the child itself)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["streamio.storage", __name__])
    child = ctx.Process(
        target=_child_put, args=(s3.url("root"), s3.storage_options(s3_proxy.endpoint_url), size, threshold)
    )

    def kill() -> None:  # runs in the proxy before it forwards the rest: a deterministic cut point
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        # wait until it is gone (reaped by the forkserver), without join(): two threads joining
        # one forkserver child race for its exit status
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(child.pid, 0)  # type: ignore[arg-type]
            except ProcessLookupError:
                return
            time.sleep(0.01)

    s3_proxy.on_upload_bytes(size // 2 + 1000, kill)  # inside the body (multipart: inside part 2)
    child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, (child.exitcode, s3_proxy.log())
    assert store.read("victim") == b"old"
    assert [o.path for o in store.list()] == ["victim"]
    if multipart:  # invisible, but billed until aborted or expired by a lifecycle rule
        uploads = s3.boto3_client().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
        assert [u["Key"] for u in uploads] == ["root/victim"]
