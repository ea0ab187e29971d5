"""``streamio.distributed``: the one place rank and world size are looked up."""

from __future__ import annotations

import pytest

from streamio.distributed import group_initialized, local_rank_and_world, rank_and_world
from streamio.errors import PlanError


def test_torchrun_environment_then_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not group_initialized()  # no process group in the test process
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert rank_and_world() == (0, 1) and local_rank_and_world() == (0, 1)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert rank_and_world() == (5, 8) and local_rank_and_world() == (1, 4)


@pytest.mark.parametrize(("var", "lookup"), [("WORLD_SIZE", rank_and_world), ("LOCAL_RANK", local_rank_and_world)])
def test_a_non_integer_variable_is_named(monkeypatch: pytest.MonkeyPatch, var: str, lookup: object) -> None:
    monkeypatch.setenv(var, "two")
    with pytest.raises(PlanError, match=rf"{var}='two'.* are not integers; launch with torchrun"):
        lookup()  # type: ignore[operator]


def test_leave_flushes_and_exits_with_the_code_without_running_exit_handlers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    code = (
        "import atexit, sys\n"
        "from streamio.distributed import leave\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "print('buffered out', end='')\n"
        "sys.stderr.write('buffered err')\n"
        "leave(3)\n"
        "print('after')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert proc.stdout == "buffered out" and proc.stderr == "buffered err"  # flushed; nothing after, no atexit
