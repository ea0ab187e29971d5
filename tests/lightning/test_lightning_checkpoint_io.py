"""streamio.lightning's CheckpointIO and ModelCheckpoint on the local S3 server (moto over HTTP),
one process: the format and the layout, rebinding a path, top-k removal, ``ckpt_path="last"``,
refusals and errors a user can act on."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from streamio.checkpoint.root import committed_saves, delete_save, pointer_url, read_pointer
from streamio.errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    MissingDependencyError,
    StorageError,
)
from streamio.storage import RetryPolicy, Store
from streamio.testing import GcsEndpoint, S3Endpoint

L = pytest.importorskip("lightning")

from streamio.cli.main import cli  # noqa: E402
from streamio.lightning import CheckpointIO, ModelCheckpoint  # noqa: E402
from streamio.lightning.paths import newest_last  # noqa: E402
from support.structures import same as _equal  # noqa: E402


def _ckpt(step: int, weight: float = 1.0) -> dict[str, Any]:
    """What Lightning's dump_checkpoint hands the plugin, in miniature."""
    return {
        "epoch": 0, "global_step": step, "pytorch-lightning_version": L.__version__,
        "state_dict": {"net.weight": torch.full((2, 3), weight), "net.bias": torch.zeros(2)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(float(step))}},
                              "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1]}]}],
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 1}}, "state_dict": {}}},
        "callbacks": {"ModelCheckpoint{'monitor': 'step'}": {"best_model_score": torch.tensor(3.0),
                                                             "kth_value": torch.tensor(float("inf"))}},
        "hyper_parameters": {"lr": 0.01, "name": None},
    }



@pytest.fixture
def io(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> CheckpointIO:
    for name, value in s3.env().items():  # what Lightning's own fsspec calls (ModelCheckpoint._fs) use
        monkeypatch.setenv(name, value)
    return CheckpointIO(storage_options=s3.storage_options())


def test_a_checkpoint_path_is_a_streamio_root_that_round_trips_and_the_cli_reads(io: CheckpointIO,
                                                                                s3: S3Endpoint) -> None:
    path = s3.url("run/ckpt/epoch=0-step=50.ckpt")
    io.save_checkpoint(_ckpt(50), path)
    assert _equal(io.load_checkpoint(path), _ckpt(50))
    store = Store(path, s3.storage_options())
    assert [s.step for s in committed_saves(store)] == [50]
    assert not any(o.path.endswith((".pt", ".pkl")) for o in store.list())
    env = s3.env()
    for verb in ("ls", "verify"):
        res = CliRunner(env=env).invoke(cli, ["ckpt", verb, path, "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
    listed = json.loads(CliRunner(env=env).invoke(cli, ["ckpt", "ls", path, "--json"]).stdout)
    assert [s["step"] for s in listed] == [50], listed


def test_save_last_rebinds_a_path_to_the_same_step_and_to_an_earlier_one(
        io: CheckpointIO, s3: S3Endpoint, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamio")
    path = s3.url("run/ckpt/last.ckpt")
    io.save_checkpoint(_ckpt(8, 1.0), path)
    io.save_checkpoint(_ckpt(8, 2.0), path)  # save_last after top-k at one step: no CheckpointConflictError
    assert torch.equal(io.load_checkpoint(path)["state_dict"]["net.weight"], torch.full((2, 3), 2.0))
    io.save_checkpoint(_ckpt(4, 3.0), path)  # resumed from an older checkpoint: the path follows the job
    loaded = io.load_checkpoint(path)
    assert loaded["global_step"] == 4 and torch.equal(loaded["state_dict"]["net.weight"], torch.full((2, 3), 3.0))
    assert [s.step for s in committed_saves(Store(path, s3.storage_options()))] == [4]  # the old ones retired
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # what it was asked
    assert sum("supersedes it" in r.getMessage() for r in caplog.records) == 2
    store = Store(path, s3.storage_options())
    store.put("step-000000002/manifest.json", b"not a manifest")  # something actually wrong: still a warning
    io.save_checkpoint(_ckpt(5, 4.0), path)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "retired checkpoint step 2" in warned[0] and "manifest is unusable" in warned[0]
    assert [s.step for s in committed_saves(store)] == [5]


def test_a_value_the_format_cannot_hold_is_refused_naming_its_key_and_nothing_is_visible(
        io: CheckpointIO, s3: S3Endpoint) -> None:
    path = s3.url("run/ckpt/epoch=0-step=5.ckpt")
    for value in (object(), torch.nn.Linear(1, 1), lambda: 0):
        bad = _ckpt(5)
        bad["hyper_parameters"]["thing"] = value
        with pytest.raises(CheckpointError, match=r"hyper_parameters.*thing|thing.*hyper_parameters"):
            io.save_checkpoint(bad, path)
    assert read_pointer(Store(path, s3.storage_options())) is None
    with pytest.raises(CheckpointNotFoundError):
        io.load_checkpoint(path)


def test_remove_checkpoint_deletes_exactly_that_root(io: CheckpointIO, s3: S3Endpoint) -> None:
    keep, gone = s3.url("run/ckpt/epoch=0-step=4.ckpt"), s3.url("run/ckpt/epoch=0-step=40.ckpt")
    io.save_checkpoint(_ckpt(4), keep)
    io.save_checkpoint(_ckpt(40), gone)
    io.remove_checkpoint(gone)
    assert Store(gone, s3.storage_options()).list() == []
    assert _equal(io.load_checkpoint(keep), _ckpt(4))
    io.remove_checkpoint(gone)  # again: nothing there, nothing raised


def test_last_lookup_takes_the_newest_committed_last_root_never_a_half_written_one(io: CheckpointIO,
                                                                                  s3: S3Endpoint) -> None:
    opts = s3.storage_options()
    dirpath = s3.url("run/ckpt")
    assert newest_last(dirpath, opts) is None
    io.save_checkpoint(_ckpt(12), f"{dirpath}/epoch=0-step=12.ckpt")  # not a last: never chosen
    io.save_checkpoint(_ckpt(4), f"{dirpath}/last.ckpt")
    io.save_checkpoint(_ckpt(8), f"{dirpath}/last-v1.ckpt")
    v1 = Store(f"{dirpath}/last-v1.ckpt", opts)
    assert newest_last(dirpath, opts) == pointer_url(v1)
    assert io.load_checkpoint(pointer_url(v1))["global_step"] == 8  # the pointer's URL names its root
    delete_save(v1, read_pointer(v1).path)  # half removed: the pointer names a save without a manifest
    assert newest_last(dirpath, opts) == pointer_url(Store(f"{dirpath}/last.ckpt", opts))
    Store(f"{dirpath}/last-v2.ckpt", opts).put("step-000000020/rank-00000/part-x-00000.bin", b"x" * 10)
    assert newest_last(dirpath, opts) == pointer_url(Store(f"{dirpath}/last.ckpt", opts))  # no pointer yet


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(io: CheckpointIO, dirpath: str, max_steps: int) -> Any:
    return L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, plugins=[io],
                     callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_last=True)])


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_ckpt_path_last_resumes_from_s3_in_a_real_trainer(io: CheckpointIO, s3: S3Endpoint,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="streamio")
    dirpath = s3.url("run/ckpt")
    data = torch.utils.data.DataLoader(torch.randn(64, 3), batch_size=4)
    _trainer(io, dirpath, 6).fit(_Tiny(), data, ckpt_path="last")  # nothing yet: starts from scratch
    trainer = _trainer(io, dirpath, 8)
    trainer.fit(_Tiny(), data, ckpt_path="last")
    assert trainer.ckpt_path == pointer_url(Store(f"{dirpath}/last.ckpt", s3.storage_options()))
    assert read_pointer(Store(f"{dirpath}/last.ckpt", s3.storage_options())).step == 8
    assert [r.getMessage() for r in caplog.records if r.name.startswith("streamio")] == []  # 4 saves of last, quiet


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_a_ckpt_path_that_names_nothing_says_so(io: CheckpointIO, s3: S3Endpoint) -> None:
    data = torch.utils.data.DataLoader(torch.randn(8, 3), batch_size=4)
    nothing = s3.url("run/ckpt/epoch=3-step=99.ckpt")
    with pytest.raises(CheckpointNotFoundError, match=r"ckpt_path '.*epoch=3-step=99\.ckpt' names no streamio"):
        _trainer(io, s3.url("run/ckpt"), 2).fit(_Tiny(), data, ckpt_path=nothing)
    assert Store(s3.url("run"), s3.storage_options()).list() == []  # and wrote nothing


def test_an_unreachable_root_is_a_storage_error_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    io = CheckpointIO(storage_options={"key": "k", "secret": "s", "endpoint_url": f"http://127.0.0.1:{port}",
                                       "client_kwargs": {"region_name": "us-east-1"}},
                      retry=RetryPolicy(max_attempts=2, initial_backoff=0.01, max_total=2))
    for call in (lambda: io.save_checkpoint(_ckpt(1), "s3://bucket/run/ckpt/last.ckpt"),
                 lambda: io.load_checkpoint("s3://bucket/run/ckpt/last.ckpt")):
        with pytest.raises(StorageError, match=r"s3://bucket/run/ckpt/last\.ckpt"):
            call()


def test_storage_options_per_call_are_refused(io: CheckpointIO, s3: S3Endpoint) -> None:
    with pytest.raises(TypeError, match=r"give them once, as CheckpointIO\(storage_options=\.\.\.\)"):
        io.save_checkpoint(_ckpt(1), s3.url("x/last.ckpt"), storage_options={"a": 1})
    assert Store(s3.url("x"), s3.storage_options()).list() == []


def test_streamio_never_imports_lightning_and_says_what_to_install_without_it() -> None:
    code = """
import sys
import streamio, streamio.lightning
assert "lightning" not in sys.modules, "import streamio imported lightning"
for name in ("lightning", "lightning.fabric.plugins", "lightning_fabric", "lightning_fabric.plugins"):
    sys.modules[name] = None  # neither package name of Lightning
from streamio.errors import MissingDependencyError
try:
    streamio.lightning.CheckpointIO
except MissingDependencyError as exc:
    print("ERROR", isinstance(exc, ImportError), exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("ERROR True streamio.lightning needs Lightning (")
    assert out.rstrip().endswith("Install it with pip install 'streamio-torch[lightning]'")
    assert issubclass(MissingDependencyError, ImportError)


def test_a_local_file_at_a_checkpoint_path_is_named_and_never_blocks(tmp_path: Path) -> None:
    io = CheckpointIO()
    torch.save({"state_dict": {}}, tmp_path / "last.ckpt")  # what Lightning's own plugin wrote there before
    os.mkfifo(tmp_path / "fifo.ckpt")
    for name, what in (("last.ckpt", "a Lightning/torch.save checkpoint: load it with its own tool"),
                       ("fifo.ckpt", "a file, not a directory")):
        with pytest.raises(CheckpointFormatError, match=f"{name} holds {what}; it is not a checkpoint of"):
            io.load_checkpoint(tmp_path / name)
        with pytest.raises(CheckpointFormatError, match=f"{name} holds {what}; it is not a checkpoint of"):
            io.save_checkpoint(_ckpt(1), tmp_path / name)
    assert torch.load(tmp_path / "last.ckpt") == {"state_dict": {}}  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.ckpt", "last.ckpt"]


def test_lightnings_async_checkpoint_io_saves_through_the_plugin_in_its_thread(io: CheckpointIO,
                                                                              s3: S3Endpoint) -> None:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    path = s3.url("run/ckpt/last.ckpt")
    wrapped = AsyncCheckpointIO(io)
    state = _ckpt(7)
    wrapped.save_checkpoint(state, path)  # returns once Lightning has cloned the tensors; the save runs behind
    state["state_dict"]["net.weight"].add_(5.0)  # training goes on: the save keeps what was handed over
    wrapped.teardown()  # what Lightning calls at the end of fit: waits for the save
    assert _equal(io.load_checkpoint(path), _ckpt(7))
    bad = _ckpt(9)
    bad["hyper_parameters"]["thing"] = object()
    wrapped.save_checkpoint(bad, path)
    with pytest.raises(CheckpointError, match=r"hyper_parameters.*thing|thing.*hyper_parameters"):
        wrapped.teardown()  # a failed save in Lightning's thread is raised here (or by the next save)
    assert read_pointer(Store(path, s3.storage_options())).step == 7  # the path still holds step 7, whole
    assert _equal(io.load_checkpoint(path), _ckpt(7))


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_async_saves_resume_with_ckpt_path_last_and_top_k_removes_each_path_after_its_save(
        io: CheckpointIO, s3: S3Endpoint) -> None:
    from streamio.lightning import AsyncCheckpointIO
    from streamio.lightning.callback import _storage_options

    opts = s3.storage_options()
    dirpath = s3.url("run/ckpt")
    data = torch.utils.data.DataLoader(torch.randn(64, 3), batch_size=4)
    _trainer(AsyncCheckpointIO(io), dirpath, 6).fit(_Tiny(), data, ckpt_path="last")
    last = Store(f"{dirpath}/last.ckpt", opts)
    assert read_pointer(last).step == 6  # fit's teardown waited for the last save
    trainer = _trainer(AsyncCheckpointIO(io), dirpath, 8)
    assert _storage_options(trainer) == opts  # the lookup's, found inside Lightning's wrapper
    trainer.fit(_Tiny(), data, ckpt_path="last")
    assert trainer.ckpt_path == pointer_url(last)
    assert read_pointer(last).step == 8 and [s.step for s in committed_saves(last)] == [8]
    roots = sorted({o.path.split("/")[0] for o in Store(dirpath, opts).list()})
    assert roots == ["epoch=0-step=8.ckpt", "last.ckpt"], roots  # save_top_k=1 removed the others, none came back


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")
def test_top_k_save_last_and_ckpt_path_last_on_gcs_in_a_real_trainer(gcs: GcsEndpoint,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in gcs.env().items():  # what Lightning's own fsspec calls (ModelCheckpoint._fs) use
        monkeypatch.setenv(name, value)
    io, opts, dirpath = CheckpointIO(storage_options=gcs.storage_options()), gcs.storage_options(), gcs.url("run/ckpt")
    data = torch.utils.data.DataLoader(torch.randn(64, 3), batch_size=4)

    def trainer(max_steps: int) -> Any:
        return L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, plugins=[io],
                         callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_last=True,
                                                    save_top_k=2, monitor="step", mode="max")])

    trainer(6).fit(_Tiny(), data, ckpt_path="last")  # nothing yet: starts from scratch
    resumed = trainer(8)
    resumed.fit(_Tiny(), data, ckpt_path="last")
    assert resumed.ckpt_path == pointer_url(Store(f"{dirpath}/last.ckpt", opts))
    roots = sorted({info.path.split("/")[0] for info in Store(dirpath, opts).list()})
    assert roots == ["epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt", "last.ckpt"]  # top-2 kept, the rest removed
    assert read_pointer(Store(f"{dirpath}/last.ckpt", opts)).step == 8
    assert io.load_checkpoint(f"{dirpath}/epoch=0-step=6.ckpt")["global_step"] == 6
