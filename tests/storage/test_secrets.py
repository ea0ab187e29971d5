"""Secrets by default: no credential in a Store's repr, its URLs, its errors, its pickle or the logs.

Each case is a credential outside the names the old redaction listed: userinfo in the URL,
``headers={"Authorization": ...}``, ``client_kwargs={"auth": ...}``, an Azure
``connection_string``, userinfo inside ``endpoint_url``, and the usual ``key``/``secret``/
``token``. The credentials are real where a server can check them: an HTTP server that demands
them, and a moto server with authentication on (DataLoader workers over it must still read).
"""

from __future__ import annotations

import base64
import functools
import http.server
import importlib.util
import logging
import multiprocessing
import pickle
import socket
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.errors import (
    ObjectNotFoundError,
    StoragePermissionError,
    StorageUnreachableError,
    StreamioError,
    UnsupportedProtocolError,
)
from streamio.storage import RetryPolicy, Store
from streamio.storage import secrets as storage_secrets
from streamio.testing import S3Endpoint
from support.auth_s3 import AuthS3, auth_moto
from support.dataset import all_keys, make_dataset

USER, PASSWORD = "alice", "url-password-7Hq2"  # noqa: S105 - test credentials
WRONG = "wrong-pass-9a"  # noqa: S105 - (as a name: tracebacks quote source lines)
BEARER = "bearer-token-Zx81Pq"  # noqa: S105


def _no_sleep(seconds: float) -> None:
    """The retry policy's sleep in these tests (a module function: the policy is pickled with a Store)."""


FAST = RetryPolicy(max_attempts=2, initial_backoff=0.01, sleep=_no_sleep)
# aiohttp 3.13 deprecates BasicAuth, which it still builds itself from a URL's userinfo
AIOHTTP_BASIC_AUTH = pytest.mark.filterwarnings(
    "ignore:BasicAuth is deprecated:DeprecationWarning", "ignore:The 'auth' parameter is deprecated:DeprecationWarning"
)


class _AuthHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files only to ``USER:PASSWORD`` (Basic) or ``Bearer BEARER``; 401 otherwise."""

    ok = {f"Basic {base64.b64encode(f'{USER}:{PASSWORD}'.encode()).decode()}", f"Bearer {BEARER}"}

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") in self.ok:
            return True
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_GET(self) -> None:
        if self._allowed():
            super().do_GET()

    def do_HEAD(self) -> None:
        if self._allowed():
            super().do_HEAD()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def http_host(tmp_path: Any) -> Iterator[str]:
    """``127.0.0.1:PORT`` of a server holding ``/ds/a`` = b"hello" for authenticated clients."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a").write_bytes(b"hello")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_AuthHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_nowhere(secrets: tuple[str, ...], *, store: Store, errors: list[BaseException], logs: str) -> None:
    """None of ``secrets`` in the store's repr, URLs or pickle, the errors (with their tracebacks), the logs."""
    blob = pickle.dumps(store)
    shown = [repr(store), store.root_url, store.url("x")]
    shown += [str(e) for e in errors] + ["".join(traceback.format_exception(e)) for e in errors]
    for secret in secrets:
        assert secret.encode() not in blob, f"{secret!r} in the pickle"
        for text in shown:
            assert secret not in text, f"{secret!r} in {text!r}"
        assert secret not in logs, f"{secret!r} in the logs"


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except StreamioError as exc:
        return exc
    raise AssertionError("no error raised")


# ------------------------------------------------------------------ HTTP: credentials the server checks
@AIOHTTP_BASIC_AUTH
@pytest.mark.parametrize("how", ["url-userinfo", "authorization-header", "client-kwargs-auth"])
def test_http_credentials_work_and_never_show(
    http_host: str, closed_port: int, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    plain = f"http://{http_host}/ds"
    url, options, secrets = {
        "url-userinfo": (f"http://{USER}:{PASSWORD}@{http_host}/ds", {}, (PASSWORD,)),
        "authorization-header": (plain, {"headers": {"Authorization": f"Bearer {BEARER}"}}, (BEARER,)),
        "client-kwargs-auth": (plain, {"client_kwargs": {"auth": aiohttp.BasicAuth(USER, PASSWORD)}}, (PASSWORD,)),
    }[how]
    store = Store(url, options, retry=FAST)
    assert store.read("a") == b"hello"  # the credential reached the server
    assert pickle.loads(pickle.dumps(store)).read("a") == b"hello"  # and survives a pickle in this process
    missing = _raised(lambda: store.read("nope"))
    assert isinstance(missing, ObjectNotFoundError)
    denied = _raised(lambda: Store(f"http://{USER}:{WRONG}@{http_host}/ds", retry=FAST).read("a"))
    assert isinstance(denied, StoragePermissionError)
    dead = Store(url.replace(http_host, f"127.0.0.1:{closed_port}"), options, retry=FAST)
    unreachable = _raised(lambda: dead.read("a"))
    assert isinstance(unreachable, StorageUnreachableError)
    assert_nowhere(secrets + (WRONG,), store=store, errors=[missing, denied, unreachable], logs=caplog.text)
    assert_nowhere(secrets, store=dead, errors=[], logs="")
    if how == "url-userinfo":
        assert store.root_url == f"http://***@{http_host}/ds" and "***@" in str(missing)


@AIOHTTP_BASIC_AUTH
def test_store_unpickled_without_the_url_credential_says_so(http_host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = pickle.dumps(Store(f"http://{USER}:{PASSWORD}@{http_host}/ds", retry=FAST))
    monkeypatch.setattr(storage_secrets, "_VAULT", {})  # a spawned process: none of this one's memory
    orphan = pickle.loads(blob)
    with pytest.raises(StoragePermissionError) as info:
        orphan.read("a")
    assert "user:password@" in str(info.value) and PASSWORD not in str(info.value)
    with pytest.raises(StoragePermissionError):
        orphan.child("sub").read("a")


def _child_read(blob: bytes, queue: Any) -> None:
    queue.put(pickle.loads(blob).read("a"))


@AIOHTTP_BASIC_AUTH
def test_forked_child_reads_with_the_pickled_references(http_host: str) -> None:
    blob = pickle.dumps(Store(f"http://{USER}:{PASSWORD}@{http_host}/ds", {"headers": {"X-Trace": "1"}}, retry=FAST))
    assert PASSWORD.encode() not in blob
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(blob, queue))
    child.start()
    try:
        assert queue.get(timeout=60) == b"hello"
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0


# ------------------------------------------------------------------ S3: keys, tokens, endpoint userinfo
def test_s3_key_secret_token_and_endpoint_userinfo_never_show(
    s3: S3Endpoint, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore prints the session token and key id at DEBUG
    token = "session-token-Qw93Lk"  # noqa: S105
    store = Store(s3.url("root"), {**s3.storage_options(), "token": token}, retry=FAST)
    store.put("k", b"v")
    assert store.read("k") == b"v" and [o.path for o in store.list()] == ["k"]
    missing = _raised(lambda: store.read("nope"))
    endpoint_pw = "endpoint-pw-Mn47"  # noqa: S105
    dead = Store(s3.url("root"), s3.storage_options(f"http://bob:{endpoint_pw}@127.0.0.1:{closed_port}"), retry=FAST)
    unreachable = _raised(lambda: dead.read("k"))
    assert isinstance(unreachable, StorageUnreachableError) and f"127.0.0.1:{closed_port}" in str(unreachable)
    secrets = (s3.key, s3.secret, token)
    assert_nowhere(secrets, store=store, errors=[missing], logs=caplog.text)
    assert_nowhere(secrets + (endpoint_pw,), store=dead, errors=[unreachable], logs=caplog.text)


def test_only_allow_listed_plain_options_are_pickled_in_clear(s3: S3Endpoint) -> None:
    options = {
        **s3.storage_options(),
        "config_kwargs": {"connect_timeout": 7, "proxies": {"https": "http://proxyuser:proxy-pw-8s@proxy:3128"}},
        "some_future_option": "future-value-Tt5",
        "s3_additional_kwargs": {"ServerSideEncryption": "AES256", "SSECustomerKey": "sse-c-key-Rr6"},
    }
    blob = pickle.dumps(Store(s3.url("root"), options))
    for clear in (s3.endpoint_url, s3.region, "AES256"):  # needed by any worker, secret to no one
        assert clear.encode() in blob
    for secret in (s3.key, s3.secret, "proxy-pw-8s", "future-value-Tt5", "sse-c-key-Rr6"):
        assert secret.encode() not in blob
    clone = pickle.loads(blob)
    assert clone._options == options  # resolved in this process, exactly


def test_azure_connection_string_never_shows() -> None:
    account_key = "QWNjb3VudEtleVNlY3JldA=="
    conn = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={account_key};EndpointSuffix=core.windows.net"
    store = Store("az://container/x", {"connection_string": conn, "account_name": "acct"})
    errors: list[BaseException] = []
    if importlib.util.find_spec("adlfs") is None:  # as here: the error must still not quote the option
        errors.append(_raised(store.list))
        assert isinstance(errors[0], UnsupportedProtocolError)
    assert_nowhere((account_key, conn), store=store, errors=errors, logs="")
    assert b"acct" in pickle.dumps(store)  # account_name is allow-listed


def test_scrub_blanks_secrets_quoted_in_third_party_text() -> None:
    Store("memory://scrub-test", {"headers": {"Authorization": "Bearer scrub-token-Uy72"}})
    text = "GET http://u:p4ssw0rd-x@h/x failed: header Authorization=Bearer scrub-token-Uy72"
    clean = storage_secrets.scrub(text)
    assert "p4ssw0rd-x" not in clean and "scrub-token-Uy72" not in clean and "http://***@h/x" in clean


# ------------------------------------------------------------------ workers authenticate (moto checks)
@pytest.fixture(scope="module")
def auth_s3() -> Iterator[AuthS3]:
    with auth_moto() as server:
        yield server


def test_dataloader_workers_authenticate_without_secrets_in_the_pickle(auth_s3: AuthS3) -> None:
    options = auth_s3.options(*auth_s3.allowed)
    url = auth_s3.url("ds")
    counts = [5, 3, 4]
    make_dataset(url, options, counts)
    ds = StreamingDataset(url, batch_size=2, shuffle=False, storage_options=options)
    assert auth_s3.allowed[1].encode() not in pickle.dumps(ds.store)
    loader = StreamingDataLoader(ds, num_workers=2, collate_fn=lambda batch: [s["__key__"] for s in batch])
    got = sorted(k for batch in loader for k in batch)
    assert got == sorted(all_keys(counts))
    # the server does check: the same dataset with the other user's key is refused
    with pytest.raises(StoragePermissionError):
        StreamingDataset(url, batch_size=2, storage_options=auth_s3.options(*auth_s3.denied))
