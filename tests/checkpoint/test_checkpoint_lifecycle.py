"""The checkpoint lifecycle after a recovery (issue 14), over moto S3 and local disk.

Each numbered case of the issue is a test here: (1) a fallback past a damaged step, then the
same step saved again; (2) a rollback with ``restore(step=)``: retention keeps the new timeline
and steps of the old one are saved again; (3) a root keeps its recorded retention policy;
(7) ``ckpt inspect`` shows the non-tensor state. Plus ``ckpt rm``, ``gc`` of bad and abandoned
saves, the walk that never leaves the current timeline, two live jobs (still exactly one
conflict) and the timeline logic itself against a model of it.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checkpoint import CheckpointManager, KeepBest, KeepLast, RetentionPolicy, SaveOptions
from streamio.checkpoint.admin import check_pointer, collect_garbage, verify_checkpoint
from streamio.checkpoint.format import checks, layout
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.format.retention import CheckpointRecord, policy_from_json, policy_to_json
from streamio.checkpoint.format.timeline import Timeline, Tip, branch, classify, compact, retreat
from streamio.checkpoint.root import committed_steps, read_manifest, read_pointer, resolve_save
from streamio.checksum import checksum_bytes
from streamio.cli.main import cli
from streamio.errors import CheckpointConflictError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.ckpt import PART_SIZE, Net, assert_same_state, fresh_state, state_for

OPTS = SaveOptions(part_size=PART_SIZE, concurrency=4)


@pytest.fixture(params=["s3", "file"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        return Store(str(tmp_path / "root"))
    s3: S3Endpoint = request.getfixturevalue("s3")
    return Store(s3.url("ckpt"), s3.storage_options())


def _manager(store: Store, **kw: Any) -> CheckpointManager:
    kw.setdefault("async_save", False)
    return CheckpointManager(store.root_url, storage_options=store._options, options=OPTS, **kw)


def _small(value: float) -> dict[str, Any]:
    return {"w": torch.full((4,), value), "counters": {"value": value}}


def _value(store: Store, **kw: Any) -> tuple[int, float]:
    got: dict[str, Any] = {"w": torch.zeros(4), "counters": None}
    step = _manager(store).restore(got, **kw)
    assert torch.equal(got["w"], torch.full((4,), got["counters"]["value"]))
    return step, got["counters"]["value"]


def _cli(store: Store, *args: str) -> Any:
    opts = []
    for k, v in store._options.items():
        opts += ["-o", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return CliRunner().invoke(cli, ["ckpt", args[0], store.root_url, *opts, *args[1:]])


def _flip_part(store: Store, step: int) -> str:
    """Flip a byte of a part of the save "step ``step``" means (the pointer's, if it names it)."""
    path = resolve_save(store, step)
    part = f"{path}/{read_manifest(store, step, path=path).files[0].path}"
    data = bytearray(store.read(part))
    data[len(data) // 2] ^= 0xFF
    store.put(part, bytes(data))
    return part


# --------------------------------------------------------------------------- case 1
def test_fallback_then_the_same_step_is_saved_again(root: Store, caplog: pytest.LogCaptureFixture) -> None:
    with _manager(root, retention=KeepLast(5)) as job:
        job.save(170, state_for(170))
        job.save(180, state_for(180))
    _flip_part(root, 180)
    got = fresh_state()
    resumed = _manager(root)
    assert resumed.restore(got) == 170  # falls back, and records 180 as bad
    assert_same_state(got, state_for(170))
    rows = json.loads(_cli(root, "ls", "--json").output)
    assert [(r["step"], r["latest"], bool(r["bad"])) for r in rows] == [(170, False, False), (180, True, True)]
    assert "checksum" in rows[1]["bad"]
    assert "BAD: " in _cli(root, "ls").output.splitlines()[2]  # after the header row
    # gc keeps what the pointer names, and says why
    gc = _cli(root, "gc", "--min-age", "0")
    assert gc.exit_code == 0 and "kept" in gc.output and "rm --force" in gc.output
    assert root.exists(layout.manifest_path(180))
    # a later restore does not read the bad step's parts again
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint"):
        assert _manager(root).restore(fresh_state()) == 170
    assert "rejected before" in caplog.text
    # training reaches 180 again: it saves, the bad save is retired, ls is clean
    resumed.save(180, state_for(1180))
    rows = json.loads(_cli(root, "ls", "--json").output)
    assert [(r["step"], r["latest"], r["bad"], r["place"]) for r in rows] == [
        (170, False, None, "current"), (180, True, None, "current")]
    got = fresh_state()
    assert _manager(root).restore(got) == 180
    assert_same_state(got, state_for(1180))
    assert check_pointer(root) == (180, []) and verify_checkpoint(root, 180) == []


def test_a_bad_save_the_pointer_does_not_name_is_removed_by_gc(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    with _manager(store, retention=KeepLast(5)) as job:
        for step in (1, 2, 3):
            job.save(step, _small(step))
    _flip_part(store, 3)  # the pointer's
    _flip_part(store, 2)
    assert _value(store) == (1, 1.0)  # 3 and 2 rejected, both recorded
    report = collect_garbage(store, min_age_s=0)
    assert any(p.startswith(layout.step_dir(2) + "/") for p in report.objects)
    assert not any(p.startswith(layout.step_dir(3) + "/") for p in report.objects) and len(report.kept) == 1
    assert committed_steps(store) == [1, 3]


def test_a_save_that_died_before_its_pointer_swap_is_ahead_until_the_next_commit(root: Store) -> None:
    with _manager(root, retention=KeepLast(5)) as first:
        first.save(1, _small(1))

    def die_before_the_pointer(phase: str) -> None:
        if phase == "manifest":
            raise RuntimeError("killed between the manifest and the pointer")

    job = _manager(root, on_phase=die_before_the_pointer)
    job.restore({"w": torch.zeros(4), "counters": None})
    with pytest.raises(RuntimeError, match="killed"):
        job.save(2, _small(2))
    assert [(r["step"], r["place"], r["latest"]) for r in _rows(root)] == [(1, "current", True), (2, "ahead", False)]
    assert not any(p.startswith(layout.step_dir(2)) for p in collect_garbage(root, min_age_s=0, dry_run=True).objects)
    resumed = _manager(root)
    assert resumed.restore({"w": torch.zeros(4), "counters": None}) == 1
    resumed.save(2, _small(22))  # saves the step again, and retires the dead save's manifest
    assert committed_steps(root) == [1, 2] and len(_rows(root)) == 2 and _value(root) == (2, 22.0)


def _rows(store: Store) -> list[dict[str, Any]]:
    return json.loads(_cli(store, "ls", "--json").output)  # type: ignore[no-any-return]


def test_gc_judges_unfinished_saves_by_the_start_time_in_their_save_id(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    with _manager(store) as job:
        job.save(5, _small(5))
    now = time.time()
    old = layout.new_save_id(now - 7200, "00000000")
    young = layout.new_save_id(now - 60, "11111111")
    dead = f"{layout.step_dir(9)}/rank-00000/part-{old}-00000.bin"  # past the newest step: the old rule kept it
    flying = f"{layout.step_dir(3)}-{young}/rank-00000/part-{young}-00000.bin"  # a save in flight after a rollback
    for path in (dead, flying):
        store.put(path, b"x" * 10)
    assert collect_garbage(store).objects == (dead,)
    assert collect_garbage(store, min_age_s=30).objects == (flying,)
    assert _value(store) == (5, 5.0)


# --------------------------------------------------------------------------- case 2
def test_rollback_keeps_the_new_timeline_and_saves_old_steps_again(root: Store) -> None:
    with _manager(root, retention=KeepLast(10)) as job:
        for step in range(1, 7):
            job.save(step, _small(step))
    back = _manager(root, retention=KeepLast(3))
    got: dict[str, Any] = {"w": torch.zeros(4), "counters": None}
    assert back.restore(got, step=2) == 2
    back.save(3, _small(30))
    back.save(4, _small(40))
    # KeepLast(3) over the current timeline in commit order: 2, 3, 4; the old 3..6 are retired
    assert committed_steps(root) == [2, 3, 4]
    assert _value(root) == (4, 40.0) and _value(root, step=3) == (3, 30.0)
    back.save(5, _small(50))  # the old timeline's step 5 was superseded: no conflict
    assert _value(root) == (5, 50.0) and committed_steps(root) == [3, 4, 5]
    rows = json.loads(_cli(root, "ls", "--json").output)
    assert {r["place"] for r in rows} == {"current"} and len(rows) == 3


def test_the_walk_never_picks_a_step_of_an_abandoned_timeline(root: Store) -> None:
    with _manager(root, retention=KeepLast(10)) as job:
        for step in range(1, 7):
            job.save(step, _small(step))

    def crash_after_the_pointer(phase: str) -> None:
        if phase == "pointer":
            raise RuntimeError("killed after the pointer swap")

    back = _manager(root, on_phase=crash_after_the_pointer)
    back.restore({"w": torch.zeros(4), "counters": None}, step=2)
    with pytest.raises(RuntimeError, match="killed"):
        back.save(3, _small(30))  # committed: the pointer names it; nothing retired yet
    assert check_pointer(root)[0] == 3 and committed_steps(root) == [1, 2, 3, 4, 5, 6]
    places = {(r["step"], r["place"]) for r in json.loads(_cli(root, "ls", "--json").output)}
    assert places >= {(3, "abandoned"), (6, "abandoned"), (2, "current")} and (3, "current") in places
    assert _value(root) == (3, 30.0)
    _flip_part(root, 3)
    assert _value(root) == (2, 2.0)  # not 6, 5, 4 or the old 3
    # gc keeps the abandoned saves while they are young (a resumed job may still use them) ...
    assert not any("step-000000006" in p for p in collect_garbage(root, dry_run=True).objects)
    # ... and removes them once old enough
    report = collect_garbage(root, min_age_s=0)
    assert any(p.startswith(layout.step_dir(6) + "/") for p in report.objects)
    assert committed_steps(root) == [1, 2, 3] and _value(root) == (2, 2.0)


def test_a_job_that_did_not_restore_is_refused_below_the_pointer(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    with _manager(store) as job:
        job.save(5, _small(5))
    with pytest.raises(CheckpointConflictError, match=r"did not call restore\(\)"):
        _manager(store).save(3, _small(3))
    job2 = _manager(store)
    job2.save(6, _small(6))  # past the pointer: continues from it
    assert committed_steps(store) == [5, 6] and _value(store) == (6, 6.0)
    with pytest.raises(CheckpointConflictError, match="already committed by this job"):
        job2.save(6, _small(6))


# --------------------------------------------------------------------------- live writers
def test_a_resumed_job_stops_the_live_writer_it_rolled_back(root: Store) -> None:
    live = _manager(root, retention=KeepLast(10))
    for step in (1, 2, 3):
        live.save(step, _small(step))
    resumed = _manager(root)
    resumed.restore({"w": torch.zeros(4), "counters": None}, step=1)
    resumed.save(2, _small(20))  # supersedes the live writer's 2 and 3
    with pytest.raises(CheckpointConflictError, match="another job"):
        live.save(4, _small(4))
    resumed.save(3, _small(30))  # the resumed job is not disturbed: one conflict in all
    assert _value(root) == (3, 30.0) and committed_steps(root) == [1, 2, 3]
    assert _value(root, step=2) == (2, 20.0)


def test_a_live_writer_stops_the_job_that_resumed_behind_it(root: Store) -> None:
    live = _manager(root, retention=KeepLast(10))
    for step in (1, 2, 3):
        live.save(step, _small(step))
    resumed = _manager(root)
    resumed.restore({"w": torch.zeros(4), "counters": None}, step=1)
    live.save(4, _small(4))  # the live job commits after the other one restored
    with pytest.raises(CheckpointConflictError, match="changed since this job last read it"):
        resumed.save(2, _small(20))
    live.save(5, _small(5))  # and goes on: its next commit retires the loser's save
    assert _value(root) == (5, 5.0) and committed_steps(root) == [1, 2, 3, 4, 5]
    assert _value(root, step=2) == (2, 2.0)


# --------------------------------------------------------------------------- case 3
def test_a_reopened_root_keeps_its_recorded_retention(root: Store, caplog: pytest.LogCaptureFixture) -> None:
    losses = {1: 0.1, 2: 0.5, 3: 0.6, 4: 0.7}
    with _manager(root, retention=KeepBest("loss", "min", 1)) as job:
        for step, loss in losses.items():
            job.save(step, _small(step), metrics={"loss": loss})
    assert committed_steps(root) == [1, 4]
    reopened = _manager(root)  # no retention=: the root's KeepBest, not the default KeepLast(2)
    assert reopened.retention == KeepBest("loss", "min", 1)
    for step in (5, 6):
        reopened.save(step, _small(step), metrics={"loss": 0.9})
    assert committed_steps(root) == [1, 6]
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.save.pruning"):
        _manager(root, retention=KeepLast(2)).save(7, _small(7))
    assert "retention under" in caplog.text and "keep_best" in caplog.text and "keep_last" in caplog.text
    assert committed_steps(root) == [6, 7]
    assert json.loads(root.read("retention.json"))["policy"] == {"keep_last": 2}
    assert _manager(root).retention == KeepLast(2)


class _Odd(RetentionPolicy):
    def keep(self, records: Any) -> set[int]:
        return {r.step for r in records if r.step % 2}


def test_a_policy_that_cannot_be_rebuilt_keeps_everything(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(str(tmp_path))
    with _manager(store, retention=_Odd()) as job:
        for step in (1, 2, 3, 4):
            job.save(step, _small(step))
    assert committed_steps(store) == [1, 3, 4]
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.save.pruning"):
        _manager(store).save(6, _small(6))
    assert "cannot be rebuilt" in caplog.text and committed_steps(store) == [1, 3, 4, 6]


def test_policies_round_trip_through_json() -> None:
    policy = KeepLast(3) | KeepBest("val", "max", 2)
    assert policy_from_json(json.loads(json.dumps(policy_to_json(policy)))) == policy
    assert policy_from_json(policy_to_json(_Odd())) is None
    for bad in [{"keep_last": 0}, {"keep_last": True}, {"keep_best": {"metric": 1, "mode": "min", "k": 1}}, [], {}]:
        with pytest.raises(ValueError):
            policy_from_json(bad)
    records = [CheckpointRecord(s) for s in (9, 3, 4)]  # commit order on the timeline, not step order
    assert KeepLast(2).keep(records) == {3, 4}


# --------------------------------------------------------------------------- case 7
class _Data:
    def __init__(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.epoch, self.position = d["epoch"], d["position"]


def test_inspect_shows_the_whole_non_tensor_state(root: Store) -> None:
    torch.manual_seed(0)
    model = Net(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.125, momentum=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    opt.step()
    sched.step()
    state = {"model": model, "optim": opt, "sched": sched, "data": _Data(3, 1234),
             "progress": {"epoch": 3, "patience": 2, "best": float("inf"), "seen": (1, 2)}}
    with _manager(root) as job:
        job.save(40, state, metrics={"val_loss": 0.25})
    res = _cli(root, "inspect", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["step"] == 40 and doc["metrics"] == {"val_loss": 0.25} and doc["software"]["torch"] == torch.__version__
    assert doc["state"]["progress"] == {"epoch": 3, "patience": 2, "best": "inf", "seen": [1, 2]}
    assert doc["state"]["sched"]["last_epoch"] == 1 and doc["state"]["sched"]["step_size"] == 3
    assert doc["state"]["optim"]["param_groups"][0]["lr"] == 0.125
    assert "model" not in doc["state"]  # tensors only: listed below
    assert doc["per_rank"] == [{"data": {"version": 1, "epoch": 3, "position": 1234}}]
    assert doc["retention"] == {"keep_last": 2} and doc["timeline"]["place"] == "current"
    assert len(doc["timeline"]["id"]) == 12 and doc["bad"] is None
    weights = {t["key"]: t for t in doc["tensors"]}["model/fc1.weight"]
    assert weights["shape"] == [32, 64] and weights["dtype"] == "float32"
    text = _cli(root, "inspect").output
    assert '"position": 1234' in text and '"last_epoch": 1' in text and "keep_last" in text and "timeline" in text


# --------------------------------------------------------------------------- rm
def test_rm_refuses_the_pointer_step_unless_forced_and_never_dangles(root: Store) -> None:
    with _manager(root, retention=KeepLast(5)) as job:
        for step in (1, 2, 3):
            job.save(step, _small(step))
    refused = _cli(root, "rm", "3")
    assert refused.exit_code == 2 and "--force" in refused.output and committed_steps(root) == [1, 2, 3]
    assert _cli(root, "rm", "9").exit_code == 3
    done = _cli(root, "rm", "2")
    assert done.exit_code == 0, done.output
    assert committed_steps(root) == [1, 3] and not any(o.path.startswith(layout.step_dir(2)) for o in root.list())
    forced = _cli(root, "rm", "3", "--force")
    assert forced.exit_code == 0 and "to step 1" in forced.output, forced.output
    assert check_pointer(root) == (1, []) and committed_steps(root) == [1] and _value(root) == (1, 1.0)
    last = _cli(root, "rm", "1", "--force")
    assert last.exit_code == 2 and "without a checkpoint" in last.output and committed_steps(root) == [1]
    _manager(root).save(2, _small(22))  # the root goes on from the moved pointer
    assert _value(root) == (2, 22.0)


def test_rm_force_skips_saves_that_are_not_complete(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    with _manager(store, retention=KeepLast(5)) as job:
        for step in (1, 2, 3):
            job.save(step, _small(step))
    store.delete(f"{layout.step_dir(2)}/{read_manifest(store, 2).files[0].path}")
    assert _cli(store, "rm", "3", "--force").exit_code == 0
    assert check_pointer(store) == (1, [])


# --------------------------------------------------------------------------- formats
def test_a_format_1_root_is_read_and_continued(tmp_path: Path) -> None:
    """A root written before timelines: its manifests and pointer are format 1."""
    store = Store(str(tmp_path))
    with _manager(store, retention=KeepLast(5)) as job:
        for step in (1, 2, 3):
            job.save(step, _small(step))
    for step in (1, 2, 3):
        doc = json.loads(store.read(layout.manifest_path(step)))
        doc.pop("timeline"), doc.pop("parent")
        doc["format"] = "streamio.checkpoint/1"
        _reseal(store, step, doc)
    pointer = json.loads(store.read(ptr.LATEST))
    del pointer["timeline"]
    pointer["format"] = "streamio.checkpoint.latest/1"
    pointer["manifest_checksum"] = checksum_bytes(store.read(layout.manifest_path(3)))
    store.put(ptr.LATEST, json.dumps(pointer).encode())
    assert read_manifest(store, 3).timeline is None and read_pointer(store).timeline == Timeline()  # type: ignore[union-attr]
    job = _manager(store)
    job.restore({"w": torch.zeros(4), "counters": None}, step=2)
    job.save(3, _small(30))
    assert _value(store) == (3, 30.0) and committed_steps(store) == [1, 2, 3]
    assert json.loads(store.read(ptr.LATEST))["format"] == ptr.POINTER_FORMAT


def _reseal(store: Store, step: int, doc: dict[str, Any]) -> None:
    body = {k: v for k, v in doc.items() if k != checks.SEAL_KEY}
    store.put(layout.manifest_path(step), checks.seal(json.dumps(body, separators=(",", ":")).encode()))


def test_pointer_format_2_path_must_be_the_step_or_its_save() -> None:
    p = ptr.Pointer(5, layout.save_dir(5, "abc"), "crc32c:00000000", "abc", "t", Timeline("f00", (("", 3),)))
    assert ptr.pointer_from_bytes(ptr.pointer_to_bytes(p)) == p
    doc = json.loads(ptr.pointer_to_bytes(p))
    for path in ["step-000000005-other", "step-000000006-abc", "../x"]:
        with pytest.raises(checks.ManifestError, match="expected 'step-000000005' or 'step-000000005-abc'"):
            ptr.pointer_from_bytes(json.dumps({**doc, "path": path}).encode())
    for timeline in [{"id": "X!", "history": []}, {"id": "a", "history": [["b", 3], ["c", 3]]},
                     {"id": "a", "history": [["a", 1]]}, {"id": "a", "history": [["b", -1]]}, None]:
        with pytest.raises(checks.ManifestError, match="timeline"):
            ptr.pointer_from_bytes(json.dumps({**doc, "timeline": timeline}).encode())


# --------------------------------------------------------------------------- the timeline logic
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 4), st.booleans()), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_classify_agrees_with_a_model_of_the_history(jobs: list[tuple[int, int, bool]], rnd: random.Random) -> None:
    """Jobs restore a random current save (or none) and save a few steps; retention deletes at
    random. Then exactly the saves on the true history are "current", and compact() keeps that."""
    saves: set[tuple[str, int]] = set()  # what the root holds
    truth: list[tuple[str, int]] = []  # the current history, in commit order
    tip: Tip | None = None
    lines: dict[str, Timeline] = {}
    for n, (pick, count, prune) in enumerate(jobs):
        current = [s for s in truth if s in saves]
        start = current[pick % len(current)] if current else None
        first = (start[1] + 1 - pick % 3) if start else pick  # sometimes at or below the restored step
        first = max(first, 0)
        parent = lines[start[0]] if start else None
        line = branch(parent, start[1] if start else None, new_id=f"t{n}", first_step=first)
        lines[line.id] = line
        truth = [s for s in truth[: truth.index(start) + 1] if s[1] < first] if start else []
        for step in range(first, first + count):
            saves.add((line.id, step))
            truth.append((line.id, step))
        tip = Tip(line, first + count - 1)
        if prune:  # retention-like: any save but the tip may go
            saves -= {s for s in saves if s != (line.id, tip.step) and rnd.random() < 0.3}
            lines[line.id] = compact(line, saves)
            tip = Tip(lines[line.id], tip.step)
    assert tip is not None
    for tid, step in saves:
        expected = "current" if (tid, step) in truth else None
        got = classify(tip, lines[tid], step)
        assert (got == "current") == (expected == "current"), (tid, step, truth)
    for tid, step in truth:
        if (tid, step) in saves:
            assert retreat(tip, tid, step).step == step
