"""A run resumed through the README quick start is bit-exact with dropout (issue 34, item 13).

Each ``iter(loader)`` used to draw the DataLoader workers' base seed from the global torch RNG,
the one dropout draws from; a resumed run drew it at another point of that stream (mid-epoch, just
after the RNG was restored), so every later dropout mask, and every loss, differed from the
uninterrupted run's. Real processes run the quick start's script (tests/support/dropout_train.py,
2 workers): uninterrupted, and killed with SIGKILL after step 17 then restarted from its step-15
checkpoint; every step's loss must be the same float, bit for bit.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from streamio.data.loader import StreamingDataLoader
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store

SCRIPT = Path(__file__).parents[1] / "support" / "dropout_train.py"
STEPS = 36  # 96 samples, batches of 8: 12 steps x 3 epochs


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "train")
    rng = random.Random(0)
    samples = []
    for i in range(96):
        x = [rng.gauss(0, 1) for _ in range(8)]
        samples.append({"__key__": f"{i:05d}", "json": json.dumps({"x": x, "y": sum(x) / 3}).encode()})
    write_dataset(iter(samples), Store(url), spec=ShardSpec(max_count=20))
    return url


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts the script; whatever still runs when the test ends (a failure) is killed and reaped."""
    runs: list[subprocess.Popen[str]] = []

    def run(url: str, ckpt: Path, out: Path, die_at: int | None = None) -> subprocess.Popen[str]:
        args = [sys.executable, str(SCRIPT), url, str(ckpt), str(out)] + ([str(die_at)] if die_at else [])
        runs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        return runs[-1]

    yield run
    for proc in runs:
        proc.kill()
        proc.communicate()


def losses(run: subprocess.Popen[str], out: Path, code: int) -> dict[int, str]:
    """The losses by step of ``run``, once it ended with exit status ``code``."""
    log, _ = run.communicate(timeout=180)
    assert run.returncode == code, log[-3000:]
    return {int(s): loss for s, loss in (line.split() for line in out.read_text().splitlines())}


@pytest.mark.slow
def test_a_run_killed_and_resumed_is_bit_exact_with_dropout(
    url: str, tmp_path: Path, start: Callable[..., subprocess.Popen[str]]
) -> None:
    uninterrupted = start(url, tmp_path / "full", tmp_path / "full.txt")
    killed = start(url, tmp_path / "cut", tmp_path / "head.txt", die_at=17)
    head = losses(killed, tmp_path / "head.txt", -9)
    rest = losses(start(url, tmp_path / "cut", tmp_path / "rest.txt"), tmp_path / "rest.txt", 0)
    full = losses(uninterrupted, tmp_path / "full.txt", 0)
    assert sorted(full) == list(range(1, STEPS + 1))
    assert sorted(head) == list(range(1, 18)) and sorted(rest) == list(range(16, STEPS + 1))  # resumed at 15
    differ = [s for s in range(1, STEPS + 1) if (rest.get(s) or head[s]) != full[s]]
    assert differ == [], f"steps {differ[:5]}... differ from the uninterrupted run"


def test_iterating_the_loader_leaves_the_global_rng_alone(url: str) -> None:
    """With 0 and 2 workers, iter() draws nothing from torch's global generator (dropout's)."""
    from streamio.data.dataset import StreamingDataset

    for workers in (0, 2):
        loader = StreamingDataLoader(StreamingDataset(url, batch_size=8), num_workers=workers, collate_fn=len)
        torch.manual_seed(1)
        expected = torch.rand(3)
        torch.manual_seed(1)
        assert sum(loader) == 96
        assert torch.equal(torch.rand(3), expected), f"num_workers={workers}"
