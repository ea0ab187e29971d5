"""streamio.Preemption: the handler only sets a flag, ranks agree on one step, the trainer saves it and exits.

In-process: real signals to this process (``os.kill``), the handlers installed and restored, the
schedule of agreements (a hypothesis property). The reference trainer on 2 gloo ranks under
torchrun, SIGTERM to ONE rank's process only (every rank saves the same step, exits with
``Preemption.EXIT_CODE``, a restart reproduces an uninterrupted run bit for bit): the first part
of tests/train/test_preemption_grace.py, which imports this file's launch helpers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamio import Preemption
from streamio.errors import ConfigError
from streamio.preemption import check_due
from streamio.testing import S3Endpoint
from streamio.train.config import parse_args
from streamio.train.telemetry import read_metrics


def _deliver(sig: int) -> None:
    """Send ``sig`` to this process and let the main thread run its Python handler."""
    os.kill(os.getpid(), sig)
    time.sleep(0.01)  # the handler runs between bytecodes of the main thread, at the latest here


def test_the_handler_only_records_the_first_signal_and_the_process_goes_on(usr1_restored: Any) -> None:
    with Preemption() as stop:
        assert not stop.signalled and stop.received is None
        _deliver(signal.SIGUSR1)
        _deliver(signal.SIGTERM)  # a second signal (torchrun forwarding, a user) changes nothing
        assert stop.signalled and stop.received == signal.SIGUSR1
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is left alone
    assert signal.getsignal(signal.SIGTERM) == usr1_restored[signal.SIGTERM]


def test_close_restores_the_previous_handlers_once(usr1_restored: Any) -> None:
    seen: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    previous = signal.getsignal(signal.SIGUSR1)
    stop = Preemption(signals=("SIGUSR1",))
    _deliver(signal.SIGUSR1)
    assert seen == [] and stop.signalled  # ours replaces the previous one while installed
    stop.close()
    stop.close()  # idempotent: a second close does not reinstall anything stale
    assert signal.getsignal(signal.SIGUSR1) is previous
    _deliver(signal.SIGUSR1)
    assert seen == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGTERM) == usr1_restored[signal.SIGTERM]  # never touched


def test_requested_without_a_process_group_checks_every_n_steps_and_then_stays_true(usr1_restored: Any) -> None:
    with Preemption(check_every=3) as stop:
        assert [stop.requested(s) for s in (1, 2, 3)] == [False, False, False]
        _deliver(signal.SIGTERM)
        assert [stop.requested(s) for s in (4, 5)] == [False, False]  # not due: no answer yet
        assert stop.requested(6) is True
        assert stop.requested(7) is True  # latched: every rank agreed at step 6
    assert "check_every=3" in repr(stop) and "signalled=True" in repr(stop)


@given(start=st.integers(0, 10**6), every=st.integers(1, 50))
def test_exactly_one_check_in_any_check_every_consecutive_steps(start: int, every: int) -> None:
    due = [s for s in range(start, start + every) if check_due(s, every)]
    assert len(due) == 1 and due[0] % every == 0
    assert check_due(start, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"signals": ("SIGNOPE",)}, "'SIGNOPE' is not a signal on this platform"),
        ({"signals": (99999,)}, "99999 is not a signal on this platform"),
        ({"signals": (True,)}, "True is not a signal"),
        ({"signals": ("SIGKILL",)}, "SIGKILL cannot be caught by any process"),
        ({"signals": "SIGTERM"}, "must be a sequence of names, e.g. ('SIGTERM',)"),
        ({"check_every": 0}, "check_every=0 must be an int >= 1"),
        ({"check_every": True}, "check_every=True must be an int >= 1"),
    ],
)
def test_bad_arguments_are_config_errors_and_install_nothing(
    kwargs: dict[str, Any], message: str, usr1_restored: Any
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        Preemption(**kwargs)
    assert isinstance(info.value, ValueError)
    assert {s: signal.getsignal(s) for s in usr1_restored} == usr1_restored


def test_outside_the_main_thread_it_is_a_config_error(usr1_restored: Any) -> None:
    errors: list[BaseException] = []

    def make() -> None:
        try:
            Preemption()
        except ConfigError as exc:
            errors.append(exc)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "must be made in the main thread" in str(errors[0])
    assert {s: signal.getsignal(s) for s in usr1_restored} == usr1_restored


class _SignalsItself(torch.utils.data.Dataset[int]):
    """Each item SIGTERMs the worker that loads it (what torchrun's killpg or Slurm does to a worker)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        return index


def test_dataloader_workers_made_with_worker_init_fn_outlive_a_sigterm(usr1_restored: Any) -> None:
    with Preemption() as stop:
        loader = torch.utils.data.DataLoader(_SignalsItself(), num_workers=1, worker_init_fn=stop.worker_init_fn)
        assert [int(b) for b in loader] == [0, 1, 2, 3]
        assert not stop.signalled  # the worker's signals stayed in the worker
        # the same loader without it: the worker dies and the main process is told so
        bare = torch.utils.data.DataLoader(_SignalsItself(), num_workers=1)
        with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"):
            list(bare)


def test_exit_leaves_with_the_documented_status() -> None:
    code = "import streamio; stop = streamio.Preemption(); print('bye', flush=True); stop.exit()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == Preemption.EXIT_CODE == 143, done.stderr
    assert "preemption: exiting with status 143" in done.stderr


def test_the_trainer_flag_needs_a_checkpoint_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--preemption", "--ckpt-url", "s3://b/c"]).preemption is True
    assert parse_args([]).preemption is False
    with pytest.raises(SystemExit) as exc:
        parse_args(["--preemption"])
    assert exc.value.code == 2 and "--preemption needs --ckpt-url" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- torchrun
COMMON = [
    "--train-samples", "4096", "--val-samples", "64", "--batch-size", "16", "--grad-accum", "1", "--hidden", "64",
    "--num-workers", "2", "--epochs", "2", "--max-steps", "40", "--ckpt-every", "0", "--log-every", "0",
    "--collective-timeout-s", "60", "--preemption",
]


def _env(s3: S3Endpoint) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    return {**env, **s3.env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _torchrun(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           "-m", "streamio.train", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    return out


def _rank_pid(torchrun_pid: int, rank: int) -> int:
    """The pid of ``rank``'s process: a child of torchrun whose environment says RANK=rank."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours
        if ppid == torchrun_pid and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no process of rank {rank} under torchrun pid {torchrun_pid}")


def _last_step(path: Path) -> int:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line)["step"] for line in lines[:-1] if '"event": "step"' in line]  # the last may be partial
    return max(steps, default=0)


def _losses(out: Path, rank: int) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / f"rank-{rank:05d}.jsonl") if r["event"] == "step"}
