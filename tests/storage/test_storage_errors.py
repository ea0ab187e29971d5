"""Clear storage errors: a missing bucket, an unreachable endpoint, refused access and an unknown
protocol each say what they are, from the Store, the checkpoint manager, the dataset index and the
CLI; "nothing here" (no checkpoint, no index.json, an empty listing) only for a root that is there.

Everything runs against real servers: moto (the session's, and one with authentication on, in
its own process), fake-gcs-server, Python's HTTP server, and closed ports on 127.0.0.1.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from streamio.checkpoint import CheckpointManager
from streamio.cli.main import cli
from streamio.data.format.index import load_index
from streamio.errors import (
    BucketNotFoundError,
    CheckpointNotFoundError,
    ConfigError,
    IndexNotFoundError,
    ObjectNotFoundError,
    StoragePermissionError,
    StorageUnreachableError,
    TransientStorageError,
    UnsupportedProtocolError,
)
from streamio.storage import RetryPolicy, Store
from streamio.testing import FaultProxy, GcsEndpoint, S3Endpoint
from support.auth_s3 import AuthS3, auth_moto


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def policy(sleeps: list[float]) -> RetryPolicy:
    return RetryPolicy(max_attempts=3, initial_backoff=0.01, sleep=sleeps.append)


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def store_calls(store: Store) -> dict[str, Callable[[], Any]]:
    """Every Store call that used to say "not found" / "empty" for a root that is not there."""
    return {
        "read": lambda: store.read("k"),
        "iter_bytes": lambda: list(store.iter_bytes("k")),
        "info": lambda: store.info("k"),
        "exists": lambda: store.exists("k"),
        "list": lambda: store.list(),
        "put": lambda: store.put("k", b"v"),
    }


def cli_run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def s3_cli_options(s3: S3Endpoint) -> list[str]:
    return ["-o", f"endpoint_url={s3.endpoint_url}", "-o", f"key={s3.key}", "-o", f"secret={s3.secret}",
            "-o", f"client_kwargs.region_name={s3.region}"]


# ------------------------------------------------------------------ missing bucket
@pytest.mark.parametrize("call", ["read", "iter_bytes", "info", "exists", "list", "put"])
def test_s3_missing_bucket_is_its_own_error_naming_the_bucket(s3: S3Endpoint, call: str) -> None:
    bucket = f"streamio-gone-{uuid.uuid4().hex[:8]}"
    store = Store(f"s3://{bucket}/root", s3.storage_options())
    with pytest.raises(BucketNotFoundError) as info:
        store_calls(store)[call]()
    msg = str(info.value)
    assert f"bucket {bucket!r} does not exist" in msg and "create the bucket" in msg
    assert f"s3://{bucket}/root" in msg
    # not a FileNotFoundError: every `except FileNotFoundError: <nothing there yet>` lets it through
    assert not isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("call", ["read", "iter_bytes", "info", "exists", "list", "put"])
def test_gcs_missing_bucket_is_its_own_error_naming_the_bucket(gcs: GcsEndpoint, call: str) -> None:
    bucket = f"streamio-gone-{uuid.uuid4().hex[:8]}"
    store = Store(f"gs://{bucket}/root", gcs.storage_options())
    with pytest.raises(BucketNotFoundError) as info:
        store_calls(store)[call]()
    assert f"bucket {bucket!r} does not exist" in str(info.value) and f"gs://{bucket}/root" in str(info.value)


def test_a_reachable_empty_root_still_says_nothing_is_there(s3: S3Endpoint, gcs: GcsEndpoint) -> None:
    for store in (Store(s3.url("empty"), s3.storage_options()), Store(gcs.url("empty"), gcs.storage_options())):
        assert store.list() == [] and not store.exists("k")
        with pytest.raises(ObjectNotFoundError):
            store.read("k")
        with pytest.raises(CheckpointNotFoundError, match="nothing to restore"):
            CheckpointManager(store.root_url, storage_options=store._options).restore({})
        with pytest.raises(IndexNotFoundError):
            load_index(store)


def test_bucket_is_checked_once_per_store(s3: S3Endpoint) -> None:
    with FaultProxy(s3.endpoint_url) as proxy:
        store = Store(s3.url("empty"), s3.storage_options(proxy.endpoint_url))
        for _ in range(3):
            assert store.list() == []
            assert not store.exists("k")
        assert store.child("sub").list() == []
        buckets = [r for r in proxy.log() if r.method == "HEAD" and r.path.rstrip("/") == f"/{s3.bucket}"]
        assert len(buckets) == 1, proxy.log()


def test_restore_and_index_on_a_missing_bucket_do_not_say_start_from_scratch(s3: S3Endpoint) -> None:
    url = f"s3://streamio-gone-{uuid.uuid4().hex[:8]}/run"
    mgr = CheckpointManager(url, storage_options=s3.storage_options())
    with pytest.raises(BucketNotFoundError):
        mgr.restore({})
    with pytest.raises(BucketNotFoundError):
        mgr.latest_step()
    with pytest.raises(BucketNotFoundError):
        load_index(Store(url, s3.storage_options()))


@pytest.mark.parametrize("verb", [["ckpt", "ls"], ["inspect"], ["ls"]])
def test_cli_on_a_missing_bucket_fails_naming_it(s3: S3Endpoint, verb: list[str]) -> None:
    bucket = f"streamio-gone-{uuid.uuid4().hex[:8]}"
    code, out = cli_run(*verb, f"s3://{bucket}/x", *s3_cli_options(s3))
    assert code != 0, out
    assert f"bucket {bucket!r} does not exist" in out
    assert "no checkpoints" not in out and "no index.json" not in out and "Traceback" not in out


# ------------------------------------------------------------------ unreachable endpoint
@pytest.mark.parametrize("call", ["read", "iter_bytes", "info", "exists", "list", "put"])
def test_s3_connection_refused_names_the_endpoint_after_the_policy(
    s3: S3Endpoint, closed_port: int, policy: RetryPolicy, sleeps: list[float], call: str
) -> None:
    store = Store(s3.url("root"), s3.storage_options(f"http://127.0.0.1:{closed_port}"), retry=policy)
    with pytest.raises(StorageUnreachableError) as info:
        store_calls(store)[call]()
    msg = str(info.value)
    assert f"cannot reach the storage endpoint http://127.0.0.1:{closed_port}" in msg
    assert "connection was refused" in msg and "3 attempt(s)" in msg and "endpoint_url" in msg
    assert len(sleeps) == 2  # retried under the policy (a refusal may be a restart), then named
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, TransientStorageError)
    assert not isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize("call", ["read", "exists", "list"])
def test_gcs_connection_refused_names_the_endpoint(
    gcs: GcsEndpoint, closed_port: int, policy: RetryPolicy, call: str
) -> None:
    store = Store(gcs.url("root"), gcs.storage_options(f"http://127.0.0.1:{closed_port}"), retry=policy)
    with pytest.raises(StorageUnreachableError, match=f"127.0.0.1:{closed_port}"):
        store_calls(store)[call]()


@pytest.fixture
def http_root(tmp_path: Any) -> Iterator[str]:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a").write_bytes(b"hello")
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ds"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


def test_http_connection_refused_is_not_a_missing_object(closed_port: int, policy: RetryPolicy) -> None:
    # fsspec's HTTP filesystem raises FileNotFoundError for a refused connection: that read as
    # "no index.json"
    store = Store(f"http://127.0.0.1:{closed_port}/ds", retry=policy)
    for call in ("read", "info", "exists", "list"):
        with pytest.raises(StorageUnreachableError, match=f"127.0.0.1:{closed_port}"):
            store_calls(store)[call]()
    with pytest.raises(StorageUnreachableError):
        load_index(store)


def test_http_missing_object_on_a_live_server_is_still_not_found(http_root: str, policy: RetryPolicy) -> None:
    store = Store(http_root, retry=policy)
    assert store.read("a") == b"hello"
    with pytest.raises(ObjectNotFoundError):
        store.read("b")
    assert not store.exists("b")


def test_unresolvable_host_says_so(s3: S3Endpoint, policy: RetryPolicy) -> None:
    store = Store(s3.url("root"), s3.storage_options("http://streamio-no-such-host.invalid:9000"), retry=policy)
    with pytest.raises(StorageUnreachableError) as info:
        store.read("k")
    assert "streamio-no-such-host.invalid:9000" in str(info.value) and "does not resolve" in str(info.value)


def test_cli_inspect_on_a_closed_port_says_unreachable(s3: S3Endpoint, closed_port: int) -> None:
    opts = ["-o", f"endpoint_url=http://127.0.0.1:{closed_port}", "-o", f"key={s3.key}", "-o", f"secret={s3.secret}"]
    code, out = cli_run("inspect", s3.url("ds"), *opts)
    assert code != 0 and "cannot reach the storage endpoint" in out and "no index.json" not in out, out


# ------------------------------------------------------------------ access denied (moto checks credentials)
@pytest.fixture(scope="module")
def auth_s3() -> Iterator[AuthS3]:
    with auth_moto() as server:
        yield server


@pytest.mark.parametrize("who", ["no-policy", "wrong-secret", "unknown-key"])
def test_access_denied_is_a_permission_error_everywhere(auth_s3: AuthS3, who: str) -> None:
    key, secret = {"no-policy": auth_s3.denied, "wrong-secret": (auth_s3.allowed[0], "wrong"),
                   "unknown-key": ("AKIAUNKNOWN000000000", "x")}[who]
    store = Store(auth_s3.url("root"), auth_s3.options(key, secret), retry=RetryPolicy(max_attempts=1))
    for name, call in store_calls(store).items():
        with pytest.raises(StoragePermissionError) as info:
            call()
        assert auth_s3.url("root") in str(info.value) and "credentials" in str(info.value), name
    with pytest.raises(StoragePermissionError):
        CheckpointManager(auth_s3.url("run"), storage_options=auth_s3.options(key, secret)).restore({})
    with pytest.raises(StoragePermissionError):
        load_index(store)


def test_allowed_user_on_the_checking_server_works(auth_s3: AuthS3) -> None:
    store = Store(auth_s3.url("ok"), auth_s3.options(*auth_s3.allowed))
    store.put("k", b"v")
    assert store.read("k") == b"v" and [o.path for o in store.list()] == ["k"]
    with pytest.raises(ObjectNotFoundError):
        store.read("missing")


# ------------------------------------------------------------------ unknown protocol
def test_unknown_protocol_names_it_and_the_known_ones() -> None:
    with pytest.raises(UnsupportedProtocolError) as info:
        Store("foo://bucket/x")
    msg = str(info.value)
    assert "unknown storage protocol 'foo' in foo://bucket/x" in msg and "s3://" in msg and "gs://" in msg
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnsupportedProtocolError, match="did you mean s3://"):
        Store("s4://bucket/x")
    with pytest.raises(UnsupportedProtocolError, match="'foo'"):
        Store("simplecache::foo://bucket/x")
    with pytest.raises(UnsupportedProtocolError):
        CheckpointManager("foo://bucket/x")


@pytest.mark.parametrize(("url", "meant"), [("s3:/bucket/x", "s3://bucket/x"), ("gs:bucket", "gs://bucket")])
def test_a_scheme_with_one_slash_says_what_was_meant(url: str, meant: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """fsspec reads ``s3:/bucket`` as a local path: a dataset would silently be looked for on disk."""
    with pytest.raises(UnsupportedProtocolError, match=f"did you mean {meant}\\?"):
        Store(url)
    code, out = cli_run("inspect", url)
    assert code == 2 and f"did you mean {meant}?" in out and "Traceback" not in out, out


def test_drive_letters_and_explicit_relative_paths_are_local_paths(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    Store("./s3:/x").put("k", b"v")
    assert (tmp_path / "s3:" / "x" / "k").read_bytes() == b"v"
    Store("C:/data")  # a Windows drive, not a scheme


@pytest.mark.skipif(importlib.util.find_spec("adlfs") is not None, reason="adlfs is installed here")
def test_known_protocol_without_its_package_names_what_to_install() -> None:
    store = Store("az://container/x")
    with pytest.raises(UnsupportedProtocolError, match="adlfs"):
        store.list()


def test_cli_unknown_protocol_is_one_line() -> None:
    code, out = cli_run("inspect", "foo://bucket/x")
    assert code != 0 and "unknown storage protocol 'foo'" in out and "Traceback" not in out, out


@pytest.mark.parametrize("url", [None, 3, b"s3://b/x", (s for s in "ab")])
def test_a_url_that_is_not_a_string_is_named(url: object) -> None:
    """write_dataset(url, samples) (the arguments swapped) said "'generator' object has no attribute 'rstrip'"."""
    with pytest.raises(ConfigError, match="must be a string"):
        Store(url)  # type: ignore[arg-type]
