"""The pointer is read with its version in one GET (the ETag of the bytes read), and a swap against
that version is still refused once another writer replaced the pointer (docs/design.md "Commit
protocol"). Counted on the wire through a FaultProxy in front of moto."""

from __future__ import annotations

import pytest

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.checkpoint.format import pointer as ptr
from streamio.errors import CheckpointConflictError, CheckpointError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from streamio.testing.proxy import FaultProxy
from support.ckpt import light_state_for

OPTS = SaveOptions(part_size=64 << 10, concurrency=2)


def _pointer_requests(proxy: FaultProxy) -> list[tuple[str, int]]:
    return [(r.method, r.status) for r in proxy.log() if r.path.endswith("/run/" + ptr.LATEST)]


def _saved(s3: S3Endpoint) -> None:
    with CheckpointManager(s3.url("run"), async_save=False, storage_options=s3.storage_options(), options=OPTS) as m:
        m.save(1, light_state_for(1))


def test_adopt_reads_the_pointer_in_one_get_and_swaps_against_its_etag(s3: S3Endpoint, moto_endpoint: str) -> None:
    _saved(s3)
    with FaultProxy(moto_endpoint) as proxy:
        with CheckpointManager(s3.url("run"), async_save=False, options=OPTS,
                               storage_options=s3.storage_options(proxy.endpoint_url)) as ckpt:
            assert ckpt.adopt() == 1
            assert _pointer_requests(proxy) == [("GET", 200)]  # was a HEAD, then the GET
            ckpt.save(2, light_state_for(2))  # the swap expects the ETag the GET answered with
            assert _pointer_requests(proxy) == [("GET", 200), ("PUT", 200)]
    store = Store(s3.url("run"), s3.storage_options())
    assert ptr.pointer_from_bytes(store.read(ptr.LATEST)).step == 2


def test_a_pointer_replaced_after_the_read_still_fails_the_swap(s3: S3Endpoint, moto_endpoint: str) -> None:
    _saved(s3)
    store = Store(s3.url("run"), s3.storage_options())
    with FaultProxy(moto_endpoint) as proxy:
        with CheckpointManager(s3.url("run"), async_save=False, options=OPTS,
                               storage_options=s3.storage_options(proxy.endpoint_url)) as ckpt:
            assert ckpt.adopt() == 1
            replaced = store.read(ptr.LATEST).replace(b"{", b"{ ", 1)  # another writer: same pointer, new ETag
            store.put(ptr.LATEST, replaced)
            with pytest.raises(CheckpointConflictError, match=r"latest\.json changed since this job last read it"):
                ckpt.save(2, light_state_for(2))
            assert ("PUT", 412) in _pointer_requests(proxy)
    assert store.read(ptr.LATEST) == replaced  # the other writer's pointer stands


@pytest.mark.parametrize("body", [b"x" * (ptr.MAX_POINTER_BYTES + 1), b"{not json"], ids=["too-large", "garbage"])
def test_adopt_names_an_unusable_pointer_read_in_its_one_get(tmp_path, body: bytes) -> None:  # type: ignore[no-untyped-def]
    url = f"file://{tmp_path}/run"
    with CheckpointManager(url, async_save=False, options=OPTS) as first:
        first.save(1, light_state_for(1))
    Store(url).put(ptr.LATEST, body)
    with CheckpointManager(url, async_save=False, options=OPTS) as ckpt, \
            pytest.raises(CheckpointError, match=r"holds an unusable latest\.json .*restore\(\) walks back"):
        ckpt.adopt()
    assert Store(url).read(ptr.LATEST) == body  # nothing written over it


def _restore_requests(s3: S3Endpoint, moto_endpoint: str) -> list[tuple[str, str, int]]:
    with FaultProxy(moto_endpoint) as proxy:
        with CheckpointManager(s3.url("run"), async_save=False, options=OPTS,
                               storage_options=s3.storage_options(proxy.endpoint_url)) as ckpt:
            assert ckpt.restore(light_state_for(0)) == 1
        return [(r.method, r.path.partition("/run/")[2], r.status) for r in proxy.log()]


def test_restore_reads_the_pointer_in_one_get_and_swaps_against_its_etag(s3: S3Endpoint, moto_endpoint: str) -> None:
    _saved(s3)
    with FaultProxy(moto_endpoint) as proxy:
        with CheckpointManager(s3.url("run"), async_save=False, options=OPTS,
                               storage_options=s3.storage_options(proxy.endpoint_url)) as ckpt:
            assert ckpt.restore(light_state_for(0)) == 1
            requests = [(r.method, r.path.partition("/run/")[2], r.status) for r in proxy.log()]
            # was a HEAD of latest.json first: one request more
            assert requests[:3] == [("GET", ptr.LATEST, 200), ("GET", "step-000000001/bad.json", 404),
                                    ("GET", "step-000000001/manifest.json", 200)]
            assert [m for m, p, _ in requests[3:] if "/part-" in p] == ["GET"] * 6 and len(requests) == 9
            ckpt.save(2, light_state_for(2))  # the swap expects the ETag the restore's GET answered with
            assert _pointer_requests(proxy) == [("GET", 200), ("PUT", 200)]
    assert ptr.pointer_from_bytes(Store(s3.url("run"), s3.storage_options()).read(ptr.LATEST)).step == 2


def test_a_pointer_replaced_after_a_restore_fails_the_swap(s3: S3Endpoint, moto_endpoint: str) -> None:
    _saved(s3)
    store = Store(s3.url("run"), s3.storage_options())
    with CheckpointManager(s3.url("run"), async_save=False, options=OPTS, storage_options=s3.storage_options()) as ckpt:
        assert ckpt.restore(light_state_for(0)) == 1
        replaced = store.read(ptr.LATEST).replace(b"{", b"{ ", 1)  # another writer: same pointer, new ETag
        store.put(ptr.LATEST, replaced)
        with pytest.raises(CheckpointConflictError, match=r"latest\.json changed since this job last read it"):
            ckpt.save(2, light_state_for(2))
    assert store.read(ptr.LATEST) == replaced  # the other writer's pointer stands


@pytest.mark.parametrize("body", [b"x" * (ptr.MAX_POINTER_BYTES + 1), b"{not json"], ids=["too-large", "garbage"])
def test_restore_past_an_unusable_pointer_reads_its_version_first_then_the_pointer(
    s3: S3Endpoint, moto_endpoint: str, body: bytes
) -> None:
    _saved(s3)
    store = Store(s3.url("run"), s3.storage_options())
    store.put(ptr.LATEST, body)
    with FaultProxy(moto_endpoint) as proxy:
        with CheckpointManager(s3.url("run"), async_save=False, options=OPTS,
                               storage_options=s3.storage_options(proxy.endpoint_url)) as ckpt:
            assert ckpt.restore(light_state_for(0)) == 1  # walked back past it
            # the one GET's refusal has no version: HEAD then GET, the old order (a write between fails the swap)
            # (a too-large GET is dropped once its length is seen: one entry each, whatever the proxy was writing)
            assert [m for m, _ in _pointer_requests(proxy)] == ["GET", "HEAD", "GET"]
            ckpt.save(2, light_state_for(2))  # replaces exactly the unusable pointer read
    assert ptr.pointer_from_bytes(store.read(ptr.LATEST)).step == 2
