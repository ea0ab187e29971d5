"""Collective misuse is an error, not a hang: save/restore called on one rank only.

The slow test runs tests/support/ckpt_collective.py ``misuse`` under torchrun (2 gloo ranks,
``SaveOptions(collective_timeout_s=3)``): rank 0 saves alone (the ``torch.save`` habit), each
rank restores alone, the ranks save different steps, a manager is constructed on rank 0 only.
Each must end in a ``CheckpointError`` naming the ranks that did not come, within the timeout,
and the processes must still exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.checkpoint.comm import Comm
from support.ckpt_collective import SHORT_WAITS

TIMEOUT_S = 3.0
SLACK_S = 12.0  # two shared CPUs: how late past the timeout the error may come


def test_collective_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="collective_timeout_s"):
        SaveOptions(collective_timeout_s=0)


def test_without_a_process_group_arrival_is_immediate() -> None:
    comm = Comm(timeout_s=0.001)
    assert (comm.rank, comm.world) == (0, 1)
    comm.arrive("save", 3, where="saving step 3")  # nothing to wait for


def test_restore_takes_step_by_keyword_and_positionally_only_with_a_warning(tmp_path: Path) -> None:
    """``step`` is keyword-only since 0.2.0; 0.1's positional form warns until 0.3.0."""
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, {"progress": {"step": 1}})
        mgr.wait()
        with pytest.warns(DeprecationWarning, match="pass step=1"):
            assert mgr.restore({"progress": None}, 1) == 1
        with pytest.raises(TypeError):
            mgr.restore({"progress": None}, 1, 2)  # type: ignore[arg-type]
        state: dict[str, Any] = {"progress": None}
        assert mgr.restore(state, step=1) == 1 and state["progress"] == {"step": 1}


@pytest.fixture(scope="module")
def misuse(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("misuse")
    out = tmp / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script = (Path(__file__).parents[1] / "support" / "ckpt_collective.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), "misuse", str(tmp / "ckpt"), str(out), str(TIMEOUT_S)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # every rank got past its error and exited
    return json.loads(out.read_text())


def _failed_in_time(attempt: dict[str, Any], *needles: str) -> str:
    message = attempt["error"]
    assert message is not None, attempt
    assert TIMEOUT_S * 0.9 <= attempt["s"] <= TIMEOUT_S + SLACK_S, attempt
    for needle in needles:
        assert needle in message, (needle, message)
    return str(message)


ON_EVERY_RANK = "save() and restore() are collective: call them on every rank"


@pytest.mark.slow
def test_rank0_saving_alone_gets_an_error_naming_rank1(misuse: list[dict[str, Any]]) -> None:
    rank0 = misuse[0]
    _failed_in_time(rank0["save_alone"], "saving step 1", "rank 1 did not reach it within 3 s",
                    "collective_timeout_s", ON_EVERY_RANK)
    # the manager refuses at once afterwards, and close() returns (the error was raised once)
    after = rank0["save_after"]
    assert after["s"] < 1 and "fell out of step" in after["error"] and "restart the job" in after["error"]
    assert rank0["close"]["error"] is None


@pytest.mark.slow
def test_restore_on_one_rank_only_gets_an_error_naming_the_other(misuse: list[dict[str, Any]]) -> None:
    _failed_in_time(misuse[0]["restore_alone_0"], "restoring the newest step", "rank 1 did not reach it",
                    ON_EVERY_RANK)
    _failed_in_time(misuse[1]["restore_alone_1"], "restoring the newest step", "rank 0 did not reach it",
                    ON_EVERY_RANK)


@pytest.mark.slow
def test_a_wait_that_times_out_is_a_timeout_whatever_its_fraction_of_a_millisecond(
    misuse: list[dict[str, Any]]
) -> None:
    # torch hands gloo whole milliseconds, cut down: a wait to 50.99 ms from now ended before its
    # deadline in 8 of 60 and read as a closed connection, so an arrival named a rank that was alive
    # and elsewhere "rank 1 had closed its connections" instead of "did not reach it"
    assert misuse[0]["short_waits"] == [False] * SHORT_WAITS


@pytest.mark.slow
def test_ranks_saving_different_steps_all_raise_then_agree_again(misuse: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(misuse):
        message = result["different_steps"]["error"]
        assert "rank 0 called save(step=10); rank 1 called save(step=11)" in message, message
        assert f"saving step {10 + rank}" in message and ON_EVERY_RANK in message
        assert result["agreed_save"] == {"error": None, "value": True, "s": result["agreed_save"]["s"]}
        assert result["agreed_restore"]["value"] == 20


@pytest.mark.slow
def test_a_manager_constructed_on_one_rank_only_is_an_error(misuse: list[dict[str, Any]]) -> None:
    _failed_in_time(misuse[0]["construct_alone"], "constructed its CheckpointManager within 3 s",
                    "construct it on every rank")


def test_save_options_default_timeout_is_minutes() -> None:
    assert 60 <= SaveOptions().collective_timeout_s <= 900
    assert Comm().timeout_s == SaveOptions().collective_timeout_s
