"""Model wrappers: a checkpoint of ``DDP(model)`` / ``torch.compile(model)`` restores into ``model``.

In one process, ``DataParallel`` stands for DDP (the same wrapper type family, the same ``module.``
prefix; DDP itself needs a process group) and ``torch.compile(backend="eager")`` is a real compiled
module (no C++ toolchain needed: the ``_orig_mod`` wrapper is the same with every backend). The
slow test runs real DDP on 2 gloo ranks (torchrun) over S3 (moto), in both directions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.checkpoint.root import read_manifest
from streamio.checkpoint.tensors.wrappers import ModuleKeys
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.ckpt_collective import wrapper_model


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A checkpoint root on local disk and on S3 (moto), with its storage options."""
    if request.param == "file":
        return str(tmp_path / "ckpt"), {}
    s3: S3Endpoint = request.getfixturevalue("s3")
    return s3.url("wrapped"), s3.storage_options()


def _trained() -> torch.nn.Module:
    """wrapper_model() moved away from its initial values (weights and BatchNorm statistics)."""
    model = wrapper_model()
    model.train()
    model(torch.randn(16, 6))  # running statistics and num_batches_tracked move
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    return model


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def _round_trip(root: tuple[str, dict[str, Any]], saved: torch.nn.Module, live: torch.nn.Module, step: int) -> None:
    url, options = root
    with CheckpointManager(url, storage_options=options) as mgr:
        mgr.save(step, {"model": saved})
    with CheckpointManager(url, storage_options=options) as mgr:
        assert mgr.restore({"model": live}, step=step) == step


def _saved_keys(root: tuple[str, dict[str, Any]], step: int) -> set[str]:
    return set(read_manifest(Store(root[0], root[1]), step).replicated.tensors)


def test_ddp_style_wrapper_restores_into_the_plain_module_and_back(root: tuple[str, dict[str, Any]]) -> None:
    trained = _trained()
    plain = wrapper_model()
    _round_trip(root, torch.nn.DataParallel(trained), plain, 1)
    assert _same(plain, trained)
    # saved under the module's own names, not the wrapper's
    assert _saved_keys(root, 1) == {f"model/{k}" for k in trained.state_dict()}

    wrapped = torch.nn.DataParallel(wrapper_model())
    _round_trip(root, trained, wrapped, 2)
    assert _same(wrapped.module, trained)


def test_compiled_module_restores_into_the_plain_module_and_back(root: tuple[str, dict[str, Any]]) -> None:
    trained = _trained()
    plain = wrapper_model()
    _round_trip(root, torch.compile(trained, backend="eager"), plain, 1)
    assert _same(plain, trained)
    assert _saved_keys(root, 1) == {f"model/{k}" for k in trained.state_dict()}

    inner = wrapper_model()
    compiled = torch.compile(inner, backend="eager")
    weight = inner[0].weight
    _round_trip(root, trained, compiled, 2)
    assert _same(inner, trained)
    assert inner[0].weight is weight  # loaded in place: the compiled graph's parameters


def test_nested_wrappers_and_a_compiled_submodule_use_the_same_keys(tmp_path: Path) -> None:
    trained = _trained()
    want = {k: v.clone() for k, v in trained.state_dict().items()}
    trained[2] = torch.compile(trained[2], backend="eager")  # a compiled submodule: "2._orig_mod.weight"
    both = torch.compile(torch.nn.DataParallel(trained), backend="eager")  # "_orig_mod.module.0.weight"
    assert "_orig_mod.module.2._orig_mod.weight" in both.state_dict()
    plain = wrapper_model()
    _round_trip((str(tmp_path), {}), both, plain, 1)
    got = plain.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_buffers_of_wrapped_modules_get_their_state_keys() -> None:
    """The snapshot takes module buffers (BatchNorm statistics) from rank 0 by their state key:
    ``named_buffers()`` must map to the same canonical names as ``state_dict()``, also under
    activation checkpointing, whose hooks drop its segment from the state keys only."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = wrapper_model()
    model[1] = checkpoint_wrapper(model[1])
    for live in (model, torch.nn.DataParallel(model), torch.compile(model, backend="eager")):
        keys = ModuleKeys(live)
        state = keys.canonical(live.state_dict())
        buffers = {keys.canonical_key(b) for b, _ in live.named_buffers()}
        assert buffers == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
        assert list(state) == list(wrapper_model().state_dict())
        assert "" in state._metadata and "1" in state._metadata  # type: ignore[attr-defined]
        assert not any("module" in p for p in state._metadata)  # type: ignore[attr-defined]


class _Holder(torch.nn.Module):
    """Not a wrapper: a module whose child is called ``module``. Its state has DDP's key names,
    which is what checkpoints of a DDP model held before keys were made wrapper-independent."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.module = inner


def test_a_checkpoint_with_ddp_key_names_restores_into_the_plain_module(tmp_path: Path) -> None:
    trained = _trained()
    holder = _Holder(trained)
    assert next(iter(holder.state_dict())).startswith("module.")
    plain = wrapper_model()
    _round_trip((str(tmp_path), {}), holder, plain, 1)
    assert _same(plain, trained)
    # and a live module that really has a child called "module" keeps its own names
    other = _Holder(wrapper_model())
    with CheckpointManager(str(tmp_path)) as mgr:
        assert mgr.restore({"model": other}) == 1
    assert _same(other.module, trained)


def test_adopt_saved_renames_only_onto_exactly_the_live_keys() -> None:
    live = OrderedDict.fromkeys(["0.weight", "1.running_mean"])
    saved: OrderedDict[str, Any] = OrderedDict(
        [("module._orig_mod.0.weight", 1), ("module._orig_mod.1.running_mean", 2)]
    )
    saved._metadata = OrderedDict([("", {"version": 1}), ("module", {"version": 1}),  # type: ignore[attr-defined]
                                   ("module._orig_mod.1", {"version": 2})])
    adopted = ModuleKeys.adopt_saved(saved, live)
    assert dict(adopted) == {"0.weight": 1, "1.running_mean": 2}
    assert adopted._metadata == {"": {"version": 1}, "1": {"version": 2}}
    # not a rename onto other keys: left as saved, and the key check names the difference
    assert ModuleKeys.adopt_saved(saved, OrderedDict.fromkeys(["0.weight", "2.bias"])) is saved


@pytest.mark.slow
def test_real_ddp_on_two_ranks_restores_plain_and_saves_for_plain(s3: S3Endpoint, tmp_path: Path) -> None:
    """plain -> DDP on 2 gloo ranks, then DDP -> plain in this process, through S3 (moto)."""
    url, options = s3.url("ddp-wrap"), s3.storage_options()
    plain = wrapper_model()
    with torch.no_grad():
        for v in plain.state_dict().values():
            v.add_(1)
    with CheckpointManager(url, storage_options=options, options=SaveOptions(part_size=64 << 10)) as mgr:
        mgr.save(1, {"model": plain})
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CKPT_TEST_STORAGE_OPTIONS=json.dumps(options), OMP_NUM_THREADS="1")
    script = (Path(__file__).parents[1] / "support" / "ckpt_collective.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), "wrappers", url, str(out)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["plain_to_ddp"] for r in json.loads(out.read_text())] == [True, True]

    live = wrapper_model()
    with CheckpointManager(url, storage_options=options) as mgr:
        assert mgr.restore({"model": live}) == 2
    want = {k: v + 1 for k, v in wrapper_model().state_dict().items()}
    for name, _ in wrapper_model().named_parameters():
        want[name] = want[name] * 3
    want["1.running_mean"] = torch.full((8,), 0.25)
    got = live.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want), {k for k in want if not torch.equal(got[k], want[k])}
    assert _saved_keys((url, options), 2) == {f"model/{k}" for k in want}
