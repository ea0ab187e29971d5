"""A script that ends right after an async save (issue 23, item 6): real processes, local disk and S3.

Each child (tests/support/ckpt_exit.py) commits step 1, then starts saving step 2 without ever
calling ``wait()`` or ``close()`` (step 2's commit is held for a second, so it is surely in
flight). Then:

* the script ends: the save is waited for at interpreter exit, with one line on stderr saying so
  and how to avoid it; ``latest.json`` names step 2 and it verifies; exit status 0;
* the save fails at exit: stderr says step 2 was not committed and why; exit status 1; the
  pointer stays on step 1;
* SIGTERM with its default action kills at once (no Python code runs): step 1 stays current and
  restorable, the next job saves on, ``gc`` removes what the killed save wrote;
* SIGTERM with a handler that raises ``SystemExit``: the save is waited for, then status 143;
* under ``torch.distributed`` with the peer gone: the wait ends in an error naming the rank that
  never came, within the collective timeout, exit status 1 (not a hang).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streamio.checkpoint import CheckpointManager
from streamio.checkpoint.admin import check_pointer, collect_garbage, verify_checkpoint
from streamio.checkpoint.root import committed_steps, read_pointer
from streamio.checkpoint.save import inflight
from streamio.errors import CheckpointError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.ckpt_exit import PEER_TIMEOUT_S, state

SCRIPT = Path(__file__).parents[1] / "support" / "ckpt_exit.py"
WAITING = "waiting for checkpoint step {step} to commit to {root} (a save still in flight at interpreter exit)"
HINT = "call ckpt.wait() or ckpt.close() before the script ends"


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "file":
        return str(tmp_path / "ckpt"), {}
    s3: S3Endpoint = request.getfixturevalue("s3")
    return s3.url("ckpt"), s3.storage_options()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parents[1]))
    return env


def _start(mode: str, url: str, options: dict[str, Any], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPT), mode, url, json.dumps(options)], env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(mode: str, url: str, options: dict[str, Any]) -> tuple[int, str]:
    proc = _start(mode, url, options)
    out, err = proc.communicate(timeout=120)
    assert "saved" in out, err[-3000:]
    return proc.returncode, err


def _committed(url: str, options: dict[str, Any], step: int) -> Store:
    """The pointer names ``step``, whose checkpoint verifies."""
    store = Store(url, options)
    pointed, problems = check_pointer(store)
    assert (pointed, problems) == (step, []), problems
    assert verify_checkpoint(store, step) == []
    return store


def test_finish_waits_reports_failures_and_interrupts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=inflight.__name__)
    ok: concurrent.futures.Future[object] = concurrent.futures.Future()
    failed: concurrent.futures.Future[object] = concurrent.futures.Future()
    ok.set_result(None)
    failed.set_exception(CheckpointError("boom"))
    inflight.track(ok, 1, "root-a")
    inflight.track(failed, 2, "root-b")
    assert inflight.finish() == 1
    assert "checkpoint step 2 was not committed to root-b: CheckpointError: boom; exiting with status 1" in caplog.text
    assert "waiting" not in caplog.text and "step 1" not in caplog.text  # done before exit: nothing to wait for
    observed: concurrent.futures.Future[object] = concurrent.futures.Future()
    inflight.track(observed, 3, "root-c")
    inflight.forget(observed)  # the manager saw its outcome
    assert inflight.finish() == 0

    def interrupted(exc: BaseException) -> Any:
        def wait(future: concurrent.futures.Future[object]) -> object:
            raise exc
        return wait

    for exc, code in [(KeyboardInterrupt(), 130), (SystemExit(143), 143), (SystemExit(None), 130)]:
        caplog.clear()
        inflight.track(concurrent.futures.Future(), 4, "root-d")
        assert inflight.finish(wait=interrupted(exc)) == code
        assert WAITING.format(step=4, root="root-d") in caplog.text
        assert f"interrupted while waiting for checkpoint step 4 to commit to root-d: it may not be committed; " \
               f"exiting with status {code}" in caplog.text


@pytest.mark.slow
def test_a_script_that_ends_during_an_async_save_commits_it_at_exit(root: tuple[str, dict[str, Any]]) -> None:
    url, options = root
    code, err = _run("end", url, options)
    assert code == 0, err[-3000:]
    assert WAITING.format(step=2, root=url) in err and HINT in err, err[-3000:]
    assert len([line for line in err.splitlines() if "waiting for checkpoint" in line]) == 1
    _committed(url, options, 2)


def test_finish_waits_for_a_save_recorded_while_it_waits() -> None:
    upload: concurrent.futures.Future[object] = concurrent.futures.Future()
    local: concurrent.futures.Future[object] = concurrent.futures.Future()
    inflight.track(local, 2, "local")

    def wait(future: concurrent.futures.Future[object]) -> object:
        if future is local:  # committing locally hands the upload on, as the local tier does
            inflight.track(upload, 2, "root")
            upload.set_result(None)
        return None

    seen: list[object] = []
    assert inflight.finish(wait=lambda f: seen.append(f) or wait(f)) == 0
    assert seen == [local, upload]


@pytest.mark.slow
def test_with_a_local_tier_an_upload_in_flight_at_exit_is_finished(
    root: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = root
    env = {**_env(), "LOCAL_TIER": str(tmp_path / "local")}
    proc = _start("tier-end", url, options, env)
    out, err = proc.communicate(timeout=120)
    assert "saved" in out and proc.returncode == 0, err[-3000:]
    assert WAITING.format(step=2, root=url) in err and HINT in err, err[-3000:]
    _committed(url, options, 2)


@pytest.mark.slow
def test_a_forked_child_does_not_wait_for_the_parents_save(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    proc = _start("fork", url, {})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "child exit code 0" in out, (out, err[-3000:])
    assert len([line for line in err.splitlines() if "waiting for checkpoint" in line]) == 1, err[-3000:]
    _committed(url, {}, 2)


@pytest.mark.slow
def test_a_save_that_fails_at_exit_is_reported_and_the_exit_status_is_1(root: tuple[str, dict[str, Any]]) -> None:
    url, options = root
    code, err = _run("fail", url, options)
    assert code == 1, err[-3000:]
    assert WAITING.format(step=2, root=url) in err, err[-3000:]
    assert f"checkpoint step 2 was not committed to {url}" in err and "injected failure" in err, err[-3000:]
    _committed(url, options, 1)


def _terminated(mode: str, url: str, options: dict[str, Any]) -> tuple[int, str]:
    proc = _start(mode, url, options)
    assert proc.stdout is not None
    for line in proc.stdout:  # until step 2's parts are written and its commit is held in flight
        if line.strip() == "parts written":
            break
    else:
        raise AssertionError(proc.communicate(timeout=60)[1][-3000:])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.slow
def test_sigterm_right_after_save_leaves_the_previous_checkpoint_current(root: tuple[str, dict[str, Any]]) -> None:
    url, options = root
    code, err = _terminated("sigterm", url, options)
    assert code == -signal.SIGTERM, err[-3000:]
    store = _committed(url, options, 1)
    leftovers = [o.path for o in store.list() if o.path.startswith("step-000000002/")]
    assert leftovers and committed_steps(store) == [1]  # the killed save wrote parts, never a manifest
    # the next job restores step 1 and saves on; gc removes what the killed save wrote
    mgr = CheckpointManager(url, storage_options=options, async_save=False)
    got = {"model": state(0)["model"], "progress": None}
    assert mgr.restore(got) == 1 and got["progress"] == {"step": 1}
    mgr.save(2, state(2))
    mgr.close()
    _committed(url, options, 2)
    collect_garbage(store, min_age_s=0)
    listed = {o.path for o in store.list()}
    assert not set(leftovers) & listed, "gc left the killed save's objects"


@pytest.mark.slow
def test_sigterm_with_a_handler_that_exits_waits_for_the_save(root: tuple[str, dict[str, Any]]) -> None:
    url, options = root
    code, err = _terminated("sigterm-exit", url, options)
    assert code == 143, err[-3000:]
    assert WAITING.format(step=2, root=url) in err, err[-3000:]
    _committed(url, options, 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_under_torch_distributed_a_gone_peer_ends_the_exit_wait_in_an_error(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    base = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    procs = [_start("peer-gone", url, {}, dict(base, RANK=str(r))) for r in (0, 1)]
    t0 = time.monotonic()
    out, err = procs[0].communicate(timeout=120)
    elapsed = time.monotonic() - t0
    procs[1].communicate(timeout=60)
    assert procs[0].returncode == 1, err[-3000:]
    assert WAITING.format(step=1, root=url) in err and "checkpoint step 1 was not committed" in err, err[-3000:]
    assert "rank 1 had closed its connections (the process exited or crashed)" in err, err[-3000:]
    assert elapsed < PEER_TIMEOUT_S + 30, elapsed
    assert read_pointer(Store(url)) is None
