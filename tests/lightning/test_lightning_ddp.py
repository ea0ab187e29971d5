"""torchrun, 2 gloo ranks, real Lightning over a StreamingDataLoader: checkpoints through
streamio.lightning to S3 (moto), kill -9 of the whole job inside an epoch, ``fit(ckpt_path="last")``:
the same weights, per-step losses and batches as an uninterrupted run (a model with dropout), each
rank's own RNG streams back, and ModelCheckpoint's top-k and ``last.ckpt`` as streamio roots;
SIGTERM to one rank under a PreemptionCheckpoint: the same, from the step every rank saved. One
uninterrupted run serves both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamio.checkpoint.root import committed_saves, read_pointer
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.dataset import all_keys, make_dataset

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "support" / "lightning_ddp.py"


def _run(s3: S3Endpoint, dirpath: str, out: Path, *, kill_at: int = 0, resume: bool = False, steps: int = 14,
         dataset: str | None = None, sigterm_at: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env())
    env["OMP_NUM_THREADS"] = "1"
    if sigterm_at is not None:  # with a PreemptionCheckpoint; rank 1 alone gets SIGTERM after that step (> 0)
        env["SIGTERM_AT"] = str(sigterm_at)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
         dirpath, str(out), str(steps), str(kill_at), "1" if resume else "0", *([dataset] if dataset else [])],
        env=env, capture_output=True, text=True, timeout=300, start_new_session=True,  # its own process group
    )
    assert proc.returncode == 0 or kill_at or sigterm_at, proc.stderr[-3000:]
    return proc


COUNTS = [7, 5, 9, 3]  # 24 samples: 6 batches of 2 per rank and epoch, 18 steps in 3 epochs
STEPS = 18


@dataclass(frozen=True)
class Full:
    """The uninterrupted run, shared by the resume tests: its OUT and the dataset it read."""

    out: Path
    dataset: str


@pytest.fixture(scope="module")
def full(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Full:
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    make_dataset(s3.url("ds"), s3.storage_options(), COUNTS)
    out = tmp_path_factory.mktemp("full") / "full.json"
    _run(s3, s3.url("full"), out, steps=STEPS, dataset=s3.url("ds"))
    return Full(out, s3.url("ds"))


def _same_as_full(full: Full, resumed: Path, first: int) -> None:
    """The resumed run went on after step ``first`` with the full run's losses, weights, batches and
    every rank's draws."""
    whole, rest = json.loads(full.out.read_text()), json.loads(resumed.read_text())
    assert rest["global_step"] == whole["global_step"] == STEPS
    assert sorted(map(int, rest["losses"])) == list(range(first, STEPS))  # it went on after that step, not from 0
    assert {k: whole["losses"][k] for k in rest["losses"]} == rest["losses"]
    assert rest["weights"] == whole["weights"]
    for rank in (0, 1):  # torch, random and numpy draws of each step: each rank's own streams came back
        draws = json.loads(Path(f"{full.out}.rng{rank}").read_text())
        resumed_draws = json.loads(Path(f"{resumed}.rng{rank}").read_text())
        assert sorted(map(int, resumed_draws)) == list(range(first, STEPS)), rank
        assert resumed_draws == {k: draws[k] for k in resumed_draws}, rank
        batches = json.loads(Path(f"{full.out}.rank{rank}").read_text())
        # from the batch after step ``first`` on, the same batches (inside an epoch: the loader's position)
        assert json.loads(Path(f"{resumed}.rank{rank}").read_text()) == batches[first:], rank
    assert draws != json.loads(Path(f"{full.out}.rng0").read_text())  # the ranks' streams differ


def _root_of(parent: Store, step: int) -> Store:
    """The top-k root ModelCheckpoint named after ``step`` (``epoch=E-step=S.ckpt``)."""
    (name,) = {o.path.split("/")[0] for o in parent.list() if o.path.split("/")[0].endswith(f"-step={step}.ckpt")}
    return parent.child(name)


def test_the_uninterrupted_run_reads_every_sample_once_per_epoch(full: Full) -> None:
    for epoch in range(3):
        keys = [k for rank in (0, 1) for e, _, _, ks in json.loads(Path(f"{full.out}.rank{rank}").read_text())
                if e == epoch for k in ks]
        assert sorted(keys) == sorted(all_keys(COUNTS))


def test_kill_9_inside_an_epoch_then_last_resumes_bit_exactly_at_the_next_batch(
        full: Full, s3: S3Endpoint, tmp_path: Path) -> None:
    killed = _run(s3, s3.url("ckpt"), tmp_path / "killed.json", steps=STEPS, kill_at=9, dataset=full.dataset)
    assert killed.returncode != 0 and not (tmp_path / "killed.json").exists()
    parent = Store(s3.url("ckpt"), s3.storage_options())
    last = parent.child("last.ckpt")
    pointer = read_pointer(last)
    assert pointer is not None and pointer.step == 8  # the kill came after step 9 (epoch 1, batch 2); saves every 4

    _run(s3, s3.url("ckpt"), tmp_path / "resumed.json", steps=STEPS, resume=True, dataset=full.dataset)
    _same_as_full(full, tmp_path / "resumed.json", 8)
    # top-2 by step and last.ckpt, each a root holding exactly one committed save
    roots = sorted({o.path.split("/")[0] for o in parent.list()})
    assert len(roots) == 3 and roots[-1] == "last.ckpt", roots
    assert [s.step for s in committed_saves(last)] in ([16], [18])  # Lightning 2.5 saves last at fit's end too
    assert [s.step for s in committed_saves(_root_of(parent, 12))] == [12]
    assert [s.step for s in committed_saves(_root_of(parent, 16))] == [16]


def test_sigterm_to_one_rank_saves_one_step_on_every_rank_then_last_resumes_bit_exactly(
        full: Full, s3: S3Endpoint, tmp_path: Path) -> None:
    """PreemptionCheckpoint: SIGTERM to rank 1's process only, after step 10. The ranks agree one
    step later (the vote overlaps a step), both save step 11 as last.ckpt, and exit 143 (torchrun: 1)."""
    preempted = _run(s3, s3.url("ckpt"), tmp_path / "preempted.json", steps=STEPS, sigterm_at=10,
                     dataset=full.dataset)
    assert preempted.returncode == 1, preempted.stderr[-3000:]  # torchrun turns the ranks' 143 into 1
    assert re.search(r"exitcode\s*:\s*143", preempted.stderr), preempted.stderr[-3000:]
    assert "SIGTERMException" not in preempted.stderr  # Lightning's own SIGTERM path never ran
    assert preempted.stderr.count("preemption requested (signal SIGTERM): saving step 11") == 1
    assert preempted.stderr.count("preemption requested (another rank's signal): saving step 11") == 1
    assert not (tmp_path / "preempted.json").exists()  # fit did not go on after the save
    parent = Store(s3.url("ckpt"), s3.storage_options())
    last = parent.child("last.ckpt")
    pointer = read_pointer(last)
    assert pointer is not None and pointer.step == 11 and [s.step for s in committed_saves(last)] == [11]
    assert [s.step for s in committed_saves(_root_of(parent, 8))] == [8]  # the periodic saves stand

    _run(s3, s3.url("ckpt"), tmp_path / "resumed.json", steps=STEPS, resume=True, sigterm_at=0,  # no signal
         dataset=full.dataset)
    _same_as_full(full, tmp_path / "resumed.json", 11)
