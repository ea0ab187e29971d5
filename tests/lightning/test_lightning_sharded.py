"""streamio.lightning.ModelParallelStrategy: sharded Lightning checkpoints through streamio's torch DCP
writer and reader. One process on the local S3 server (moto over HTTP) and memory:// for the format,
the rest of the dict, rebinding a path and the refusals; real Lightning under torchrun (FSDP2 on 2
gloo ranks, CPU) for kill -9, ``fit(ckpt_path="last")`` and resharding onto 1 rank."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.checkpoint.root import committed_saves, read_pointer
from streamio.errors import (
    ArgumentError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConfigError,
)
from streamio.storage import Store
from streamio.testing import S3Endpoint

L = pytest.importorskip("lightning")

from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict  # noqa: E402

from streamio.checkpoint.comm import Comm  # noqa: E402
from streamio.cli.main import cli  # noqa: E402
from streamio.lightning import CheckpointIO, ModelParallelStrategy  # noqa: E402
from streamio.lightning.sharded import load_sharded, save_sharded  # noqa: E402
from support.structures import same as _equal  # noqa: E402

SCRIPT = Path(__file__).parents[1] / "support" / "lightning_sharded.py"
_roots = itertools.count()
_SHARDED = ("state_dict", "optimizer_states")  # what Lightning's dict holds as shards


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def _ckpt(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, **rest: Any) -> dict[str, Any]:
    """What Lightning's ModelParallelStrategy hands save_checkpoint, in miniature (one process: plain tensors)."""
    return {"epoch": 0, "global_step": step, "state_dict": get_model_state_dict(model),
            "optimizer_states": [get_optimizer_state_dict(model, optimizer)],
            "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1}}}},
            "callbacks": {"ModelCheckpoint{'monitor': 'step'}": {"best_model_score": torch.tensor(3.0)}}, **rest}



@pytest.fixture
def io(s3: S3Endpoint) -> CheckpointIO:
    return CheckpointIO(storage_options=s3.storage_options())


def test_a_sharded_save_is_one_streamio_root_that_loads_model_optimizer_and_rest(io: CheckpointIO,
                                                                                 s3: S3Endpoint) -> None:
    model, optimizer = _trained(0)
    path = s3.url("run/ckpt/epoch=0-step=7.ckpt")
    save_sharded(_ckpt(model, optimizer, 7), path, io, Comm())
    store = Store(path, s3.storage_options())
    assert [s.step for s in committed_saves(store)] == [7]
    assert not any(o.path.endswith((".pt", ".pkl", ".metadata", ".distcp")) for o in store.list())  # no pickle
    res = CliRunner(env=s3.env()).invoke(cli, ["ckpt", "verify", path], catch_exceptions=False)
    assert res.exit_code == 0, res.output

    fresh, fresh_optimizer = _trained(1)
    rest = load_sharded(path, io, Comm(), fresh, [fresh_optimizer])
    assert _equal(get_model_state_dict(fresh), get_model_state_dict(model))
    assert _equal(get_optimizer_state_dict(fresh, fresh_optimizer), get_optimizer_state_dict(model, optimizer))
    expected = _ckpt(model, optimizer, 7)
    assert _equal(rest, {k: v for k, v in expected.items() if k not in ("state_dict", "optimizer_states")})


_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**62), 2**62), st.text(max_size=5),
                    st.floats(allow_nan=False), st.builds(torch.tensor, st.lists(st.floats(-1, 1), max_size=3)))
_values = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 9)), inner, max_size=3)), max_leaves=8)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rest=st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k not in _SHARDED), _values, max_size=4))
def test_the_rest_of_the_dict_comes_back_as_it_was_saved(rest: dict[str, Any]) -> None:
    """Int keys, empty dicts, tuples holding tensors: what DCP's flattening would change comes back as saved."""
    model, optimizer = _trained(0)
    path = f"memory://lightning-sharded-{os.getpid()}-{next(_roots)}/last.ckpt"
    checkpoint = {"global_step": 1, "state_dict": get_model_state_dict(model),
                  "optimizer_states": [get_optimizer_state_dict(model, optimizer)], **rest}
    save_sharded(checkpoint, path, CheckpointIO(), Comm())
    loaded = load_sharded(path, CheckpointIO(), Comm(), model, [optimizer])
    assert _equal(loaded, {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")})


def test_a_path_saved_again_at_the_same_or_an_earlier_step_holds_the_newest_save(io: CheckpointIO,
                                                                                 s3: S3Endpoint) -> None:
    path = s3.url("run/ckpt/last.ckpt")
    for step, seed in ((8, 0), (8, 1), (4, 2)):  # save_last after top-k at one step; a job resumed from step 4
        model, optimizer = _trained(seed)
        save_sharded(_ckpt(model, optimizer, step), path, io, Comm())
    fresh, fresh_optimizer = _trained(3)
    assert load_sharded(path, io, Comm(), fresh, [fresh_optimizer])["global_step"] == 4
    assert _equal(get_model_state_dict(fresh), get_model_state_dict(_trained(2)[0]))
    assert [s.step for s in committed_saves(Store(path, s3.storage_options()))] == [4]  # the old ones retired


def test_a_value_that_needs_pickle_is_refused_naming_its_key_and_nothing_is_visible(io: CheckpointIO,
                                                                                   s3: S3Endpoint) -> None:
    model, optimizer = _trained(0)
    path = s3.url("run/ckpt/epoch=0-step=3.ckpt")
    with pytest.raises(CheckpointError, match=r"hyper_parameters.*thing"):
        save_sharded(_ckpt(model, optimizer, 3, hyper_parameters={"thing": object()}), path, io, Comm())
    with pytest.raises(CheckpointError, match=r"epoch=0-step=3.ckpt' has no 'state_dict'"):
        save_sharded({"global_step": 3}, path, io, Comm())
    assert read_pointer(Store(path, s3.storage_options())) is None


def test_loading_what_is_not_a_sharded_streamio_checkpoint_names_the_path_and_changes_nothing(
        io: CheckpointIO, s3: S3Endpoint, tmp_path: Path) -> None:
    model, optimizer = _trained(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointNotFoundError, match=r"ckpt_path '.*/nothing.ckpt' names no streamio checkpoint"):
        load_sharded(s3.url("run/ckpt/nothing.ckpt"), io, Comm(), model, [optimizer])
    ddp = s3.url("run/ckpt/ddp.ckpt")  # what CheckpointIO writes with strategy="ddp"
    io.save_checkpoint({"global_step": 2, "state_dict": model.state_dict()}, ddp)
    with pytest.raises(CheckpointFormatError, match=r"ddp.ckpt cannot be loaded by a sharded .*not written through "
                                                    r"torch DCP.*loads with that strategy"):
        load_sharded(ddp, io, Comm(), model, [optimizer])
    import torch.distributed.checkpoint as dcp  # what Lightning's own ModelParallelStrategy writes at a path

    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "own.ckpt")
    torch.save({"global_step": 2}, tmp_path / "own.ckpt" / "meta.pt")
    with pytest.raises(CheckpointFormatError, match=r"own.ckpt' is not a streamio checkpoint .*holds a "
                                                    r"torch.distributed.checkpoint directory"):
        load_sharded(str(tmp_path / "own.ckpt"), CheckpointIO(), Comm(), model, [optimizer])
    torch.save({"state_dict": model.state_dict()}, tmp_path / "torch.ckpt")
    with pytest.raises(CheckpointFormatError, match=r"torch.ckpt holds a Lightning/torch.save checkpoint"):
        load_sharded(str(tmp_path / "torch.ckpt"), CheckpointIO(), Comm(), model, [optimizer])
    other = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))  # another model
    save_sharded(_ckpt(other, torch.optim.Adam(other.parameters()), 5), s3.url("run/ckpt/other.ckpt"), io, Comm())
    with pytest.raises(CheckpointError, match=r"loading checkpoint step 5 .*other.ckpt.* failed on rank 0"):
        load_sharded(s3.url("run/ckpt/other.ckpt"), io, Comm(), model, [optimizer])
    assert _equal(model.state_dict(), before)


def test_the_strategy_refuses_what_it_cannot_save_through_streamio(s3: S3Endpoint) -> None:
    with pytest.raises(ConfigError, match=r"save_distributed_checkpoint=False gathers the whole state on rank 0"):
        ModelParallelStrategy(save_distributed_checkpoint=False)
    strategy = ModelParallelStrategy()
    assert isinstance(strategy.checkpoint_io, CheckpointIO)  # removals and the last lookup go through streamio
    path = s3.url("run/ckpt/last.ckpt")
    with pytest.raises(ArgumentError, match=r"storage_options=dict for .*last.ckpt.*CheckpointIO\(storage_options"):
        strategy.save_checkpoint({}, path, storage_options={"anon": True})
    strategy.checkpoint_io = L.fabric.plugins.TorchCheckpointIO()
    with pytest.raises(ConfigError, match=r"checkpoint plugin is TorchCheckpointIO: pass plugins=\[streamio"):
        strategy.save_checkpoint({}, path)
    with pytest.raises(ConfigError, match=r"checkpoint plugin is TorchCheckpointIO"):
        strategy.load_checkpoint(path)
    assert Store(path, s3.storage_options()).list() == []


# ------------------------------------------------------------------ real Lightning, torchrun, 2 gloo ranks
def _run(s3: S3Endpoint, ranks: int, out: Path, steps: int, *, kill_at: int = 0, resume: bool = False,
         dirpath: str = "ckpt") -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env())
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), str(SCRIPT),
         s3.url(dirpath), str(out), str(steps), str(kill_at), "1" if resume else "0"],
        env=env, capture_output=True, text=True, timeout=300, start_new_session=True,  # its own process group
    )
    if kill_at:
        assert proc.returncode != 0 and not out.exists(), proc.stderr[-3000:]
        return {}
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_kill_9_then_last_resumes_bit_exactly_and_reshards_onto_1_rank(s3: S3Endpoint,
                                                                                 tmp_path: Path) -> None:
    full = _run(s3, 2, tmp_path / "full.json", 8, dirpath="full")
    _run(s3, 2, tmp_path / "killed.json", 8, kill_at=5)
    parent = Store(s3.url("ckpt"), s3.storage_options())
    pointer = read_pointer(parent.child("last.ckpt"))
    assert pointer is not None and pointer.step == 3  # killed after step 5; saves every 3 steps

    resumed = _run(s3, 2, tmp_path / "resumed.json", 8, resume=True)
    assert resumed["global_step"] == full["global_step"] == 8
    assert sorted(map(int, resumed["losses"])) == list(range(3, 8))  # it went on after step 3, not from 0
    assert resumed["losses"] == {k: full["losses"][k] for k in resumed["losses"]}
    assert resumed["weights"] == full["weights"] and resumed["adam_steps"] == full["adam_steps"] == [8]
    roots = sorted({o.path.split("/")[0] for o in parent.list()})  # top-2 by step and last, one save each
    assert roots == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"], roots
    assert [s.step for s in committed_saves(parent.child("last.ckpt"))] == [6]
    res = CliRunner(env=s3.env()).invoke(cli, ["ckpt", "verify", s3.url("ckpt/last.ckpt")], catch_exceptions=False)
    assert res.exit_code == 0, res.output

    # 2 ranks' shards onto 1 rank: step 6's loss (before its update) is the 2-rank run's on rank 0 (the
    # same weights, the same inputs), and Adam's step count goes on from 6. (1 rank onto 2 is the same
    # code path; a fifth launch would add ~45 s on 2 busy cores.)
    one = _run(s3, 1, tmp_path / "one.json", 10, resume=True)
    assert one["losses"]["6"] == full["losses"]["6"] and sorted(map(int, one["losses"])) == list(range(6, 10))
    assert one["adam_steps"] == [10]
    assert [s.step for s in committed_saves(parent.child("last.ckpt"))] == [9]
