"""The FaultProxy itself, over real HTTP to moto with boto3 (retries off), so each fault is seen raw."""

from __future__ import annotations

import os
import threading

import pytest
from botocore.exceptions import ClientError

from streamio.testing import FaultProxy, S3Endpoint

BODY = os.urandom(300_000)


@pytest.fixture
def proxy(moto_endpoint: str):  # type: ignore[no-untyped-def]
    with FaultProxy(moto_endpoint) as p:
        yield p


@pytest.fixture
def client(s3: S3Endpoint, proxy: FaultProxy):  # type: ignore[no-untyped-def]
    c = s3.boto3_client(proxy.endpoint_url)
    c.put_object(Bucket=s3.bucket, Key="obj", Body=BODY)
    proxy.clear()
    return c


def test_forwards_and_logs(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    got = client.get_object(Bucket=s3.bucket, Key="obj", Range="bytes=10-19")["Body"].read()
    assert got == BODY[10:20]
    (rec,) = proxy.log()
    assert (rec.method, rec.path, rec.range, rec.status, rec.response_bytes) == (
        "GET", f"/{s3.bucket}/obj", "bytes=10-19", 206, 10,
    )
    assert proxy.count("GET", "/obj") == 1 and proxy.count("PUT") == 0


def test_fail_next_answers_without_forwarding(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.fail_next(2, 503, "SlowDown")
    for _ in range(2):
        with pytest.raises(ClientError) as info:
            client.get_object(Bucket=s3.bucket, Key="obj")
        assert info.value.response["Error"]["Code"] == "SlowDown"
    assert client.get_object(Bucket=s3.bucket, Key="obj")["Body"].read() == BODY
    assert [r.status for r in proxy.log()] == [503, 503, 200]


def test_fail_next_filters_by_path(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.fail_next(1, 403, "AccessDenied", path_contains="/other")
    assert client.get_object(Bucket=s3.bucket, Key="obj")["Body"].read() == BODY
    with pytest.raises(ClientError) as info:
        client.get_object(Bucket=s3.bucket, Key="other")
    assert info.value.response["Error"]["Code"] == "AccessDenied"


def _raw_get(client, s3: S3Endpoint, key: str = "obj") -> tuple[int, int, bytes, bool]:  # type: ignore[no-untyped-def]
    """(status, Content-Length, body received, clean end) with a plain http.client (presigned URL)."""
    import http.client
    import urllib.parse

    url = urllib.parse.urlsplit(client.generate_presigned_url("get_object", Params={"Bucket": s3.bucket, "Key": key}))
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", f"{url.path}?{url.query}")
    resp = conn.getresponse()
    length = int(resp.getheader("Content-Length"))
    got = b""
    clean = True
    try:
        while True:
            piece = resp.read1(1 << 16)
            if not piece:
                break
            got += piece
    except (http.client.IncompleteRead, ConnectionError) as exc:
        clean = False
        got += getattr(exc, "partial", b"")
    conn.close()
    return resp.status, length, got, clean and len(got) == length


def test_reset_after_cuts_every_long_body(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.reset_after(100_000)
    for _ in range(2):
        status, length, got, clean = _raw_get(client, s3)
        assert (status, length, clean) == (200, len(BODY), False)
        assert got == BODY[: len(got)] and len(got) <= 100_000
    assert [r.fault for r in proxy.log()] == ["reset", "reset"]
    assert [r.response_bytes for r in proxy.log()] == [100_000, 100_000]


def test_reset_after_times_then_clean(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.reset_after(1000, times=1)
    assert not _raw_get(client, s3)[3]
    assert _raw_get(client, s3)[2:] == (BODY, True)


def test_truncate_sends_short_body_under_full_length(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.truncate_next(1, 5000)
    status, length, got, clean = _raw_get(client, s3)
    assert (status, length, got, clean) == (200, len(BODY), BODY[:5000], False)
    assert _raw_get(client, s3)[2:] == (BODY, True)


def test_corrupt_flips_one_byte_silently(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.corrupt_next(1, 70_000)
    # a plain GET (botocore would validate moto's stored full-object CRC and notice: s3fs does not)
    status, length, got, clean = _raw_get(client, s3)
    assert (status, length, clean) == (200, len(BODY), True) and got != BODY
    diff = [i for i in range(len(BODY)) if got[i] != BODY[i]]
    assert diff == [70_000]
    assert _raw_get(client, s3)[2] == BODY


def test_short_bodies_do_not_consume_body_faults(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    proxy.truncate_next(1, 5000)
    client.head_object(Bucket=s3.bucket, Key="obj")
    assert client.get_object(Bucket=s3.bucket, Key="obj", Range="bytes=0-99")["Body"].read() == BODY[:100]
    assert not _raw_get(client, s3)[3]


def test_latency_delays_first_byte(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    import time

    proxy.set_latency(0.3)
    t0 = time.monotonic()
    client.head_object(Bucket=s3.bucket, Key="obj")
    assert time.monotonic() - t0 >= 0.3


def test_bandwidth_cap(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    import time

    proxy.set_bandwidth(1_000_000)
    t0 = time.monotonic()
    assert client.get_object(Bucket=s3.bucket, Key="obj")["Body"].read() == BODY
    assert time.monotonic() - t0 >= 0.25  # 300 kB at 1 MB/s


def test_on_upload_bytes_fires_before_the_rest_is_forwarded(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    fired = threading.Event()

    def callback() -> None:
        seen.append(sum(r.request_bytes for r in proxy.log()))
        fired.set()

    proxy.on_upload_bytes(150_000, callback, forward_rest=True)
    client.put_object(Bucket=s3.bucket, Key="up", Body=BODY)
    assert fired.is_set() and seen == [0]  # fired inside the request, before it completed
    assert client.get_object(Bucket=s3.bucket, Key="up")["Body"].read() == BODY
    put = [r for r in proxy.log() if r.method == "PUT"]
    assert put[0].request_bytes >= len(BODY)


def test_on_upload_bytes_cuts_the_request_there_by_default(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    from botocore.exceptions import BotoCoreError

    fired: list[int] = []
    proxy.on_upload_bytes(100_000, lambda: fired.append(1))
    with pytest.raises((BotoCoreError, ClientError, ConnectionError)):
        client.put_object(Bucket=s3.bucket, Key="cut", Body=BODY)
    assert fired == [1]
    (rec,) = [r for r in proxy.log() if r.method == "PUT"]
    assert rec.fault == "aborted" and rec.status == 0
    with pytest.raises(ClientError):  # the server never saw a complete body
        client.head_object(Bucket=s3.bucket, Key="cut")


def test_many_loaders_connecting_at_once_are_not_made_to_wait(s3: S3Endpoint, proxy: FaultProxy, client) -> None:  # type: ignore[no-untyped-def]
    # socketserver's default listen backlog (5) dropped handshakes when 16+ readers connected at
    # once: each dropped one cost a SYN retransmit (>= 1 s), measured up to 7.7 s for 48 clients
    import http.client
    import time
    import urllib.parse

    client.put_object(Bucket=s3.bucket, Key="c", Body=b"x" * 100)
    url = urllib.parse.urlsplit(client.generate_presigned_url("get_object", Params={"Bucket": s3.bucket, "Key": "c"}))
    host, port = proxy.endpoint_url.split("//")[1].split(":")
    start = threading.Barrier(32)
    took: list[float] = []

    def one() -> None:
        start.wait()
        t = time.monotonic()
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", f"{url.path}?{url.query}")
        assert conn.getresponse().read() == b"x" * 100
        conn.close()
        took.append(time.monotonic() - t)

    threads = [threading.Thread(target=one) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(took) == 32 and max(took) < 1.0, sorted(took)[-3:]


# ------------------------------------------------------------------ request-rate limits per prefix
def test_rate_limit_buckets_refill_per_prefix() -> None:
    from streamio.testing.ratelimit import RateLimit

    now = [0.0]
    limit = RateLimit(10, burst=2, prefix_chars=4, clock=lambda: now[0])
    assert [limit.admit("PUT", "/b/aaaa/1") for _ in range(3)] == [True, True, False]
    assert limit.admit("PUT", "/b/bbbb/1") and limit.admit("GET", "/b/aaaa/1")  # another prefix; reads are free
    now[0] = 0.1  # one token back at 10/s
    assert limit.admit("PUT", "/b/aaaa/2") and not limit.admit("PUT", "/b/aaaa/3")
    assert (limit.admitted, limit.refused) == (4, 2)
    with pytest.raises(ValueError, match="per_second"):
        RateLimit(0)


def test_proxy_answers_writes_over_the_rate_with_slowdown(moto_endpoint: str) -> None:
    import boto3
    from botocore.config import Config

    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    with FaultProxy(moto_endpoint) as proxy:
        proxy.limit_rate(5, burst=3, prefix_chars=2)
        client = boto3.client(
            "s3", endpoint_url=proxy.endpoint_url, aws_access_key_id=s3.key, aws_secret_access_key=s3.secret,
            region_name=s3.region, config=Config(retries={"total_max_attempts": 1}),
        )
        codes = []
        for i in range(5):
            try:
                client.put_object(Bucket=s3.bucket, Key=f"aa/{i}", Body=b"x")
                codes.append(200)
            except client.exceptions.ClientError as exc:
                codes.append(exc.response["Error"]["Code"])
        client.put_object(Bucket=s3.bucket, Key="bb/0", Body=b"x")  # another prefix: its own bucket
        assert codes[:3] == [200, 200, 200] and "SlowDown" in codes[3:], codes
        throttled = [r for r in proxy.log() if r.fault == "throttled"]
        assert throttled and all(r.status == 503 for r in throttled)
        assert client.get_object(Bucket=s3.bucket, Key="aa/0")["Body"].read() == b"x"  # reads pass


def test_writes_per_segment_cuts_the_log_at_its_marks() -> None:
    from streamio.testing import RequestRecord
    from streamio.testing.ratelimit import writes_per_segment

    def rec(method: str, path: str, fault: str | None = None) -> RequestRecord:
        return RequestRecord(method, path, "", None, 503 if fault else 200, 0, 0, fault)

    log = [rec("PUT", "/b/a"), rec("PUT", "/b/a", "throttled"), rec("GET", "/b/a"), rec("PUT", "/b/between-2"),
           rec("DELETE", "/b/c"), rec("PUT", "/b/between-3"), rec("POST", "/b/d", "throttled")]
    assert writes_per_segment(log, "between-", 3) == [(1, 1), (1, 0), (0, 1)]
    assert writes_per_segment(log, "between-", 2) == [(1, 1), (1, 1)]  # marks past the last segment fold into it


def test_stall_holds_matching_requests_until_release_then_stop_drops_them(
    s3: S3Endpoint, proxy: FaultProxy, client  # type: ignore[no-untyped-def]
) -> None:
    import time

    proxy.stall(method="PUT", path_contains="/held")
    outcome: dict[str, object] = {}

    def put(key: str) -> None:
        try:
            outcome[key] = client.put_object(Bucket=s3.bucket, Key=key, Body=b"x")["ResponseMetadata"]["HTTPStatusCode"]
        except Exception as exc:  # noqa: BLE001 - the test reads what the client saw
            outcome[key] = exc

    first = threading.Thread(target=put, args=("held-1",), daemon=True)
    first.start()
    deadline = time.monotonic() + 10
    while proxy.held() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.held() == 1
    assert client.get_object(Bucket=s3.bucket, Key="obj")["Body"].read() == BODY  # others pass meanwhile
    assert client.put_object(Bucket=s3.bucket, Key="free", Body=b"y")["ResponseMetadata"]["HTTPStatusCode"] == 200
    time.sleep(0.3)
    assert first.is_alive() and "held-1" not in outcome  # no answer while held
    proxy.release()
    first.join(10)
    assert outcome["held-1"] == 200 and proxy.held() == 0
    assert client.get_object(Bucket=s3.bucket, Key="held-1")["Body"].read() == b"x"  # forwarded once released

    proxy.stall(method="PUT", path_contains="/held")
    second = threading.Thread(target=put, args=("held-2",), daemon=True)
    second.start()
    deadline = time.monotonic() + 10
    while proxy.held() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    proxy.stop()  # ends it unanswered: the client sees the connection close, never a 200
    second.join(30)
    assert not second.is_alive() and isinstance(outcome["held-2"], Exception)
    assert [r.fault for r in proxy.log() if r.path.endswith("/held-2")][:1] == ["stall"]


@pytest.mark.parametrize(("injected", "bytes_per_s"), [(False, 4000), (True, 800)], ids=["forwarded", "injected-error"])
def test_a_response_whose_client_hangs_up_before_its_last_piece_is_logged_once(  # type: ignore[no-untyped-def]
    s3: S3Endpoint, proxy: FaultProxy, client, injected: bool, bytes_per_s: int
) -> None:
    """A client that drops a body once it has its length (a too-large ``latest.json``) must not make
    one request two entries: logged before its last piece, then again, aborted, when that piece
    found the client gone (a restore's GET, HEAD, GET read as GET, GET, HEAD, GET, GET)."""
    import http.client
    import socket
    import struct
    import time
    import urllib.parse

    if injected:
        proxy.fail_next(1, 503, "SlowDown")  # its document: a head of 98 bytes, then the rest in one piece
    proxy.set_bandwidth(bytes_per_s)  # pieces of a quarter of it: two in all, the last 0.12-0.25 s later
    url = urllib.parse.urlsplit(client.generate_presigned_url("get_object", Params={"Bucket": s3.bucket, "Key": "obj"}))
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", f"{url.path}?{url.query}", headers={"Range": "bytes=0-1999"})
    resp = conn.getresponse()
    length = int(resp.getheader("Content-Length"))
    assert len(resp.read(10)) == 10 and resp.status == (503 if injected else 206)
    assert conn.sock is not None
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    resp.close()
    conn.close()
    deadline = time.monotonic() + 5
    while not proxy.log() and time.monotonic() < deadline:  # logged just before the last piece is written
        time.sleep(0.01)
    time.sleep(0.3)  # that write fails at once: the handler is done well within this
    assert [(r.method, r.status, r.response_bytes) for r in proxy.log()] == [
        ("GET", 503 if injected else 206, length)
    ]
