"""The storage seams: backend factory, generic backend, the resuming stream loop without a server,
store capabilities asked instead of protocol names, and the one thread-pool helper."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from streamio.errors import (
    CorruptDataError,
    ShardFormatError,
    StorageError,
    StreamioError,
    TransientStorageError,
    TruncatedBodyError,
    UnsupportedOperationError,
    WriteConflictError,
)
from streamio.pool import run_parallel
from streamio.storage import RetryPolicy, Store, classify
from streamio.storage.backends import GenericBackend, backend_class, canonical, pointer_scope
from streamio.storage.backends.gcs import GcsBackend
from streamio.storage.backends.local import LocalBackend
from streamio.storage.backends.s3 import S3Backend, shared_loader, sync_client
from streamio.storage.retry import RetryBudget
from streamio.storage.stream import resuming
from streamio.testing import S3Endpoint


class _OtherFileSystem(MemoryFileSystem):
    """A real in-process filesystem under a protocol streamio has no module for: the generic backend."""

    protocol = ("streamio-generic",)


fsspec.register_implementation("streamio-generic", _OtherFileSystem, clobber=True)


# ------------------------------------------------------------------ the factory
@pytest.mark.parametrize(
    ("url", "cls"),
    [
        ("s3://b/k", S3Backend), ("s3a://b/k", S3Backend), ("gs://b/k", GcsBackend), ("gcs://b/k", GcsBackend),
        ("/data/x", LocalBackend), ("file:///data/x", LocalBackend), ("http://host/x", GenericBackend),
    ],
)
def test_backend_class_from_the_url_alone(url: str, cls: type) -> None:
    assert backend_class(url) is cls


def test_canonical_protocol_names() -> None:
    names = ("s3a", "gcs", "local", ("file", "local"), "memory")
    assert [canonical(p) for p in names] == ["s3", "gs", "file", "file", "memory"]


def test_store_answers_capabilities_instead_of_protocol_names(tmp_path: Path) -> None:
    local = Store(str(tmp_path / "r"))
    memory = Store(f"memory://streamio-{uuid.uuid4().hex}")
    assert local.is_local and local.protocol == "file"
    assert not memory.is_local and memory.protocol == "memory"
    assert local.for_verified_reads() is local and memory.for_verified_reads() is memory


def test_verified_reads_store_skips_botocore_response_checksums_on_s3(s3: S3Endpoint) -> None:
    store = Store(s3.url("root"), s3.storage_options())
    store.put("part", b"p" * 1000)
    parts = store.for_verified_reads()
    assert parts is not store and parts.root_url == store.root_url
    assert parts._options["config_kwargs"]["response_checksum_validation"] == "when_required"
    assert "config_kwargs" not in store._options  # the caller's options are not changed
    assert sync_client(parts.fs).meta.config.response_checksum_validation == "when_required"
    assert parts.read("part") == b"p" * 1000
    config = {"response_checksum_validation": "when_supported"}
    own = Store(s3.url("root"), {**s3.storage_options(), "config_kwargs": config})
    assert own.for_verified_reads() is own  # a caller's own setting is kept


def test_s3_clients_share_one_botocore_loader_and_a_forked_child_reads_through_it(
    s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing

    import botocore.session

    store = Store(s3.url("root"), s3.storage_options())
    store.put("obj", b"abc")
    loader = store.fs.session.get_component("data_loader")
    assert sync_client(store.fs)._loader is loader  # the whole-read client: the same parsed models
    again = Store(s3.url("other"), {**s3.storage_options(), "config_kwargs": {"read_timeout": 30}})
    again.put("x", b"1")
    assert again.fs.session.get_component("data_loader") is loader
    monkeypatch.setenv("AWS_DATA_PATH", "/nonexistent/models")  # a custom data path keeps its own loader
    assert shared_loader(botocore.session.Session()).get_component("data_loader") is not loader
    monkeypatch.delenv("AWS_DATA_PATH")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:  # a forked worker makes its own clients over the inherited loader
        assert pool.apply(_read_in_child, (store,)) == (b"abc", True)


def _read_in_child(store: Store) -> tuple[bytes, bool]:
    from streamio.storage.backends import s3

    data = store.read("obj")
    return data, store.fs.session.get_component("data_loader") is s3._LOADER


# ------------------------------------------------------------------ the generic backend
@pytest.fixture
def generic() -> Store:
    policy = RetryPolicy(max_attempts=2, sleep=lambda s: None)
    return Store(f"streamio-generic://streamio-{uuid.uuid4().hex}", retry=policy)


def test_generic_backend_reads_writes_and_lists(generic: Store) -> None:
    assert generic.protocol == "streamio-generic" and not generic.is_local
    generic.put("a/b", b"0123456789")
    assert generic.read("a/b") == b"0123456789" and generic.read("a/b", 2, 5) == b"234"
    assert b"".join(generic.iter_bytes("a/b", 3)) == b"3456789"
    assert [(o.path, o.size) for o in generic.list()] == [("a/b", 10)]
    assert generic.info("a/b").size == 10
    with pytest.raises(WriteConflictError):
        generic.put("a/b", b"x", mode="create")
    with pytest.raises(CorruptDataError):
        generic.read("a/b", 5, 50)


def test_generic_backend_refuses_compare_and_swap_with_a_streamio_error(generic: Store) -> None:
    generic.put("k", b"v")
    with pytest.raises(UnsupportedOperationError) as info:
        generic.put("k", b"w", if_match="anything")
    assert isinstance(info.value, (StorageError, NotImplementedError)) and generic.url("k") in str(info.value)
    assert generic.read("k") == b"v"
    assert generic.incomplete_uploads() == []


# ------------------------------------------------------------------ the resuming stream, no server
def _budget(sleeps: list[float], attempts: int = 4) -> RetryBudget:
    return RetryPolicy(max_attempts=attempts, initial_backoff=0.01, sleep=sleeps.append).budget()


def _object(data: bytes, cut_at: list[int], *, announce: bool = True):  # type: ignore[no-untyped-def]
    """An opener over ``data`` whose n-th request ends its body early at ``cut_at[n]`` (absolute)."""
    calls: list[tuple[int, int | None]] = []

    def open_at(pos: int, end: int | None, piece: int, on_end) -> Iterator[bytes]:  # type: ignore[no-untyped-def]
        calls.append((pos, end))
        stop = len(data) if end is None else min(end, len(data))
        if announce:
            on_end(stop)
        cut = cut_at[len(calls) - 1] if len(calls) <= len(cut_at) else stop
        for i in range(pos, min(cut, stop), piece):
            yield data[i : min(i + piece, cut, stop)]

    return open_at, calls


def test_stream_resumes_at_the_last_byte_received() -> None:
    data = bytes(range(256)) * 40
    open_at, calls = _object(data, [1000, 4000])
    sleeps: list[float] = []
    got = b"".join(resuming(open_at, "mem://x", 0, None, piece=300, budget=_budget(sleeps)))
    assert got == data
    assert calls == [(0, None), (1000, len(data)), (4000, len(data))]  # never from the start again
    assert len(sleeps) == 2


def test_stream_of_an_object_shorter_than_asked_is_corrupt_data_at_once() -> None:
    open_at, calls = _object(b"x" * 100, [])
    with pytest.raises(CorruptDataError, match="ends at byte 100, before the requested end 500"):
        list(resuming(open_at, "mem://x", 10, 500, piece=64, budget=_budget([])))
    assert len(calls) == 1


def test_stream_without_progress_exhausts_the_policy() -> None:
    open_at, calls = _object(b"x" * 100, [0] * 10)
    sleeps: list[float] = []
    with pytest.raises(TransientStorageError, match="mem://x"):
        list(resuming(open_at, "mem://x", 0, None, piece=64, budget=_budget(sleeps, attempts=3)))
    assert len(calls) == 3 and len(sleeps) == 2


def test_stream_that_never_says_its_length_ends_with_its_body() -> None:
    open_at, calls = _object(b"y" * 150, [], announce=False)
    assert b"".join(resuming(open_at, "mem://x", 20, None, piece=64, budget=_budget([]))) == b"y" * 130
    assert len(calls) == 1


def test_truncated_body_is_a_transient_streamio_error_but_not_a_final_storage_error() -> None:
    exc = TruncatedBodyError("short")
    assert isinstance(exc, (StreamioError, ConnectionError)) and not isinstance(exc, StorageError)
    assert classify(exc) == "transient"


# ------------------------------------------------------------------ one pool helper
def test_run_parallel_keeps_order_and_raises_the_first_error() -> None:
    assert run_parallel(lambda i: i * 2, range(7), concurrency=3) == [0, 2, 4, 6, 8, 10, 12]
    assert run_parallel(lambda i: i, [], concurrency=3) == []

    def boom(i: int) -> int:
        if i == 2:
            raise ShardFormatError(f"job {i}")
        return i

    with pytest.raises(ShardFormatError, match="job 2"):
        run_parallel(boom, range(5), concurrency=2)


# ------------------------------------------------------------------ the factory decides, nobody else
def test_no_protocol_names_are_compared_outside_the_backend_factory() -> None:
    repo = Path(__file__).resolve().parents[2]
    root = repo / "streamio"
    names = r"[\"'](?:file|local|memory|s3|s3a|gs|gcs|http|https)[\"']"
    compared = rf"(?:==|!=|\bin\b)\s*[(\[{{]?\s*{names}|{names}\s*(?:==|!=|\bin\b)"
    collected = rf"(?:frozenset|set|tuple)\(\s*[(\[{{]?\s*{names}"  # a set of names compared against later
    pattern = re.compile(f"{compared}|{collected}")
    exempt = {
        root / "storage" / "backends" / "__init__.py",  # the one place
        root / "testing" / "forwarding.py",  # the fault proxy's http(s) is the transport to its server, not a store
    }
    offenders = [
        f"{path.relative_to(repo)}:{n}: {line.strip()}"
        for path in sorted([*root.rglob("*.py"), *(repo / "cli").rglob("*.py")])
        if path not in exempt
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("url", "scope"),
    [
        ("/data/ds", None), ("ds", None), ("file:///data/ds", None), ("local:///ds", None), ("memory://ds", None),
        ("s3://b/ds", ("s3", None)), ("S3A://other/x", ("s3", None)), ("gcs://b/ds", ("gs", None)),
        ("https://user@Host.example:8443/ds", ("https", "host.example:8443")), ("http://h/x", ("http", "h")),
    ],
)
def test_pointer_scope_is_the_protocol_and_for_http_the_host(url: str, scope: tuple[str, str | None] | None) -> None:
    assert pointer_scope(url) == scope


def test_a_killed_local_put_leaves_a_temp_file_that_is_reported_and_removable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A writer killed between write and rename leaves ``.NAME.XXXX.streamio-tmp``: never listed as an
    object, reported by ``incomplete_uploads`` (what ``ckpt gc`` and ``shard --overwrite`` clean)."""
    import os
    import subprocess
    import sys

    from streamio.checkpoint.admin import collect_garbage

    store = Store(str(tmp_path / "root"))
    store.put("step-000000001/part.bin", b"x")
    code = (
        "import os, sys, tempfile\n"
        "d = sys.argv[1]\n"
        "fd, _ = tempfile.mkstemp(dir=d, prefix='.part-00001.bin.', suffix='.streamio-tmp')\n"
        "os.write(fd, b'half a part')\n"
        "os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "root" / "step-000000001")], check=False)
    assert done.returncode == -9
    assert [o.path for o in store.list()] == ["step-000000001/part.bin"]
    [upload] = store.incomplete_uploads()
    assert upload.path == "step-000000001/part-00001.bin" and upload.upload_id.endswith(".streamio-tmp")
    report = collect_garbage(store, dry_run=False, min_age_s=0)
    assert any("part-00001.bin" in u for u in report.multipart_uploads), report
    assert store.incomplete_uploads() == [] and not any(
        n.endswith(".streamio-tmp") for n in os.listdir(tmp_path / "root" / "step-000000001")
    )


def test_a_local_put_makes_its_directory_again_when_a_pruner_removes_it_meanwhile(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Retention removes the directories it empties (only while empty): a put racing it must not fail."""
    import os
    import tempfile

    from streamio.storage.backends import local

    real = tempfile.mkstemp
    calls = []

    def pruned_first(**kw):  # type: ignore[no-untyped-def]
        calls.append(kw["dir"])
        if len(calls) == 1:
            os.rmdir(kw["dir"])  # the pruner's rmdir lands between makedirs and mkstemp
        return real(**kw)

    monkeypatch.setattr(local.tempfile, "mkstemp", pruned_first)
    store = Store(str(tmp_path / "root"))
    store.put("step-000000002/rank-00000/part.bin", b"data")
    assert store.read("step-000000002/rank-00000/part.bin") == b"data" and len(calls) == 2
