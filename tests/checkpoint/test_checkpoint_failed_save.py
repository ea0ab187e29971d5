"""A save that fails removes what it wrote, names the cause, and leaves no empty directories (issue 23, item 9).

* A real full disk: a child saves onto an 8 MiB tmpfs (its own mount namespace) until a save
  fails with ENOSPC. The error says "no space left on device writing <part>", the space is back,
  nothing of the failed save is left, and once the disk has room again the next saves commit.
* S3 (moto through the fault proxy): a save whose done marker is refused (403) after its parts
  were uploaded removes its parts; when the removal is refused too, the next save removes them.
* What is removed is the failed save's own share and nothing else: another save's objects in the
  same directory stay, and a save that failed after its manifest was created (a pointer swap
  conflict) is committed and kept for retention and ``gc``.
* 60 saves with ``KeepLast(2)`` leave 2 step directories on a local root, not 58 empty ones;
  ``gc`` and ``rm`` remove the directories they empty; a directory holding a writer's temporary
  file is not removed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions
from streamio.checkpoint.admin import check_pointer, collect_garbage, plan_removal, remove, verify_checkpoint
from streamio.checkpoint.root import remove_empty_dirs
from streamio.checkpoint.save.abandon import room_problem, writing
from streamio.errors import CheckpointConflictError, CheckpointError, StoragePermissionError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from streamio.testing.proxy import FaultProxy

CHILD = Path(__file__).parents[1] / "support" / "ckpt_full_disk.py"
OPTS = SaveOptions(part_size=64 << 10, concurrency=4)


def _state(step: int) -> dict[str, Any]:
    torch.manual_seed(step)
    return {"w": torch.randn(64 << 10), "progress": {"step": step}}


def _step_objects(store: Store, step: int) -> list[str]:
    return [o.path for o in store.list() if o.path.startswith(f"step-{step:09d}")]


def _private_tmpfs_works(tmp_path: Path) -> str | None:
    """Why a tmpfs cannot be mounted in a private mount namespace here, or ``None`` if it can."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"],
                           capture_output=True, text=True, timeout=30)
    return None if probe.returncode == 0 else f"unshare -m + mount -t tmpfs failed: {probe.stderr.strip()}"


@pytest.mark.slow
def test_a_save_that_fills_the_disk_removes_what_it_wrote_and_names_the_cause(tmp_path: Path) -> None:
    mount = tmp_path / "fs"
    mount.mkdir()
    why = _private_tmpfs_works(mount)
    if why is not None:
        pytest.skip(f"needs a real small filesystem (a tmpfs in a private mount namespace, as root): {why}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script = 'mount -t tmpfs -o size=8m tmpfs "$0" && exec "$1" "$2" "$0"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, str(mount), sys.executable, str(CHILD)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    part = f"{mount}/ckpt/step-000000002/rank-00000/part-"
    assert out["error"].startswith(f"CheckpointError: no space left on device writing {part}"), out["error"]
    assert out["after"] == out["before"], "the failed save's parts still hold space"
    assert not any(p.startswith("step-000000002") for p in out["objects_after"] + out["tree_after"]), out
    assert out["later"] == [3, 4], out
    assert [p for p in out["tree_end"] if "/" not in p] == ["latest.json", "retention.json", "step-000000004"], out


def test_room_problems_are_named_through_the_exception_chain(tmp_path: Path) -> None:
    for code, words in [(errno.ENOSPC, "no space left on device"), (errno.EDQUOT, "disk quota exceeded"),
                        (errno.EFBIG, "file too large")]:
        try:
            try:
                raise OSError(code, os.strerror(code))
            except OSError as inner:
                raise StoragePermissionError("wrapped") from inner
        except StoragePermissionError as exc:
            assert (room_problem(exc) or "").startswith(words)
        with pytest.raises(CheckpointError, match=f"^{words}.* writing s3://b/x: free space there") as info:
            with writing("s3://b/x"):
                raise OSError(code, os.strerror(code))
        assert isinstance(info.value.__cause__, OSError)
    assert room_problem(OSError(errno.EIO, "I/O error")) is None
    with pytest.raises(PermissionError), writing("s3://b/x"):
        raise PermissionError(errno.EACCES, "denied")  # other errors pass through unchanged


def _failing_at_parts(root: str, options: dict[str, Any] | None = None) -> CheckpointManager:
    """A manager whose saves after the first fail once their parts are written."""
    armed: list[bool] = []

    def on_phase(name: str) -> None:
        if armed and name == "parts":
            raise RuntimeError("injected failure after the parts")

    mgr = CheckpointManager(root, storage_options=options, async_save=False, options=OPTS, on_phase=on_phase)
    mgr.save(1, _state(1))
    armed.append(True)
    return mgr


def test_a_failed_save_removes_only_its_own_share(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "ckpt"))
    mgr = _failing_at_parts(store.root_url)
    foreign = "step-000000002/rank-00000/part-6b0f0000deadbeef-00000.bin"  # another writer's, in the same directory
    store.put(foreign, b"not ours")
    with pytest.raises(CheckpointError, match="injected failure after the parts"):
        mgr.save(2, _state(2))
    assert _step_objects(store, 2) == [foreign]
    assert sorted(p.name for p in (tmp_path / "ckpt" / "step-000000002").iterdir()) == ["rank-00000"]
    store.delete(foreign)
    with pytest.raises(CheckpointError, match="injected failure after the parts"):
        mgr.save(3, _state(3))
    assert not (tmp_path / "ckpt" / "step-000000003").exists()  # its directories went with it
    assert check_pointer(store) == (1, []) and verify_checkpoint(store, 1) == []


def test_a_save_that_lost_the_pointer_race_is_committed_and_kept(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    first = CheckpointManager(root, async_save=False, retention=KeepLast(5), options=OPTS)
    first.save(1, _state(1))
    second = CheckpointManager(root, async_save=False, retention=KeepLast(5), options=OPTS)
    second.restore({"w": None, "progress": None})
    second.save(2, _state(2))
    with pytest.raises(CheckpointConflictError):
        first.save(3, _state(3))  # its manifest is created, its pointer swap finds the pointer moved
    store = Store(root)
    assert "step-000000003/manifest.json" in _step_objects(store, 3)
    assert verify_checkpoint(store, 3) == []  # complete, not current: retention and gc decide


@pytest.fixture
def proxied(s3: S3Endpoint) -> Any:
    with FaultProxy(s3.endpoint_url) as proxy:
        yield s3, proxy


def test_on_s3_a_save_refused_after_its_parts_removes_them(proxied: Any) -> None:
    s3, proxy = proxied
    url = s3.url("ckpt")
    store = Store(url, s3.storage_options())
    mgr = CheckpointManager(url, storage_options=s3.storage_options(proxy.endpoint_url), async_save=False, options=OPTS)
    mgr.save(1, _state(1))
    proxy.fail_next(1, 403, "AccessDenied", method="PUT", path_contains="/done-")
    with pytest.raises(CheckpointError, match="AccessDenied"):
        mgr.save(2, _state(2))
    assert proxy.count("PUT", "/part-") >= 4 and _step_objects(store, 2) == []
    # the removal refused too: the next save removes them first
    proxy.fail_next(1, 403, "AccessDenied", method="PUT", path_contains="/done-")
    proxy.fail_next(1000, 403, "AccessDenied", method="DELETE")
    proxy.fail_next(1000, 403, "AccessDenied", method="POST", path_contains="delete")
    with pytest.raises(CheckpointError, match="AccessDenied"):
        mgr.save(3, _state(3))
    left = _step_objects(store, 3)
    assert left, "the removal should have been refused"
    proxy.clear()
    mgr.save(4, _state(4))
    assert _step_objects(store, 3) == [] and check_pointer(store) == (4, [])


def test_sixty_saves_with_keep_last_two_leave_two_step_directories(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with CheckpointManager(str(root), retention=KeepLast(2), async_save=False) as mgr:
        for step in range(1, 61):
            mgr.save(step, {"w": torch.full((256,), float(step))})
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == ["step-000000059", "step-000000060"]


def test_gc_and_rm_remove_the_directories_they_empty(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    store = Store(str(root))
    with CheckpointManager(str(root), retention=KeepLast(5), async_save=False, options=OPTS) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
    remove(store, plan_removal(store, 2))
    assert not (root / "step-000000002").exists()
    store.put("step-000000009/rank-00000/part-00000001deadbeef-00000.bin", b"x")  # an unfinished save of 1970
    report = collect_garbage(store, min_age_s=0)
    assert report.objects and not (root / "step-000000009").exists()
    assert sorted(p.name for p in root.iterdir()) == ["latest.json", "retention.json", "step-000000001",
                                                      "step-000000003"]


def test_a_directory_a_writer_is_writing_into_is_not_removed(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "ckpt"))
    busy = tmp_path / "ckpt" / "step-000000001" / "rank-00000"
    busy.mkdir(parents=True)
    (busy / ".part.bin.1234.streamio-tmp").write_bytes(b"being written")
    (tmp_path / "ckpt" / "step-000000002" / "rank-00000").mkdir(parents=True)
    remove_empty_dirs(store, ["step-000000001/rank-00000", "step-000000001", "step-000000002/rank-00000",
                              "step-000000002"])
    assert (busy / ".part.bin.1234.streamio-tmp").read_bytes() == b"being written"
    assert not (tmp_path / "ckpt" / "step-000000002").exists()
