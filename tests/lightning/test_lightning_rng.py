"""Every rank's RNG streams in the checkpoint (streamio.lightning.rng), one process: through the
plugin and back, the re-seed rule on another world size, and claims that are not RNG states.
Two real ranks: tests/lightning/test_lightning_ddp.py (each rank's draws after kill -9 and resume)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from streamio.checkpoint.rng import RNGState
from streamio.errors import CheckpointFormatError

pytest.importorskip("lightning")

from streamio.lightning import CheckpointIO  # noqa: E402
from streamio.lightning.rng import KEY, PendingRNG, gather_rng  # noqa: E402


def _draws() -> tuple[float, float, float]:
    return float(torch.rand(1)), random.random(), float(np.random.rand())


def test_the_streams_go_through_the_plugin_and_come_back_at_the_first_batch(tmp_path: Path) -> None:
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    checkpoint = {"global_step": 8, "state_dict": {"w": torch.ones(2)}}
    gather_rng(checkpoint, rank=0, world=1)
    expected = _draws()
    io = CheckpointIO()
    io.save_checkpoint(checkpoint, tmp_path / "last.ckpt")
    pending = PendingRNG()
    pending.loaded(io.load_checkpoint(tmp_path / "last.ckpt"))
    _draws()  # what Lightning draws between the restore and the first batch (the loader's base seed)
    pending.apply(rank=0, world=1)
    assert _draws() == expected
    pending.apply(rank=0, world=1)  # once only: the second batch goes on drawing
    assert _draws() != expected


def test_another_world_size_reseeds_by_the_documented_rule(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    states = [RNGState(seed=7, rank=r, world_size=2).state_dict() for r in (0, 1)]
    reference = RNGState(seed=7)
    reference.reseeds = 1
    reference.reseed(rank=0, world_size=1)
    expected = _draws()
    pending = PendingRNG()
    pending.loaded({KEY: states})
    with caplog.at_level(logging.WARNING):
        pending.apply(rank=0, world=1)
    assert _draws() == expected
    assert "saved with world size 2 and is loaded with world size 1" in caplog.text


@pytest.mark.parametrize(("claim", "said"), [
    ({"rank0": {}}, "holds a dict"), ([], "holds a list of 0"), ([1, 2], "holds a list of 2"),
])
def test_an_entry_that_is_no_list_of_states_is_refused_naming_it(claim: object, said: str) -> None:
    with pytest.raises(CheckpointFormatError, match=rf"'{KEY}' {said}, not a list of 1 to \d+ RNG state dicts"):
        PendingRNG().loaded({KEY: claim})


def test_a_state_that_is_not_an_rng_state_is_refused_and_the_streams_stay() -> None:
    torch.manual_seed(5)
    before = torch.get_rng_state()
    pending = PendingRNG()
    pending.loaded({KEY: [{"version": 1, "seed": 0}]})
    with pytest.raises(CheckpointFormatError, match=rf"'{KEY}' entry for rank 0 is not an RNG state \(KeyError"):
        pending.apply(rank=0, world=1)
    assert torch.equal(torch.get_rng_state(), before)
    pending = PendingRNG()
    pending.loaded({"global_step": 3})  # a checkpoint written without the callback: nothing to restore
    pending.apply(rank=0, world=1)
    assert torch.equal(torch.get_rng_state(), before)
