"""Preemption with a grace period: ``Preemption(grace_s=...)``, ``ckpt.close(timeout_s=...)`` and ``exit()``'s barrier.

In-process: the arguments and the grace clock. Slow, real processes: ``exit()`` holds a rank that
is done until the other is (torchrun SIGKILLs the rest ``--shutdown-timeout`` after one rank's
exit); and the reference trainer on 2 gloo ranks under torchrun with a local tier, SIGTERM to one
rank: with a grace long enough the preemption save is durable in the root; with one too short
(a ``FaultProxy`` delays every S3 response) the local copy stays, a WARNING says so, a restart
on the same node resumes from it exactly and a restart elsewhere from the root's last durable step.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import s3fs
import torch

from streamio import CheckpointManager, LocalTier, Preemption
from streamio.errors import ArgumentError, ConfigError
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from streamio.train.config import parse_args
from streamio.train.telemetry import read_metrics
from tests.train.test_preemption import COMMON, _env, _finish, _last_step, _losses, _rank_pid, _torchrun


@pytest.mark.parametrize("grace", [-1, math.nan, math.inf, True, "25"])
def test_a_grace_that_is_not_seconds_is_a_config_error_and_installs_nothing(grace: Any, usr1_restored: Any) -> None:
    with pytest.raises(ConfigError, match=rf"grace_s={grace!r} must be a number of seconds >= 0") as info:
        Preemption(grace_s=grace)
    assert isinstance(info.value, ValueError)
    assert {s: signal.getsignal(s) for s in usr1_restored} == usr1_restored


def test_the_grace_counts_down_from_the_signal(usr1_restored: Any) -> None:
    with Preemption() as none:
        assert none.remaining_s is None
    with Preemption(grace_s=25) as stop:
        time.sleep(0.05)
        assert stop.remaining_s == 25.0  # no notice yet: all of it
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        left = stop.remaining_s
        assert left is not None and 24.0 < left <= 24.85
        assert stop.requested(1) and stop.remaining_s <= left  # the agreement does not restart it
    with Preemption(grace_s=0) as spent:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert spent.remaining_s == 0.0


@pytest.mark.parametrize("timeout", [-0.5, math.nan, True, "5"])
def test_close_refuses_a_timeout_that_is_not_seconds_and_stays_open(tmp_path: Path, timeout: Any) -> None:
    ckpt = CheckpointManager(str(tmp_path / "root"), async_save=False)
    with pytest.raises(ArgumentError, match=r"close\(timeout_s=.*\): give a number of seconds >= 0"):
        ckpt.close(timeout_s=timeout)
    ckpt.save(1, {"w": torch.ones(2)})  # still open
    ckpt.close(timeout_s=0)
    assert ckpt.latest_step() == 1  # without a tier the save in flight is waited for whatever the timeout


def test_a_bound_beyond_what_a_lock_can_wait_still_waits_for_the_upload(
    s3: S3Endpoint, moto_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # grace_s=1e10 or timeout_s=inf: a Condition.wait that long raises OverflowError
    with FaultProxy(moto_endpoint) as proxy:
        ckpt = CheckpointManager(s3.url("root"), storage_options=s3.storage_options(proxy.endpoint_url),
                                 local=LocalTier(str(tmp_path / "local")))
        ckpt.save(1, {"w": torch.ones(4)}, durable=True)
        ckpt.wait()  # the local commit, and the upload: the save below is the one in flight
        proxy.set_latency(0.3)  # so that close() finds its upload running
        ckpt.save(2, {"w": torch.full((4,), 2.0)}, durable=True)
        ckpt.close(timeout_s=math.inf)
    assert ckpt.durable_step == 2 and ckpt.latest_step() == 2
    assert "not made durable" not in caplog.text and "on the local tier only" not in caplog.text


def test_the_trainer_grace_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--preemption", "--ckpt-url", "s3://b/c"]).grace_s == 25.0
    assert parse_args(["--preemption", "--ckpt-url", "s3://b/c", "--grace-s", "100"]).grace_s == 100.0
    with pytest.raises(SystemExit) as exc:
        parse_args(["--grace-s", "-1"])
    assert exc.value.code == 2 and "--grace-s -1.0: give the seconds" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- real processes
_LATE_RANK = """
import sys, time
import torch.distributed as dist
import streamio
dist.init_process_group("gloo")
stop = streamio.Preemption()
stop.requested(0)  # a vote in flight, as in a training loop
if dist.get_rank() == 0:
    time.sleep(2)  # a rank whose save ends later (rank 0 writes the pointer and prunes)
    open(sys.argv[1], "w").write("rank 0 finished")
stop.exit()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_on_bad_exit(procs: list[subprocess.Popen[str]], timeout_s: float) -> list[int]:
    """Wait for ``procs`` as ``srun --kill-on-bad-exit=1`` does: SIGKILL the others as soon as one
    exits non-zero (torchrun SIGTERMs them, which Preemption's handler absorbs, and SIGKILLs 30 s
    later). Returns every exit status."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert time.monotonic() < deadline, "the ranks did not end"
        time.sleep(0.005)
    return [p.wait() for p in procs]


@pytest.mark.slow
def test_exit_waits_for_every_rank_before_any_leaves(tmp_path: Path) -> None:
    script, done = tmp_path / "late_rank.py", tmp_path / "done"
    script.write_text(_LATE_RANK, encoding="utf-8")
    repo = str(Path(__file__).parents[2])  # this checkout's streamio, whatever the venv's editable install names
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(script), str(done)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    codes = _kill_on_bad_exit(procs, 120)
    logs = [p.communicate()[0] for p in procs]
    # without exit()'s barrier rank 1 leaves at once and rank 0 is killed before it is done
    assert done.read_text() == "rank 0 finished", logs
    assert codes == [Preemption.EXIT_CODE, Preemption.EXIT_CODE], logs
    assert all("preemption: exiting with status 143" in log for log in logs), logs


# ---------------------------------------------------------------------------------------- torchrun
ARGS = [*COMMON, "--max-steps", "60"]  # (a later flag wins)


def _pointed(s3: S3Endpoint, path: str) -> int | None:
    try:
        return int(json.loads(Store(s3.url(path), storage_options=s3.storage_options()).read("latest.json"))["step"])
    except FileNotFoundError:
        return None


def _local_steps(local: Path) -> list[int]:
    return [json.loads((local / f"rank-{r:05d}" / "latest.json").read_text())["step"] for r in (0, 1)]


def _preempted_step(out: Path) -> int:
    steps = [[r["step"] for r in read_metrics(out / f"rank-{k:05d}.jsonl") if r["event"] == "preempted"]
             for k in (0, 1)]
    assert steps[0] == steps[1] and len(steps[0]) == 1, steps
    return int(steps[0][0])


def _resumed_at(out: Path) -> list[int]:
    return [r["step"] for r in read_metrics(out / "rank-00000.jsonl") if r["event"] == "resume"]


def _same_run(ref: Path, parts: list[tuple[Path, int]]) -> None:
    """Per-step losses of ``parts`` (each up to its step) on both ranks, and the last one's final
    weights, equal the uninterrupted run's."""
    for k in (0, 1):
        ref_losses = _losses(ref, k)
        assert sorted(ref_losses) == list(range(1, 61))
        got: dict[int, float] = {}
        for out, upto in parts:
            got.update({s: v for s, v in _losses(out, k).items() if s <= upto})
        assert got == ref_losses
    want = torch.load(ref / "final_model.pt", weights_only=True)
    have = torch.load(parts[-1][0] / "final_model.pt", weights_only=True)
    assert want.keys() == have.keys() and all(torch.equal(want[k], have[k]) for k in want)


def _signal_rank_1(run: subprocess.Popen[str], ready: Any, what: str) -> float:
    deadline = time.monotonic() + 120
    while not ready():
        assert run.poll() is None and time.monotonic() < deadline, f"the run ended before {what}"
        time.sleep(0.005)
    os.kill(_rank_pid(run.pid, 1), signal.SIGTERM)
    return time.monotonic()


@pytest.mark.slow
def test_with_a_local_tier_the_save_is_durable_within_the_grace_or_the_local_copy_resumes(
    tmp_path: Path, s3: S3Endpoint, moto_endpoint: str
) -> None:
    env = _env(s3)
    ref_out, a_out, local = tmp_path / "ref", tmp_path / "a", tmp_path / "local"
    ref = _torchrun([*ARGS, "--ckpt-url", s3.url("ref"), "--out-dir", str(ref_out)], env)
    # A: a grace long enough: the preemption save is durable before every rank leaves
    tiered = ["--ckpt-url", s3.url("run"), "--local-ckpt", str(local)]
    a = _torchrun([*ARGS, *tiered, "--out-dir", str(a_out), "--grace-s", "60"], env)
    _signal_rank_1(a, lambda: _last_step(a_out / "rank-00001.jsonl") >= 3, "its third step")
    a_log = _finish(a)
    a_step = _preempted_step(a_out)
    assert a.returncode == 1 and f"exitcode  : {Preemption.EXIT_CODE}" in a_log, a_log[-3000:]
    assert "preemption requested (signal SIGTERM)" in a_log and "another rank's signal" in a_log
    # each rank leaves with the code itself (torchrun's report may list only the first to fail)
    leaving = {line.split("]")[0] for line in a_log.splitlines() if line.endswith("exiting with status 143")}
    assert leaving == {"[rank 0", "[rank 1"}, a_log[-3000:]
    assert max(_losses(a_out, 0)) == max(_losses(a_out, 1)) == a_step
    assert _pointed(s3, "run") == a_step and _local_steps(local) == [a_step, a_step]
    assert "was not made durable" not in a_log and "on the local tier only" not in a_log, a_log[-3000:]

    # B resumes A, its S3 through a proxy that delays every response 3 s once it resumed; 1 s of grace
    b_out = tmp_path / "b"
    with FaultProxy(moto_endpoint) as proxy:
        proxied = {**env, **s3.env(proxy.endpoint_url)}
        b = _torchrun([*ARGS, *tiered, "--out-dir", str(b_out), "--grace-s", "1"], proxied)

        def resumed_then_slow() -> bool:
            if _last_step(b_out / "rank-00001.jsonl") < a_step + 2:  # it resumed, and trains
                return False
            proxy.set_latency(3.0)
            return True

        signalled = _signal_rank_1(b, resumed_then_slow, f"step {a_step + 2}")
        b_log = _finish(b)
        b_took = time.monotonic() - signalled
    b_step = _preempted_step(b_out)
    assert b.returncode == 1 and f"exitcode  : {Preemption.EXIT_CODE}" in b_log, b_log[-3000:]
    assert _resumed_at(b_out) == [a_step] and b_step > a_step
    assert _pointed(s3, "run") == a_step and _local_steps(local) == [b_step, b_step]  # on the local tier only
    warning = (f"checkpoint step {b_step} is committed on the local tier at {local}/rank-0000{{}} but was not made "
               f"durable at {s3.url('run')} within")
    assert warning.format(0) in b_log and warning.format(1) in b_log, b_log[-3000:]
    assert "the root holds no save of this job (what it held before, if anything): a restart on this node" in b_log
    assert b_took < 25, b_took  # the upload needs many 3 s responses: it was not waited for

    # the same node (its local tier) resumes from the local copy; another node from the root's durable step
    fs = s3fs.S3FileSystem(**s3.storage_options())
    fs.copy(f"{s3.bucket}/run", f"{s3.bucket}/elsewhere", recursive=True)
    same_out, other_out = tmp_path / "same-node", tmp_path / "other-node"
    same = _torchrun([*ARGS, *tiered, "--out-dir", str(same_out)], env)
    other = _torchrun([*ARGS, "--ckpt-url", s3.url("elsewhere"), "--local-ckpt", str(tmp_path / "other-local"),
                       "--out-dir", str(other_out)], env)
    same_log, other_log, ref_log = _finish(same), _finish(other), _finish(ref)
    assert ref.returncode == 0, ref_log[-3000:]
    assert same.returncode == 0, same_log[-3000:]
    assert other.returncode == 0, other_log[-3000:]
    assert _resumed_at(same_out) == [b_step] and _resumed_at(other_out) == [a_step]
    _same_run(ref_out, [(a_out, a_step), (b_out, b_step), (same_out, 60)])
    _same_run(ref_out, [(a_out, a_step), (other_out, 60)])
