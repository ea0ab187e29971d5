"""streamio.lightning.PreemptionCheckpoint in one process: what it refuses (class, message, the signal
handlers as they were), whose signal handlers are installed while ``fit`` trains and after it, and
the Slurm requeue (a real ``scontrol`` stand-in on PATH). The 2-rank SIGTERM run is in
test_lightning_ddp.py."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio import Preemption
from streamio.checkpoint.root import committed_saves
from streamio.errors import ConfigError
from streamio.storage import Store

L = pytest.importorskip("lightning")

from streamio.lightning import ModelCheckpoint, PreemptionCheckpoint  # noqa: E402
from streamio.lightning.preemption import requeue_slurm_job, slurm_job_id  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.handlers: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.handlers.append(signal.getsignal(signal.SIGTERM))
        return self.net(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, callbacks: list[Any], model: Model | None = None) -> Model:
    model = model or Model()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=callbacks)
    trainer.fit(model, torch.utils.data.DataLoader(torch.zeros(4, 2), batch_size=2))
    return model


@pytest.mark.parametrize(("signals", "check_every", "message"), [
    (("SIGKILL",), 1, "SIGKILL cannot be caught"),
    (("SIGNOPE",), 1, "'SIGNOPE' is not a signal"),
    (("SIGTERM",), 0, "check_every=0 must be an int >= 1"),
])
def test_bad_arguments_are_refused_and_leave_the_handlers_alone(signals: Any, check_every: int, message: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ConfigError, match=message):
        PreemptionCheckpoint(signals, check_every=check_every)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_without_a_streamio_model_checkpoint_fit_is_refused_before_the_first_step(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    model = Model()
    with pytest.raises(ConfigError, match=r"add ModelCheckpoint\(dirpath=...\) to its callbacks"):
        _fit(tmp_path, [PreemptionCheckpoint()], model)  # Lightning's own ModelCheckpoint only
    assert model.handlers == []  # no step ran
    assert signal.getsignal(signal.SIGTERM) is before  # nothing left installed
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_the_signals_are_ours_while_training_and_lightnings_before_and_after(tmp_path: Path) -> None:
    before, before_usr1 = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    callback = PreemptionCheckpoint()
    model = _fit(tmp_path, [ModelCheckpoint(dirpath=str(tmp_path / "ckpt")), callback])
    assert [getattr(h, "__self__", None).__class__.__name__ for h in model.handlers] == ["Preemption"] * 2
    assert callback.stop is None and callback.saved is None  # released at the end, nothing saved without a signal
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGUSR1) is before_usr1
    assert callback.worker_init_fn.signals == (int(signal.SIGTERM), int(signal.SIGUSR1))


@pytest.mark.parametrize(("environ", "job"), [
    ({"SLURM_JOB_ID": "1234"}, "1234"),
    ({"SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "6"}, "1234_6"),
])
def test_slurm_job_id(environ: dict[str, str], job: str) -> None:
    assert slurm_job_id(environ) == job


@pytest.mark.parametrize("environ", [{}, {"SLURM_JOB_ID": "12; rm -rf /"}, {"SLURM_ARRAY_JOB_ID": "12"},
                                     {"SLURM_JOB_ID": ""}])
def test_a_job_id_that_is_not_one_is_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="is not a Slurm job id; run under sbatch"):
        slurm_job_id(environ)


def _scontrol(bin_dir: Path, code: int) -> Path:
    """A stand-in ``scontrol`` on PATH that records its arguments and exits ``code``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{bin_dir}/calls"\nexit {code}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir / "calls"


def test_requeue_runs_scontrol_and_says_when_it_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    calls = _scontrol(tmp_path / "ok", 0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'ok'}{os.pathsep}{os.environ['PATH']}")
    with caplog.at_level(logging.WARNING, logger="streamio.lightning.preemption"):
        assert requeue_slurm_job({"SLURM_JOB_ID": "77"}) is True
        assert calls.read_text() == "requeue 77\n"
        failing = _scontrol(tmp_path / "fail", 3)
        monkeypatch.setenv("PATH", f"{tmp_path / 'fail'}{os.pathsep}{os.environ['PATH']}")
        assert requeue_slurm_job({"SLURM_JOB_ID": "78"}) is False
        assert failing.read_text() == "requeue 78\n"
        assert requeue_slurm_job({}) is False  # no job: nothing run, said so
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        assert requeue_slurm_job({"SLURM_JOB_ID": "79"}) is False  # no scontrol at all
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "preemption: requeued Slurm job 77"
    assert messages[1] == "preemption: scontrol requeue 78 exited 3: the job was not requeued"
    assert messages[2].startswith("preemption: the job was not requeued: Slurm requeue: the job id ''")
    assert messages[3].startswith("preemption: the job was not requeued: [Errno 2]")
    assert calls.read_text() == "requeue 77\n" and failing.read_text() == "requeue 78\n"


@pytest.mark.slow
def test_one_process_under_slurm_saves_requeues_and_exits_143_and_a_failed_save_is_fits_error(tmp_path: Path) -> None:
    """Without a process group the signal is acted upon at its own step. Under Lightning's
    SLURMEnvironment(auto_requeue=True), SIGUSR1 saves through streamio (not Lightning's hpc_ckpt
    from its handler) and requeues the job (a real ``scontrol`` stand-in on PATH). A save that fails
    (last.ckpt is a regular file here) is raised by fit: exit 1, not 143, the file untouched."""
    script = Path(__file__).parents[1] / "support" / "lightning_preempt_one.py"
    calls = _scontrol(tmp_path / "bin", 0)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "1"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ok"), "3", "SIGUSR1"], env={**env, **slurm},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == Preemption.EXIT_CODE == 143, done.stderr[-3000:]
    assert "preemption requested (signal SIGUSR1): saving step 3" in done.stderr
    assert [s.step for s in committed_saves(Store(str(tmp_path / "ok" / "last.ckpt")))] == [3]
    assert calls.read_text() == "requeue 4242\n"
    assert not list(tmp_path.rglob("hpc_ckpt*"))  # Lightning's own Slurm handler did not run

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "last.ckpt").write_bytes(b"not a root")
    failed = subprocess.run([sys.executable, str(script), str(tmp_path / "bad"), "3"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "CheckpointFormatError" in failed.stderr and "last.ckpt holds" in failed.stderr
    assert "exiting with status 143" not in failed.stderr
    assert (tmp_path / "bad" / "last.ckpt").read_bytes() == b"not a root"
