"""RNGState: capture -> draw -> restore gives the same draws, for every RNG, through JSON and torch.load."""

from __future__ import annotations

import io
import json
import logging
import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checkpoint.rng import RNGState
from streamio.errors import CheckpointFormatError


def _draw_all(gens: dict[str, np.random.Generator]) -> dict[str, Any]:
    return {
        "python": [random.random() for _ in range(5)] + [random.gauss(0, 1)],
        "numpy": np.random.rand(5).tolist() + [float(np.random.randn())],
        "torch": torch.rand(5).tolist() + torch.nn.functional.dropout(torch.ones(16), 0.5).tolist(),
        **{name: g.random(4).tolist() + g.integers(0, 1 << 62, 3).tolist() for name, g in gens.items()},
    }


def _to_json(obj: Any) -> str:
    """A JSON serializer for tensors, standing in for the checkpoint's tensor part."""

    def default(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return {"__tensor__": o.tolist(), "dtype": str(o.dtype).removeprefix("torch.")}
        raise TypeError(type(o))

    return json.dumps(obj, default=default)


def _from_json(text: str) -> Any:
    def hook(d: dict[str, Any]) -> Any:
        if "__tensor__" in d:
            return torch.tensor(d["__tensor__"], dtype=getattr(torch, d["dtype"]))
        return d

    return json.loads(text, object_hook=hook)


def _only_json_and_tensors(obj: Any) -> bool:
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _only_json_and_tensors(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_only_json_and_tensors(v) for v in obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return -(2**63) < obj < 2**63
    return obj is None or isinstance(obj, (str, float, bool, torch.Tensor))


@pytest.fixture
def gens() -> dict[str, np.random.Generator]:
    return {
        "pcg": np.random.default_rng(1),
        "mt": np.random.Generator(np.random.MT19937(2)),
        "philox": np.random.Generator(np.random.Philox(3)),
    }


@pytest.mark.parametrize("roundtrip", ["direct", "json", "torch_weights_only"])
def test_restore_gives_the_same_draws(gens: dict[str, np.random.Generator], roundtrip: str) -> None:
    rng = RNGState(seed=7, generators=gens, rank=0, world_size=1)
    _draw_all(gens)  # move every RNG away from its seed state
    random.gauss(0, 1)  # leaves a cached gaussian in Python's random
    np.random.randn()  # and one in NumPy's legacy state
    state = rng.state_dict()
    assert _only_json_and_tensors(state)
    if roundtrip == "json":
        state = _from_json(_to_json(state))
    elif roundtrip == "torch_weights_only":
        buf = io.BytesIO()
        torch.save(state, buf)
        state = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    expected = _draw_all(gens)
    assert _draw_all(gens) != expected  # the draws really move on
    rng.load_state_dict(state)
    assert _draw_all(gens) == expected


@pytest.mark.parametrize("which", ["python", "numpy", "torch", "pcg"])
def test_each_rng_is_restored_on_its_own(gens: dict[str, np.random.Generator], which: str) -> None:
    """Each RNG is captured: drawing from only one of them between save and restore is undone."""
    rng = RNGState(generators=gens, rank=0, world_size=1)
    state = rng.state_dict()
    draw = {
        "python": lambda: random.random(),
        "numpy": lambda: float(np.random.rand()),
        "torch": lambda: float(torch.rand(())),
        "pcg": lambda: float(gens["pcg"].random()),
    }[which]
    first = [draw() for _ in range(3)]
    rng.load_state_dict(state)
    assert [draw() for _ in range(3)] == first


def test_big_ints_are_strings_and_the_mt_key_an_int64_tensor(gens: dict[str, np.random.Generator]) -> None:
    """Big PCG64 words are strings: the JSON part is portable (no integer beyond int64)."""
    state = RNGState(generators=gens, rank=0, world_size=1).state_dict()
    pcg = state["numpy_generators"]["pcg"]["state"]
    assert isinstance(pcg["state"], dict) and "__int__" in pcg["state"]
    assert isinstance(state["numpy_legacy"]["key"], torch.Tensor) and state["numpy_legacy"]["key"].dtype == torch.int64


def test_other_world_size_reseeds_deterministically_and_logs(
    gens: dict[str, np.random.Generator], caplog: pytest.LogCaptureFixture
) -> None:
    state = RNGState(seed=3, generators=gens, rank=0, world_size=2).state_dict()
    _draw_all(gens)
    expected_same = None
    for _ in range(2):
        rng = RNGState(generators=gens, rank=1, world_size=3)
        with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.rng"):
            rng.load_state_dict(state)
        draws = _draw_all(gens)
        assert expected_same is None or draws == expected_same
        expected_same = draws
    assert "world size 2" in caplog.text and "re-seeded" in caplog.text
    assert rng.seed == 3 and rng.reseeds == 1
    # another rank of the new topology draws a different stream
    RNGState(generators=gens, rank=2, world_size=3).load_state_dict(state)
    assert _draw_all(gens) != expected_same


def test_unknown_version_and_missing_generator_are_clear_errors(gens: dict[str, np.random.Generator]) -> None:
    state = RNGState(rank=0, world_size=1).state_dict()
    with pytest.raises(CheckpointFormatError, match="version 99"):
        RNGState(rank=0, world_size=1).load_state_dict({**state, "version": 99})
    with pytest.raises(CheckpointFormatError, match="pcg"):
        RNGState(generators=gens, rank=0, world_size=1).load_state_dict(state)


def test_topology_comes_from_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    state = RNGState().state_dict()
    assert (state["rank"], state["world_size"]) == (3, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh checks it too)")
def test_every_cuda_device_is_restored() -> None:
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    for dev in devices:
        torch.rand(1, device=dev)  # initialise each generator
    rng = RNGState(rank=0, world_size=1)
    state = rng.state_dict()
    assert len(state["cuda"]) == len(devices)
    first = [torch.rand(4, device=dev).cpu() for dev in devices]
    rng.load_state_dict(state)
    assert all(torch.equal(a, torch.rand(4, device=dev).cpu()) for a, dev in zip(first, devices, strict=False))


@given(seed=st.integers(0, 2**32 - 1), before=st.integers(0, 700), after=st.integers(1, 50))
@settings(max_examples=25, deadline=None)
def test_any_position_restores_exactly(seed: int, before: int, after: int) -> None:
    """Wherever the RNGs are (past the MT19937 624-word refill too), a restore replays the same draws."""
    gen = np.random.default_rng(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    rng = RNGState(generators={"g": gen}, rank=0, world_size=1)
    for _ in range(before):
        random.random(), np.random.random(), gen.random()
    torch.rand(before + 1)
    state = rng.state_dict()
    expected = [_draw_all({"g": gen}) for _ in range(after)]
    rng.load_state_dict(state)
    assert [_draw_all({"g": gen}) for _ in range(after)] == expected
