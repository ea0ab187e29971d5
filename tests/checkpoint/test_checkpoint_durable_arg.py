"""``save(durable=...)``: ``False`` must not be the silent spelling of "skip the root" (issue 34, item 16).

``durable=(step == last)`` reads as "force the last one", but ``False`` meant "local tier only"
and overrode ``durable_every``: every save but the last stayed off the root, silently. Now
``None`` (the default) follows ``durable_every``, ``True`` forces, ``"local"`` keeps a save off
the root; ``False`` keeps its old meaning for one release, with a ``DeprecationWarning`` naming
the new spelling. Anything else is refused before anything is written.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from streamio import CheckpointManager, LocalTier, SaveOptions
from streamio.errors import ArgumentError
from support.tiers import saved_steps


def state(step: int) -> dict[str, Any]:
    return {"w": torch.full((8,), float(step)), "progress": {"step": step}}


def _manager(tmp_path: Path, every: int) -> CheckpointManager:
    return CheckpointManager(str(tmp_path / "root"), local=LocalTier(str(tmp_path / "local"), keep=10),
                             options=SaveOptions(durable_every=every))


def test_none_follows_durable_every_and_true_forces_the_last(tmp_path: Path) -> None:
    last = 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation on the new spellings
        with _manager(tmp_path, every=2) as mgr:
            for step in range(1, last + 1):
                mgr.save(step, state(step), durable=True if step == last else None)
            mgr.wait()
            assert mgr.durable_step == 5
    assert saved_steps(tmp_path / "root")[-2:] == [4, 5]


def test_durable_local_keeps_a_due_save_off_the_root(tmp_path: Path) -> None:
    with _manager(tmp_path, every=1) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2), durable="local")
        mgr.wait()
        assert mgr.durable_step == 1
    assert saved_steps(tmp_path / "root") == [1]
    assert saved_steps(tmp_path / "local" / "rank-00000") == [1, 2]


def test_durable_false_warns_with_the_new_spelling_and_still_means_local_only(tmp_path: Path) -> None:
    """The reported misuse: ``durable=(step == last)`` with ``durable_every=2``."""
    last = 4
    with _manager(tmp_path, every=2) as mgr:
        for step in range(1, last):
            with pytest.warns(DeprecationWarning, match=r"durable=False\) keeps the save on the local tier only.*"
                              r"pass durable='local'.*durable=None") as record:
                mgr.save(step, state(step), durable=(step == last))
            assert record[0].filename == __file__  # points at the caller
        mgr.save(last, state(last), durable=(last == last))
        mgr.wait()
        assert mgr.durable_step == 4
    assert saved_steps(tmp_path / "root") == [4]  # still the old meaning, for one release: 2 stayed local


@pytest.mark.parametrize(
    "value",
    [1, 0, "never", "LOCAL", numpy.bool_(True), torch.tensor(True), 1.0],
    ids=["1", "0", "never", "LOCAL", "numpy-bool", "torch-bool", "float"],
)
def test_anything_else_is_refused_before_anything_is_written(tmp_path: Path, value: object) -> None:
    with _manager(tmp_path, every=1) as mgr:
        with pytest.raises(ArgumentError, match=r"durable must be None .*True .*or 'local'") as info:
            mgr.save(1, state(1), durable=value)  # type: ignore[arg-type]
        assert isinstance(info.value, TypeError) and f"save(durable={value!r})" in str(info.value)
        mgr.save(2, state(2))  # the manager is still usable
        mgr.wait()
    assert saved_steps(tmp_path / "root") == [2] and saved_steps(tmp_path / "local" / "rank-00000") == [2]
