"""The seams of the checkpoint package: the injected phase hook, the single-process topology, and
the one state-version check of the small states saved beside the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamio.checkpoint import CheckpointManager, KeepLast
from streamio.checkpoint.rng import RNGState
from streamio.checkpoint.save.commit import PHASES
from streamio.errors import CheckpointFormatError
from streamio.train.checkpointing import EarlyStopping, Progress


def _state(step: int) -> dict[str, object]:
    return {"w": torch.full((4,), float(step)), "meta": {"step": step}}


def test_on_phase_is_called_with_every_phase_in_order(tmp_path: Path) -> None:
    seen: list[str] = []
    with CheckpointManager(str(tmp_path), retention=KeepLast(1), async_save=False, on_phase=seen.append) as mgr:
        mgr.save(1, _state(1))
        first = list(seen)
        mgr.save(2, _state(2))  # retention deletes step 1: manifest first ("delete"), then its parts
    assert first == ["parts", "markers", "manifest", "pointer", "retention"]
    assert seen[len(first):] == ["parts", "markers", "manifest", "pointer", "delete", "retention"]
    assert set(seen) == set(PHASES)


def test_managers_do_not_share_a_phase_hook(tmp_path: Path) -> None:
    seen: list[str] = []
    with CheckpointManager(str(tmp_path / "a"), async_save=False, on_phase=seen.append):
        with CheckpointManager(str(tmp_path / "b"), async_save=False) as other:
            other.save(1, _state(1))
    assert seen == []


def test_without_a_process_group_the_manager_is_one_process_whatever_torchrun_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RANK=1 alone must not make this rank 1 of 2: there are no collectives to reach rank 0,
    # so it would never publish its save.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with CheckpointManager(str(tmp_path), async_save=False) as mgr:
        assert (mgr.rank, mgr.world_size) == (0, 1)
        mgr.save(3, _state(3))
        assert mgr.latest_step() == 3
        got = {"w": torch.zeros(4), "meta": None}
        assert mgr.restore(got) == 3
    assert torch.equal(got["w"], torch.full((4,), 3.0)) and got["meta"] == {"step": 3}


@pytest.mark.parametrize(
    ("load", "message"),
    [
        (lambda s: Progress().load_state_dict(s), "progress state has version 2, but this streamio reads version 1"),
        (lambda s: EarlyStopping(1).load_state_dict(s), "early-stopping state has version 2, but this streamio reads"),
        (lambda s: RNGState(rank=0, world_size=1).load_state_dict(s), "RNG state has version 2, but this streamio"),
    ],
)
def test_saved_states_refuse_another_version_with_one_message(load: object, message: str) -> None:
    with pytest.raises(CheckpointFormatError, match=message):
        load({"version": 2, "mode": "min"})  # type: ignore[operator]


def test_rng_state_that_is_not_a_dict_is_a_format_error() -> None:
    with pytest.raises(CheckpointFormatError, match="RNG state must be a dict made by state_dict"):
        RNGState(rank=0, world_size=1).load_state_dict([1, 2])  # type: ignore[arg-type]


def test_early_stopping_state_of_the_other_mode_names_both_modes() -> None:
    state = EarlyStopping(1, mode="max").state_dict()
    with pytest.raises(CheckpointFormatError, match="saved in mode 'max', this trainer runs in mode 'min'"):
        EarlyStopping(1).load_state_dict(state)
