"""A local copy is a nearer copy, never the only one: whatever stands in its place, the root's is read.

docs/design.md "Local tier". Real files: a directory (EISDIR, a failing disk's stand-in) or a FIFO
(``os.mkfifo``) where a local part, manifest or pointer should be, a regular file where the tier's
directory should be. A FIFO must never block: each case runs in a thread with a deadline, and a
reader still blocked is released (a writer opens the FIFO) before the test fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio import CheckpointManager, LocalTier, SaveOptions
from streamio.checkpoint.admin.tiers import list_tiers
from streamio.errors import ConfigError
from streamio.storage import Store

OPTS = SaveOptions(part_size=64 << 10)
DEADLINE_S = 30.0


def state(step: int) -> dict[str, Any]:
    return {"w": torch.randn(32, 256, generator=torch.Generator().manual_seed(step)), "progress": {"step": step}}


def blank() -> dict[str, Any]:
    return {"w": torch.zeros(32, 256), "progress": None}


def within_deadline(fn: Callable[[], Any], fifos: list[Path]) -> Any:
    """``fn()`` in a thread; fails if it is still running after the deadline (a blocked FIFO open),
    after releasing it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)
    if worker.is_alive():
        for fifo in fifos:  # a writer's open lets a blocked reader's open return (and read EOF)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(DEADLINE_S)
        pytest.fail(f"still blocked after {DEADLINE_S} s: a FIFO was opened for reading")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def plant(path: Path, kind: str) -> list[Path]:
    """Put a ``kind`` ("dir", "fifo") in place of the file ``path``; the FIFOs made."""
    path.unlink()
    if kind == "dir":
        path.mkdir()
        (path / "x").write_bytes(b"x")
        return []
    os.mkfifo(path)
    return [path]


@pytest.fixture
def saved(tmp_path: Path) -> tuple[str, LocalTier, Path]:
    """Step 5 on the root and on the tier; the rank's local root."""
    root, tier = str(tmp_path / "root"), LocalTier(str(tmp_path / "local"))
    with CheckpointManager(root, local=tier, options=OPTS) as mgr:
        mgr.save(5, state(5))
    return root, tier, tmp_path / "local" / "rank-00000"


@pytest.mark.parametrize(
    ("target", "kind"),
    [("part", "dir"), ("part", "fifo"), ("manifest", "dir"), ("manifest", "fifo"), ("pointer", "fifo")],
)
def test_a_local_copy_that_cannot_be_read_is_passed_over_for_the_roots(
    saved: tuple[str, LocalTier, Path], target: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, tier, local = saved
    path = {"part": lambda: next(local.glob("step-*/rank-00000/part-*.bin")),
            "manifest": lambda: next(local.glob("step-*/manifest.json")),
            "pointer": lambda: local / "latest.json"}[target]()
    fifos = plant(path, kind)
    got = blank()

    def restore() -> int:
        with CheckpointManager(root, local=tier, options=OPTS) as mgr:
            return mgr.restore(got)

    with caplog.at_level(logging.WARNING):
        assert within_deadline(restore, fifos) == 5
    assert torch.equal(got["w"], state(5)["w"]) and got["progress"] == {"step": 5}
    if target != "pointer":  # the pointer's FIFO: no local candidates at all, said so
        assert "not a regular file" in caplog.text


def test_ckpt_ls_local_never_blocks_on_a_fifo_in_place_of_a_local_pointer(saved: tuple[str, LocalTier, Path]) -> None:
    root, tier, local = saved
    fifos = plant(local / "latest.json", "fifo")
    rows = within_deadline(lambda: list_tiers(Store(root), tier), fifos)
    assert [(r["step"], r["tier"]) for r in rows] == [(5, "durable")]  # the unreadable local copy is no copy


def test_a_tier_path_that_is_a_regular_file_restores_and_saves_through_the_root(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = str(tmp_path / "root")
    with CheckpointManager(root, options=OPTS) as mgr:
        mgr.save(5, state(5))
    (tmp_path / "local").write_text("a file where the tier's directory should be")
    got = blank()
    with caplog.at_level(logging.WARNING), CheckpointManager(
        root, local=LocalTier(str(tmp_path / "local")), options=OPTS
    ) as mgr:
        assert mgr.restore(got) == 5
        mgr.save(6, state(6))
        mgr.wait()
        assert mgr.durable_step == 6
    assert torch.equal(got["w"], state(5)["w"])
    assert "is not used by this job" in caplog.text
    assert (tmp_path / "local").read_text() == "a file where the tier's directory should be"


# ------------------------------------------------------------------ close() and the settings
def test_close_names_no_stale_local_only_save_after_local_commits_fail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 1 stays local, the tier then fails and step 2 goes to the root: the root holds the
    newest save, and close() says nothing of a local-only one."""
    local = tmp_path / "local"
    options = SaveOptions(part_size=64 << 10, durable_every=100)
    with caplog.at_level(logging.WARNING), CheckpointManager(
        str(tmp_path / "root"), local=LocalTier(str(local)), options=options
    ) as mgr:
        mgr.save(1, state(1))
        mgr.wait()
        shutil.move(local, tmp_path / "gone")
        local.write_text("the disk is gone")
        mgr.save(2, state(2))
        mgr.wait()
        assert mgr.durable_step == 2
    assert "local copy of step 2" in caplog.text
    assert "on the local tier only" not in caplog.text, caplog.text


@pytest.mark.parametrize("path", [None, b"/tmp/x", 3])
def test_a_tier_path_of_the_wrong_type_is_a_config_error(path: Any) -> None:
    with pytest.raises(ConfigError, match="LocalTier.path must be a local directory"):
        LocalTier(path)
