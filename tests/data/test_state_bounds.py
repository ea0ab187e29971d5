"""A loaded data position is untrusted: each size it claims is bounded before anything is allocated.

Issue 23: a dataset state (restored from a checkpoint, say) claiming world_size 10**9 or 10**8
DataLoader workers made the planner allocate for them: 8 GB before anything refused it. Every
claimed size (world size, workers, batch size, consumed batches, epoch, a worker's yielded count,
stages) is now checked against a bound and against the data set before planning. The loads run in
a child process (tests/support/state_probe.py) whose address space is capped at its size + 1 GiB,
so a regression fails there with a MemoryError instead of exhausting the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from streamio.data.dataset import StreamingDataset
from streamio.errors import PlanError
from support.dataset import make_dataset

PROBE = str(Path(__file__).parents[1] / "support" / "state_probe.py")
COUNTS = [5, 7, 3, 9]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "small")
    make_dataset(url, None, COUNTS)
    return url


def probe(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    return subprocess.run(
        [sys.executable, PROBE, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.mark.slow
def test_the_claims_of_the_issue_are_refused_quickly_naming_field_and_value(url: str) -> None:
    out = probe(url, "claims", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]


@pytest.mark.slow
def test_any_mutated_state_is_loaded_or_refused_with_a_streamio_error_in_bounded_memory(url: str) -> None:
    examples = settings().max_examples  # the loaded profile's: 100, or 300 under --hypothesis-profile=ci
    out = probe(url, "fuzz", str(examples), timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]


def test_the_message_names_the_field_its_value_and_the_limit(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ds = StreamingDataset(url, batch_size=4)
    state = ds.state_after(2)
    state["plan"]["stages"][0]["world_size"] = 10**9
    with pytest.raises(PlanError, match=r"stage 0 world_size=1000000000 is above the limit of 1048576"):
        ds.load_state_dict(state)
    state["plan"]["stages"][0]["world_size"] = 5000  # within the bound, but more ranks than the 24 samples
    with pytest.raises(PlanError, match=r"world_size=5000 is more ranks than the 24 samples"):
        ds.load_state_dict(state)
    assert ds.position.resume is None and len(ds) == 24  # refused states change nothing
