"""CheckpointManager over real backends (file://, memory://, S3 via moto over HTTP).

Covers: exact round trips (sync and async), in-place loading, walk-back on every kind of damage
with ``ckpt verify`` naming the bad object, concurrent jobs on one root, retention invariants,
foreign / unknown formats, errors surfacing from the background thread, no unpickling on load.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from streamio.checkpoint import CheckpointManager, KeepBest, KeepEvery, KeepLast, SaveOptions
from streamio.checkpoint.admin import check_pointer, verify_checkpoint
from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.root import committed_steps, read_bad, read_manifest
from streamio.cli.main import cli
from streamio.errors import (
    CheckpointConflictError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    StreamioError,
    TransientStorageError,
)
from streamio.storage import Store
from streamio.testing import S3Endpoint
from streamio.testing.proxy import FaultProxy
from support.ckpt import PART_SIZE, assert_same_state, fresh_state, rewrite_manifest, state_for

OPTS = SaveOptions(part_size=PART_SIZE, concurrency=4)


def _manager(store: Store, **kw: Any) -> CheckpointManager:
    return CheckpointManager(store.root_url, storage_options=store._options, options=kw.pop("options", OPTS), **kw)


@pytest.fixture
def s3_store(s3: S3Endpoint) -> Store:
    return Store(s3.url("ckpt"), s3.storage_options())


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("async_save", [True, False])
def test_save_restore_is_bit_exact_on_every_backend(store: Store, async_save: bool) -> None:
    if not async_save and store.protocol not in ("memory", "file", "local"):
        pytest.skip("the sync path is backend-independent; covered on memory:// and file://")
    with _manager(store, async_save=async_save, retention=KeepLast(5)) as mgr:
        for step in (10, 20):
            mgr.save(step, state_for(step), metrics={"loss": 1 / step})
        stats = mgr.wait()
    assert stats is not None and stats.step == 20 and stats.files > 1 and stats.durable_s >= stats.blocked_s
    mgr2 = _manager(store)
    assert mgr2.latest_step() == 20 and mgr2.steps() == [10, 20]
    got = fresh_state()
    assert mgr2.restore(got) == 20
    assert_same_state(got, state_for(20))
    got10 = fresh_state()
    assert mgr2.restore(got10, step=10) == 10
    assert_same_state(got10, state_for(10))


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_restore_loads_in_place_into_live_tensors(store: Store) -> None:
    with _manager(store) as mgr:
        mgr.save(1, state_for(1))
    got = fresh_state()
    params = {n: p.data_ptr() for n, p in got["model"].named_parameters()}
    # the optimizer already holds moments: they must be overwritten, not replaced
    got["optim"].zero_grad()
    got["model"](torch.randn(16, 64)).sum().backward()
    got["optim"].step()
    moments = {id(p): s["exp_avg"].data_ptr() for p, s in got["optim"].state.items()}
    _manager(store).restore(got)
    assert {n: p.data_ptr() for n, p in got["model"].named_parameters()} == params
    assert {id(p): s["exp_avg"].data_ptr() for p, s in got["optim"].state.items()} == moments
    assert_same_state(got, state_for(1))


def test_odd_tensors_compression_and_parts_spanning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    big = torch.arange(300_000, dtype=torch.float64)  # 2.4 MB: spans many 64 KiB parts
    state: dict[str, Any] = {
        "t": {
            "big": big,
            "strided": torch.arange(24.0).reshape(4, 6).t(),  # non-contiguous
            "scalar": torch.tensor(3.5),
            "empty": torch.zeros(0, 5),
            "flags": torch.tensor([True, False, True]),
            "half": torch.randn(7, dtype=torch.bfloat16),
            "cplx": torch.randn(3, dtype=torch.complex64),
            "size": torch.Size([2, 3]),
            "dtype": torch.float16,
            "blob": b"\x00\xffraw",
            "nan": float("nan"),
            "ints": {1: "a", (2, 3): "b"},
            "set": {3, 1, 2},
        }
    }
    opts = SaveOptions(part_size=64 << 10, compression="zstd")
    with CheckpointManager(str(tmp_path), options=opts) as mgr:
        mgr.save(5, state)
    m = read_manifest(Store(str(tmp_path)), 5)
    assert len(m.files) > 5 and all(f.compression == "zstd" and f.size < f.raw_size for f in m.files)
    got: dict[str, Any] = {"t": None}
    CheckpointManager(str(tmp_path)).restore(got)
    t = got["t"]
    for key in ("big", "strided", "scalar", "empty", "flags", "half", "cplx"):
        assert t[key].dtype == state["t"][key].dtype and torch.equal(t[key], state["t"][key]), key
    assert t["size"] == torch.Size([2, 3]) and isinstance(t["size"], torch.Size)
    assert t["dtype"] is torch.float16 and t["blob"] == b"\x00\xffraw"
    assert t["nan"] != t["nan"] and t["ints"] == {1: "a", (2, 3): "b"} and t["set"] == {1, 2, 3}


@pytest.mark.parametrize("store", ["file"], indirect=True)
def test_restore_never_unpickles(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    with _manager(store) as mgr:
        mgr.save(1, state_for(1))

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("restore must not unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    got = fresh_state()
    _manager(store).restore(got)
    assert_same_state(got, state_for(1))


def test_unsaveable_value_is_refused_at_save_naming_its_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with CheckpointManager(str(tmp_path)) as mgr:
        with pytest.raises(CheckpointError, match=r"'extra/fn'.*function"):
            mgr.save(1, {"extra": {"fn": lambda: 0}})
    assert committed_steps(Store(str(tmp_path))) == []


def test_restore_names_state_that_was_not_saved(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, {"a": 1})
    with pytest.raises(CheckpointError, match=r"has no \['b'\]"):
        CheckpointManager(str(tmp_path)).restore({"a": None, "b": None})


def test_empty_root_raises_not_found(store: Store) -> None:
    with pytest.raises(CheckpointNotFoundError):
        _manager(store).restore({"x": None})
    assert _manager(store).latest_step() is None


def test_save_same_step_twice_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with CheckpointManager(str(tmp_path), async_save=False) as mgr:
        mgr.save(1, {"a": 1})
        with pytest.raises(CheckpointConflictError, match="already committed"):
            mgr.save(1, {"a": 2})


def test_a_save_that_died_before_its_pointer_swap_does_not_block_the_resumed_job(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    with _manager(store, retention=KeepLast(5), async_save=False) as crashed:
        crashed.save(1, state_for(1))
        pointer_at_1 = store.read(ptr.LATEST)
        crashed.save(2, state_for(2))
    store.put(ptr.LATEST, pointer_at_1)  # step 2's manifest landed, the job died before the swap
    with pytest.raises(CheckpointConflictError, match="already committed"):
        _manager(store, async_save=False).save(2, state_for(2))  # no restore: nothing says it resumed
    resumed = _manager(store, async_save=False)
    assert resumed.restore(fresh_state()) == 1
    with caplog.at_level(logging.WARNING, logger="streamio"):
        resumed.save(2, state_for(12))
    assert "never swapped" in caplog.text
    with pytest.raises(CheckpointConflictError, match="already committed"):
        resumed.save(2, state_for(2))  # now committed by this job: saving it again is a mistake
    got = fresh_state()
    assert _manager(store).restore(got) == 2
    assert_same_state(got, state_for(12))
    assert verify_checkpoint(store, 2) == []


# --------------------------------------------------------------------------- walk back
def _two_checkpoints(store: Store) -> tuple[mf.Manifest, mf.Manifest]:
    with _manager(store, retention=KeepLast(5)) as mgr:
        mgr.save(1, state_for(1))
        mgr.save(2, state_for(2))
    return read_manifest(store, 1), read_manifest(store, 2)


def _verify_cli(store: Store, *args: str) -> Any:
    opts = []
    for k, v in store._options.items():
        opts += ["-o", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return CliRunner().invoke(cli, ["ckpt", "verify", store.root_url, *opts, *args])


def _damage(store: Store, m2: mf.Manifest, how: str) -> str:
    """Damage step 2 (or the pointer) the way ``how`` says; returns what verify must name."""
    part = m2.place(layout.step_dir(2)).path(m2.files[1].rank, m2.files[1].path)
    if how == "flip-byte":
        data = bytearray(store.read(part))
        data[len(data) // 2] ^= 0xFF
        store.put(part, bytes(data))
        return part
    if how == "delete-part":
        store.delete(part)
        return part
    if how == "truncate-part":
        store.put(part, store.read(part)[:-10])
        return part
    if how == "corrupt-latest":
        store.put(ptr.LATEST, b'{"format": "streamio.checkpoint.latest/1", "step": ')
        return ptr.LATEST
    if how == "latest-to-deleted":
        for o in store.list(layout.step_dir(2)):
            store.delete(o.path)
        return ptr.LATEST
    if how == "corrupt-manifest":
        store.put(layout.manifest_path(2), b"{not json")
        return layout.manifest_path(2)
    raise AssertionError(how)


@pytest.mark.parametrize(
    ("store", "how"),
    [("s3", "flip-byte"), ("s3", "latest-to-deleted"), ("memory", "delete-part"), ("memory", "truncate-part"),
     ("memory", "corrupt-latest"), ("file", "corrupt-manifest")],
    indirect=["store"],
)
def test_damaged_checkpoint_falls_back_and_verify_names_it(
    store: Store, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    s3_store = store
    _, m2 = _two_checkpoints(s3_store)
    bad = _damage(s3_store, m2, how)
    got = fresh_state()
    expected = 2 if how == "corrupt-latest" else 1  # the newest complete checkpoint
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(s3_store).restore(got) == expected
    assert_same_state(got, state_for(expected))
    assert any("falling back" in r.getMessage() for r in caplog.records)
    result = _verify_cli(s3_store)
    assert result.exit_code == 1, result.output
    assert s3_store.url(bad) in result.output


# ----------------------------------------------------- who is blamed: a read again before a judgement
@pytest.fixture
def proxied(s3: S3Endpoint) -> Iterator[tuple[Store, Store, FaultProxy]]:
    """A root read through a fault proxy, the same root read directly, and the proxy."""
    with FaultProxy(s3.endpoint_url) as proxy:
        name = f"blame-{uuid.uuid4().hex[:6]}"
        direct = Store(s3.url(name), s3.storage_options())
        yield Store(s3.url(name), s3.storage_options(proxy.endpoint_url)), direct, proxy


def _part_of_step2(m2: mf.Manifest) -> tuple[str, int]:
    f = max(m2.files, key=lambda f: f.size)
    return m2.place(layout.step_dir(2)).path(f.rank, f.path), f.size


def test_a_byte_flipped_on_the_way_is_read_again_and_never_condemns_the_checkpoint(
    proxied: tuple[Store, Store, FaultProxy], caplog: pytest.LogCaptureFixture
) -> None:
    store, direct, proxy = proxied
    _, m2 = _two_checkpoints(store)
    part, size = _part_of_step2(m2)
    proxy.clear()
    proxy.corrupt_next(1, size // 2, method="GET", path_contains=part)
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint"):
        assert _manager(store).restore(got) == 2
    assert_same_state(got, state_for(2))
    assert proxy.count("GET", part) == 2 and [r.fault for r in proxy.log() if part in r.path][0] == "corrupt"
    assert "a second read verified: they were damaged on the way, not in the store" in caplog.text
    assert "falling back" not in caplog.text and "as bad" not in caplog.text
    assert read_bad(direct, layout.step_dir(2)) is None and committed_steps(direct) == [1, 2]


def test_two_reads_damaged_differently_fail_the_restore_without_judging_the_checkpoint(
    proxied: tuple[Store, Store, FaultProxy]
) -> None:
    store, direct, proxy = proxied
    _, m2 = _two_checkpoints(store)
    part, size = _part_of_step2(m2)
    proxy.clear()
    proxy.corrupt_next(1, size // 2, method="GET", path_contains=part)
    proxy.corrupt_next(1, size // 3, method="GET", path_contains=part)
    got = fresh_state()
    with pytest.raises(TransientStorageError, match="two reads of bytes .* returned different bytes, neither matching"):
        _manager(store).restore(got)
    assert_same_state(got, fresh_state())  # nothing loaded
    assert read_bad(direct, layout.step_dir(2)) is None and read_bad(direct, layout.step_dir(1)) is None
    assert _manager(direct).restore(got) == 2  # the next start finds it intact


def test_a_manifest_damaged_on_the_way_is_read_again(
    proxied: tuple[Store, Store, FaultProxy], caplog: pytest.LogCaptureFixture
) -> None:
    store, direct, proxy = proxied
    _two_checkpoints(store)
    proxy.clear()
    proxy.corrupt_next(1, 40, method="GET", path_contains=layout.manifest_path(2))
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint"):
        assert _manager(store).restore(got) == 2
    assert_same_state(got, state_for(2))
    assert proxy.count("GET", layout.manifest_path(2)) == 2 and "a read here verified" in caplog.text
    assert read_bad(direct, layout.step_dir(2)) is None


def test_a_part_damaged_in_the_store_is_confirmed_by_a_second_read_then_walked_past_and_recorded_bad(
    proxied: tuple[Store, Store, FaultProxy], caplog: pytest.LogCaptureFixture
) -> None:
    store, direct, proxy = proxied
    _, m2 = _two_checkpoints(store)
    part = _damage(direct, m2, "flip-byte")
    proxy.clear()
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint"):
        assert _manager(store).restore(got) == 1
    assert_same_state(got, state_for(1))
    assert proxy.count("GET", part) == 2
    bad = read_bad(direct, layout.step_dir(2))
    assert bad is not None and "the object is corrupt (read twice, the same bytes both times)" in bad.reason
    assert read_bad(direct, layout.step_dir(1)) is None


def test_explicit_step_does_not_walk_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    _, m2 = _two_checkpoints(store)
    _damage(store, m2, "flip-byte")
    with pytest.raises(StreamioError, match="checksum"):
        CheckpointManager(str(tmp_path)).restore(fresh_state(), step=2)
    assert verify_checkpoint(store, 1) == [] and len(verify_checkpoint(store, 2)) == 1


def test_verify_cli_ok_and_all(s3_store: Store) -> None:
    _two_checkpoints(s3_store)
    result = _verify_cli(s3_store, "--all")
    assert result.exit_code == 0, result.output
    assert "step 1: OK" in result.output and "step 2: OK" in result.output


def test_ls_inspect_cli(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with CheckpointManager(str(tmp_path), retention=KeepLast(3)) as mgr:
        mgr.save(7, state_for(7), metrics={"val_loss": 0.25})
        mgr.save(8, state_for(8), metrics={"val_loss": 0.5})
    out = CliRunner().invoke(cli, ["ckpt", "ls", str(tmp_path), "--json"])
    rows = json.loads(out.output)
    assert [(r["step"], r["latest"], r["metrics"]) for r in rows] == [
        (7, False, {"val_loss": 0.25}),
        (8, True, {"val_loss": 0.5}),
    ]
    out = CliRunner().invoke(cli, ["ckpt", "inspect", str(tmp_path), "7", "--json"])
    doc = json.loads(out.output)
    assert doc["step"] == 7 and doc["world_size"] == 1 and doc["software"]["torch"] == torch.__version__
    weights = {t["key"]: t for t in doc["tensors"]}["model/fc1.weight"]
    assert weights["shape"] == [256, 64] and weights["dtype"] == "float32" and weights["nbytes"] == 256 * 64 * 4


# --------------------------------------------------------------------------- formats
def test_unknown_format_version_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, {"a": 1})
    doc = json.loads(store.read(layout.manifest_path(1)))
    doc["format"] = "streamio.checkpoint/99"
    store.put(layout.manifest_path(1), json.dumps(doc).encode())
    with pytest.raises(CheckpointFormatError, match="upgrade streamio"):
        CheckpointManager(str(tmp_path)).restore({"a": None})
    doc = json.loads(store.read(ptr.LATEST))
    doc["format"] = "streamio.checkpoint.latest/0"
    store.put(ptr.LATEST, json.dumps(doc).encode())
    with pytest.raises(CheckpointFormatError, match="latest.json"):
        CheckpointManager(str(tmp_path)).restore({"a": None})


def test_foreign_layouts_are_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dcp = tmp_path / "dcp"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"\x80\x04pickle")
    (dcp / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(CheckpointFormatError, match="torch.distributed.checkpoint"):
        CheckpointManager(str(dcp)).restore({"model": None})
    pt = tmp_path / "plain"
    pt.mkdir()
    torch.save({"w": torch.ones(2)}, pt / "model.pt")
    with pytest.raises(CheckpointFormatError, match="torch.save"):
        CheckpointManager(str(pt)).restore({"model": None})


def test_manifest_with_unknown_tag_is_rejected(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path))
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, {"a": {"b": 1}})
    doc = json.loads(store.read(layout.manifest_path(1)))
    doc["replicated"]["tree"]["a"] = {"$t": "pickle", "v": "gASVAAAA"}
    rewrite_manifest(store, 1, doc)  # sealed again: the tag check behind the seal is what is tested
    with pytest.raises(CheckpointFormatError, match="unknown tag 'pickle'"):
        CheckpointManager(str(tmp_path)).restore({"a": None}, step=1)


# --------------------------------------------------------------------------- concurrency
def test_two_jobs_on_one_root_the_stale_one_is_stopped(s3_store: Store) -> None:
    job_a = _manager(s3_store, async_save=False)
    job_a.save(1, state_for(1))
    job_b = _manager(s3_store, async_save=False)  # e.g. a restarted job while the old one still runs
    assert job_b.restore(fresh_state()) == 1
    job_b.save(2, state_for(2))
    with pytest.raises(CheckpointConflictError, match="another job"):
        job_a.save(3, state_for(3))
    assert check_pointer(s3_store) == (2, [])
    got = fresh_state()
    assert _manager(s3_store).restore(got) == 2
    assert_same_state(got, state_for(2))


def test_two_jobs_racing_for_one_step_one_wins(s3_store: Store) -> None:
    managers = [_manager(s3_store, async_save=False) for _ in range(2)]
    start = threading.Barrier(2)
    outcome: list[Any] = [None, None]
    states = [state_for(5), state_for(15)]  # built here: state_for seeds torch's global RNG

    def run(i: int) -> None:
        start.wait()
        try:
            managers[i].save(5, states[i])
            outcome[i] = "ok"
        except CheckpointConflictError as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o == "ok" for o in outcome) == [False, True], outcome
    winner = outcome.index("ok")
    got = fresh_state()
    assert _manager(s3_store).restore(got) == 5
    assert_same_state(got, state_for(5 + 10 * winner))


def test_background_error_surfaces_on_wait(s3: S3Endpoint) -> None:
    with FaultProxy(s3.endpoint_url) as proxy:
        store = Store(s3.url(f"denied-{uuid.uuid4().hex[:6]}"), s3.storage_options(proxy.endpoint_url))
        mgr = _manager(store)
        proxy.fail_next(1000, 403, "AccessDenied", method="PUT")
        mgr.save(1, state_for(1))  # returns: the upload fails in the background
        with pytest.raises(StreamioError, match="(?i)refused|denied"):
            mgr.wait()
        proxy.clear()
        mgr.save(2, state_for(2))  # the manager stays usable
        mgr.close()
        assert check_pointer(store) == (2, [])


# --------------------------------------------------------------------------- retention
def test_retention_union_of_policies(tmp_path) -> None:  # type: ignore[no-untyped-def]
    losses = {10: 0.9, 20: 0.1, 30: 0.5, 40: 0.7, 50: 0.6, 60: 0.8}
    policy = KeepLast(2) | KeepBest("loss", mode="min") | KeepEvery(30)
    with CheckpointManager(str(tmp_path), retention=policy) as mgr:
        for step, loss in losses.items():
            mgr.save(step, {"w": torch.full((4,), float(step))}, metrics={"loss": loss})
    assert committed_steps(Store(str(tmp_path))) == [20, 30, 50, 60]
    assert not any(o.path.startswith(layout.step_dir(10)) for o in Store(str(tmp_path)).list())


def test_async_retention_never_leaves_no_complete_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A reader polling throughout async saves with KeepLast(1) always restores a full checkpoint."""
    root = str(tmp_path / "root")
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def reader() -> None:
        store = Store(root)
        while not stop.is_set():
            step, problems = check_pointer(store)
            if step is None:
                continue  # before the first commit
            problems += verify_checkpoint(store, step)
            # the pointer may move on between the two reads: only a failure that persists counts
            if problems and check_pointer(store)[0] == step:
                failures.append("; ".join(problems))
            seen.append(step)

    with CheckpointManager(root, retention=KeepLast(1), options=SaveOptions(part_size=16 << 10)) as mgr:
        mgr.save(0, {"w": torch.zeros(20_000)})
        mgr.wait()
        thread = threading.Thread(target=reader)
        thread.start()
        for step in range(1, 9):
            mgr.save(step, {"w": torch.full((20_000,), float(step))})
    stop.set()
    thread.join()
    assert not failures, failures[:3]
    assert len(set(seen)) >= 2 and committed_steps(Store(root)) == [8]


# --------------------------------------------------------------------------- gc
def test_gc_removes_orphans_only(s3_store: Store, s3: S3Endpoint) -> None:
    _two_checkpoints(s3_store)
    m1 = read_manifest(s3_store, 1)
    orphans = [
        "step-000000000/rank-00000/part-dead-00000.bin",  # abandoned save older than the newest commit
        f"{layout.step_dir(1)}/rank-00000/part-loser-00000.bin",  # a losing concurrent save of step 1
        f"{layout.step_dir(1)}/rank-00000/done-loser.json",
    ]
    in_progress = "step-000000009/rank-00000/part-new-00000.bin"  # newer than every commit: a save in flight
    for path in [*orphans, in_progress]:
        s3_store.put(path, b"x" * 10)
    client = s3.boto3_client()
    key = s3_store.root_url.split("/", 3)[3] + "/step-000000003/rank-00000/part-big-00000.bin"
    upload = client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    opts = ["-o", f"key={s3.key}", "-o", f"secret={s3.secret}", "-o", f"endpoint_url={s3.endpoint_url}"]
    dry = CliRunner().invoke(cli, ["ckpt", "gc", s3_store.root_url, *opts, "--dry-run", "--min-age", "0"])
    assert dry.exit_code == 0, dry.output
    assert sorted(line.split()[-1] for line in dry.output.splitlines() if line.startswith("would delete s3")) == sorted(
        s3_store.url(p) for p in orphans)
    assert upload in dry.output and s3_store.exists(orphans[0])
    done = CliRunner().invoke(cli, ["ckpt", "gc", s3_store.root_url, *opts, "--min-age", "0"])
    assert done.exit_code == 0, done.output
    assert not any(s3_store.exists(p) for p in orphans) and s3_store.exists(in_progress)
    assert client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []
    assert {f.path for f in m1.files} <= {o.path.split("/", 1)[1] for o in s3_store.list(layout.step_dir(1))}
    assert verify_checkpoint(s3_store, 1) == [] and verify_checkpoint(s3_store, 2) == []
