"""The planner's DataLoader model against the real ``torch.utils.data.DataLoader``.

The planner promises that batch ``b`` of a rank comes from worker ``b % W`` and that a resumed plan
hands a fresh DataLoader the streams in the rotated order that continues the uninterrupted run.
This checks both with real worker processes (uneven worker sizes, a partial last batch, a resume
point that is not a multiple of the worker count).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from streamio.data.plan import EpochPlan, Sampling, Shuffle, Topology, plan_epoch

pytestmark = pytest.mark.slow


class _PlanDataset(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, plan: EpochPlan, rank: int) -> None:
        self.plan, self.rank = plan, rank

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        for shard, sample in self.plan.stream(self.rank, 0 if info is None else info.id):
            yield shard * 1000 + sample


def _load(plan: EpochPlan, rank: int, *, drop_last: bool = False) -> list[int]:
    loader = DataLoader(
        _PlanDataset(plan, rank), batch_size=plan.batch_size, num_workers=plan.num_workers, drop_last=drop_last
    )
    return [int(x) for batch in loader for x in batch]


def _expected(plan: EpochPlan, rank: int) -> list[int]:
    return [s * 1000 + i for s, i in plan.rank_order(rank)]


# 3 workers on a 2-core CI box is deliberate (uneven exhaustion); torch warns about it.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 3])
def test_real_dataloader_order_and_exact_resume(workers: int) -> None:
    counts = [17, 0, 5, 1, 23, 9, 4]
    kw = {"seed": 11, "epoch": 3, "topology": Topology(2, workers, 4), "sampling": Sampling(Shuffle(window=6))}
    plan = plan_epoch(counts, **kw)  # type: ignore[arg-type]
    full = _load(plan, 1)
    assert full == _expected(plan, 1) and len(full) == plan.samples_per_rank == 30
    assert len(torch.tensor(full).unique()) == len(full)

    stop = 4  # not a multiple of 3 workers: the resumed loader must start at worker 4 % 3
    resumed = plan_epoch(counts, resume=plan.state_dict(stop), **kw)  # type: ignore[arg-type]
    assert _load(resumed, 1) == full[stop * 4 :]


def test_real_dataloader_drop_last_drops_only_the_ranks_last_partial_batch() -> None:
    plan = plan_epoch([10, 11], seed=0, epoch=0, topology=Topology(1, 2, 4))
    got = _load(plan, 0, drop_last=True)
    assert got == _expected(plan, 0)[: (21 // 4) * 4]
