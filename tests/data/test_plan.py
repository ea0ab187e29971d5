"""Invariants 1-8 of the planner (issue 4) as hypothesis properties, plus the state contract.

Streams are compared against an independent model of torch's DataLoader (``plan_helpers``) and
against the global sequence built from the public shard order, so a wrong worker split, rotation,
tail policy or resume position shows up as a concrete differing sample.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from streamio.data.plan import STATE_VERSION, EpochPlan, Sampling, Shuffle, Topology, Window, WorkerStream, plan_epoch
from streamio.data.plan.stream import CHUNK
from streamio.errors import PlanError, StateMismatchError
from support.plan import all_streams, dataloader_batches, dataloader_order, global_sequence, multiset

# Shards with 0 and 1 samples are common on purpose; totals stay small so 64 ranks x 8 workers is fast.
counts_st = st.lists(st.one_of(st.integers(0, 1), st.integers(0, 25)), min_size=1, max_size=16)
topology_st = st.tuples(st.integers(1, 64), st.integers(0, 8), st.integers(1, 4))  # world, workers, batch
shuffle_st = st.builds(
    Shuffle,
    shards=st.booleans(),
    window=st.sampled_from([0, 1, 2, 3, 5, 8]),
    interleave=st.sampled_from([1, 1, 2, 3, 32]),
)
seed_st = st.integers(0, 2**63)
epoch_st = st.integers(0, 10_000)
policy_st = st.sampled_from(["pad", "drop"])


def _plannable(counts: list[int], world: int, policy: str) -> bool:
    total = sum(counts)
    return total > 0 and (policy == "pad" or total >= world)


def _plan(
    counts: list[int], topo: tuple[int, int, int], *, policy: str = "pad", shuffle: Shuffle | None = None, **kw: object
) -> EpochPlan:
    sampling = Sampling(Shuffle() if shuffle is None else shuffle, policy)  # type: ignore[arg-type]
    return plan_epoch(counts, topology=Topology(*topo), sampling=sampling, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- 1, 2, 8


@given(counts_st, topology_st, shuffle_st, seed_st, epoch_st, policy_st)
def test_exactly_once_and_equal_work(counts, topo, shuffle, seed, epoch, policy) -> None:
    assume(_plannable(counts, topo[0], policy))
    plan = _plan(counts, topo, seed=seed, epoch=epoch, policy=policy, shuffle=shuffle)
    world, n = topo[0], sum(counts)
    streams = all_streams(plan)

    # 2. equal work: samples and batches, identical on every rank, and what the plan announces
    assert {len(s) for s in streams} == {plan.samples_per_rank}
    assert {dataloader_batches(plan, r) for r in range(world)} == {plan.batches_per_rank}
    assert plan.batches_per_rank == -(-plan.samples_per_rank // plan.batch_size)
    # only the rank's last batch may be partial: every worker but one yields whole batches
    partial = [s for s in plan.streams(0) if s.size % plan.batch_size]
    assert len(partial) <= 1
    # rank_order (the public DataLoader order) agrees with the independent DataLoader model
    assert list(plan.rank_order(0)) == streams[0]

    # 1. exactly once, +- exactly the stated tail: pad repeats the start of G, drop cuts its end
    g = global_sequence(plan, counts)
    if policy == "pad":
        assert plan.dropped == 0 and 0 <= plan.padding < world
        expected = Counter(g) + Counter(g[i % n] for i in range(plan.padding))
    else:
        assert plan.padding == 0 and 0 <= plan.dropped < world
        expected = Counter(g[: n - plan.dropped])
    assert multiset(streams) == expected
    assert world * plan.samples_per_rank == n + plan.padding - plan.dropped
    assert plan.check() == []  # the run-level check (what `streamio plan` runs) agrees


def test_check_detects_lost_and_unequal_work(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_epoch([10, 3, 7], seed=2, epoch=0, topology=Topology(2, 2), sampling=Sampling(policy="pad"))
    assert plan.check() == []
    real = WorkerStream.runs.fget  # type: ignore[attr-defined]

    def lose_one(self: WorkerStream) -> tuple:
        runs = real(self)
        if self.rank == 1 and self.worker == 0:
            last = runs[-1]
            return (*runs[:-1], last._replace(end=last.end - 1))
        return runs

    monkeypatch.setattr(WorkerStream, "runs", property(lose_one))
    assert plan.check() == [
        "exactly once: 1 samples never yielded and 0 yielded again; the 'pad' policy states 0 dropped and 0 padded"
    ]
    monkeypatch.undo()
    streams = EpochPlan.streams
    monkeypatch.setattr(EpochPlan, "streams", lambda self, rank: streams(self, rank)[: 1 if rank == 1 else None])
    problems = plan.check()
    assert problems[0] == "equal work: rank 1 yields 5 samples in 5 batches, not 10 in 10"
    assert problems[1].startswith("exactly once: 5 samples never yielded")


def test_world_larger_than_shards_and_samples_with_pad() -> None:
    # 8. one sample, 64 ranks: every rank gets it once; 63 repeats are stated
    plan = plan_epoch([0, 1, 0], seed=0, epoch=0, topology=Topology(64, 8), sampling=Sampling(policy="pad"))
    assert plan.samples_per_rank == 1 and plan.padding == 63
    assert all(dataloader_order(plan, r) == [(1, 0)] for r in range(64))
    # more ranks than shards with drop: whole samples, not whole shards, are assigned
    plan = plan_epoch([10, 0, 7], seed=3, epoch=1, topology=Topology(16, 3), sampling=Sampling(policy="drop"))
    assert plan.samples_per_rank == 1 and plan.dropped == 1


def test_impossible_topologies_raise_plan_error_naming_the_fix() -> None:
    with pytest.raises(PlanError, match=r"world_size=8 exceeds the 5 samples.*policy='pad'"):
        plan_epoch([5], seed=0, epoch=0, topology=Topology(8), sampling=Sampling(policy="drop"))
    with pytest.raises(PlanError, match="no samples"):
        plan_epoch([0, 0], seed=0, epoch=0, topology=Topology(1))
    with pytest.raises(PlanError, match="rank 4 is outside world_size=4"):
        plan_epoch([5], seed=0, epoch=0, topology=Topology(4)).stream(4)
    with pytest.raises(PlanError, match="worker 2 is outside num_workers=2"):
        plan_epoch([5], seed=0, epoch=0, topology=Topology(1, num_workers=2)).stream(0, 2)
    for bad in ({"seed": -1}, {"epoch": -2}, {"seed": True}, {"epoch": 1.5}):
        kw = {"seed": 0, "epoch": 0, **bad}
        with pytest.raises(PlanError, match=rf"{next(iter(bad))}=.* must be an int >= 0"):
            plan_epoch([5], topology=Topology(1), **kw)  # type: ignore[arg-type]
    # the config values refuse bad settings where they are written, naming the field
    for bad_topo, name in (
        ({"world_size": 0}, "world_size=0"),
        ({"world_size": 1, "batch_size": 0}, "batch_size=0"),
        ({"world_size": 1, "num_workers": -1}, "num_workers=-1"),
        ({"world_size": "2"}, "world_size='2'"),
    ):
        with pytest.raises(PlanError, match=name):
            Topology(**bad_topo)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="policy='wrap' is not one of"):
        Sampling(policy="wrap")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="must be a streamio.data.plan.Shuffle"):
        Sampling(shuffle=True)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="must be a streamio.data.plan.Topology"):
        plan_epoch([5], seed=0, epoch=0, topology=(1, 0, 1))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="must be a streamio.data.plan.Sampling"):
        plan_epoch([5], seed=0, epoch=0, topology=Topology(1), sampling=Shuffle())  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="1-D sequence of ints"):
        plan_epoch([3, -1], seed=0, epoch=0, topology=Topology(1))
    with pytest.raises(PlanError, match="window"):
        Shuffle(window=-1)


# --------------------------------------------------------------------------- 3


@given(counts_st, topology_st, shuffle_st, seed_st, epoch_st, policy_st)
def test_deterministic(counts, topo, shuffle, seed, epoch, policy) -> None:
    assume(_plannable(counts, topo[0], policy))
    a = _plan(counts, topo, seed=seed, epoch=epoch, policy=policy, shuffle=shuffle)
    b = _plan(list(counts), topo, seed=seed, epoch=epoch, policy=policy, shuffle=shuffle)
    for r in {0, topo[0] - 1}:
        assert [list(s) for s in a.streams(r)] == [list(s) for s in b.streams(r)]
        assert [s.runs for s in a.streams(r)] == [s.runs for s in b.streams(r)]


_PROBE = """
import json, sys
from streamio.data.plan import Sampling, Shuffle, Topology, plan_epoch
p = plan_epoch([7, 0, 1, 13, 4, 9], seed=12345, epoch=6, topology=Topology(3, 2, 2),
               sampling=Sampling(Shuffle(window=4)))
print(json.dumps([p.shard_order, [[list(s) for s in p.streams(r)] for r in range(3)]]))
"""

# Pinned: the shard order must not change across numpy versions or machines (it would silently
# break every saved resume state). Regenerate only with a state format version bump.
_GOLDEN_ORDER = [3, 2, 1, 0, 5, 4]


def test_deterministic_across_processes_and_pinned() -> None:
    # another process with another hash seed than this one (pytest's is random or unset)
    env = {"PYTHONHASHSEED": "4242", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env)
    outs = [json.loads(res.stdout)]
    here = plan_epoch([7, 0, 1, 13, 4, 9], seed=12345, epoch=6, topology=Topology(3, 2, 2),
                      sampling=Sampling(Shuffle(window=4)))
    assert outs[0][0] == list(here.shard_order) == _GOLDEN_ORDER
    assert outs[0][1] == [[[list(x) for x in s] for s in here.streams(r)] for r in range(3)]


def test_seed_is_structured_not_summed() -> None:
    counts = [1] * 40
    a = plan_epoch(counts, seed=1, epoch=0, topology=Topology(1)).shard_order
    b = plan_epoch(counts, seed=0, epoch=1, topology=Topology(1)).shard_order
    assert a != b


# --------------------------------------------------------------------------- 4


@given(counts_st, topology_st, shuffle_st, seed_st, policy_st, st.data())
def test_resume_same_topology_is_the_uninterrupted_remainder(counts, topo, shuffle, seed, policy, data) -> None:
    assume(_plannable(counts, topo[0], policy))
    kw = {"seed": seed, "epoch": 2, "policy": policy, "shuffle": shuffle}
    plan = _plan(counts, topo, **kw)
    full = [dataloader_order(plan, r) for r in range(topo[0])]
    c1 = data.draw(st.integers(0, plan.batches_per_rank), label="first stop (batches)")
    state = json.loads(json.dumps(plan.state_dict(c1)))  # JSON-safe
    resumed = _plan(counts, topo, resume=state, **kw)
    done = min(c1 * plan.batch_size, plan.samples_per_rank)
    assert resumed.stage == 0 and resumed.samples_per_rank == plan.samples_per_rank - done
    for r in range(topo[0]):
        assert dataloader_order(resumed, r) == full[r][done:]
    # the batch -> per-worker position map: sums to what was consumed; a fresh loader's worker w
    # continues plan worker (c1 + w) % W exactly there
    pos = plan.positions(c1)
    w = len(pos)
    assert sum(pos) == done
    assert [s.skipped for s in resumed.streams(0)] == [pos[(c1 + k) % w] for k in range(w)]
    # and again from the resumed plan (positions accumulate)
    c2 = data.draw(st.integers(0, resumed.batches_per_rank), label="second stop (batches)")
    again = _plan(counts, topo, resume=resumed.state_dict(c2), **kw)
    done2 = min((c1 + c2) * plan.batch_size, plan.samples_per_rank)
    assert dataloader_order(again, topo[0] - 1) == full[-1][done2:]


def test_num_workers_zero_and_one_are_the_same_stream() -> None:
    kw = {"seed": 9, "epoch": 1, "sampling": Sampling(Shuffle(window=4))}
    zero = plan_epoch([9, 4, 0, 11], topology=Topology(2, 0, 3), **kw)  # type: ignore[arg-type]
    one = plan_epoch([9, 4, 0, 11], topology=Topology(2, 1, 3), **kw)  # type: ignore[arg-type]
    assert list(zero.rank_order(1)) == list(one.rank_order(1))
    resumed = plan_epoch([9, 4, 0, 11], topology=Topology(2, 1, 3), resume=zero.state_dict(2), **kw)  # type: ignore[arg-type]
    assert resumed.stage == 0 and list(resumed.rank_order(1)) == list(zero.rank_order(1))[6:]


# --------------------------------------------------------------------------- 5


@given(counts_st, st.lists(topology_st, min_size=2, max_size=4), shuffle_st, seed_st, policy_st, st.data())
def test_resume_new_topology_exactly_once_over_three_changes(counts, topos, shuffle, seed, policy, data) -> None:
    assume(_plannable(counts, topos[0][0], policy))
    kw = {"seed": seed, "epoch": 5, "policy": policy, "shuffle": shuffle}
    plan = _plan(counts, topos[0], **kw)
    # `left`: multiset of what the current stage still owes (the full stage for a new stage)
    left = multiset(all_streams(plan))
    consumed: Counter = Counter()
    state: dict = {}  # the state saved at the end of the previous stage
    for i, topo in enumerate(topos):
        if i:
            before = plan.stage
            plan = _plan(counts, topo, resume=state, **kw)
            streams = all_streams(plan)
            got = multiset(streams)
            assert {len(s) for s in streams} == {plan.samples_per_rank}  # equal work again
            if plan.stage == before:  # same topology, equal consumption: the stage continues
                assert got == left
            else:  # a new stage: what was owed, +- exactly its own stated tail
                assert plan.stage == before + 1
                if policy == "pad":
                    assert plan.dropped == 0 and plan.padding < topo[0]
                    extra = got - left
                    assert not (left - got) and sum(extra.values()) == plan.padding and set(extra) <= set(left)
                else:
                    assert plan.padding == 0 and plan.dropped < topo[0]
                    assert not (got - left) and sum((left - got).values()) == plan.dropped
            left = got
        last = i == len(topos) - 1
        stop = plan.batches_per_rank if last else data.draw(st.integers(0, plan.batches_per_rank), label=f"stop {i}")
        taken = multiset([dataloader_order(plan, r)[: stop * plan.batch_size] for r in range(plan.world_size)])
        consumed += taken
        left = left - taken
        state = json.loads(json.dumps(plan.state_dict(stop)))
    for r in {0, plan.world_size - 1}:  # fragments left by resumes inside windows read in few spans
        for s in plan.streams(r):
            for win in s.windows():
                _check_spans(win)
    # the whole epoch: every sample at least once (pad) / at most once (drop)
    g = Counter(global_sequence(plan, counts))
    if policy == "pad":
        assert not (g - consumed)
    else:
        assert not (consumed - g)
    assert not left


@given(counts_st, topology_st, topology_st, shuffle_st, seed_st, policy_st, st.data())
def test_resume_after_a_topology_change_continues_the_new_stage_exactly(
    counts, topo_a, topo_b, shuffle, seed, policy, data
) -> None:
    # invariant 4 holds again inside a stage created by invariant 5's re-plan
    norm = lambda t: (t[0], max(t[1], 1), t[2])  # noqa: E731  (0 and 1 workers are one stream)
    assume(_plannable(counts, topo_a[0], policy) and norm(topo_a) != norm(topo_b))
    kw = {"seed": seed, "epoch": 1, "policy": policy, "shuffle": shuffle}
    first = _plan(counts, topo_a, **kw)
    c1 = data.draw(st.integers(0, first.batches_per_rank), label="stop in stage 0")
    stage1 = _plan(counts, topo_b, resume=first.state_dict(c1), **kw)
    full = [dataloader_order(stage1, r) for r in range(topo_b[0])]
    c2 = data.draw(st.integers(0, stage1.batches_per_rank), label="stop in stage 1")
    state = json.loads(json.dumps(stage1.state_dict(c2)))
    assert len(state["stages"]) == 2
    again = _plan(counts, topo_b, resume=state, **kw)
    assert again.stage == 1
    done = min(c2 * stage1.batch_size, stage1.samples_per_rank)
    for r in {0, topo_b[0] - 1}:
        assert dataloader_order(again, r) == full[r][done:]


def test_unequal_consumption_replans_to_equal_work() -> None:
    kw = {"seed": 4, "epoch": 0, "topology": Topology(3, 2), "sampling": Sampling(policy="drop")}
    plan = plan_epoch([10, 10, 10], **kw)  # type: ignore[arg-type]
    state = plan.state_dict([1, 4, 2])
    resumed = plan_epoch([10, 10, 10], resume=state, **kw)  # type: ignore[arg-type]
    assert resumed.stage == 1  # continuing stage 0 would leave ranks with 9, 6 and 8 samples
    assert resumed.samples_per_rank == (30 - 7) // 3 and resumed.dropped == 2
    taken = multiset([dataloader_order(plan, r)[:c] for r, c in enumerate([1, 4, 2])])
    rest = multiset(all_streams(resumed))
    assert not (taken & rest) and sum((taken + rest).values()) == 30 - 2


# --------------------------------------------------------------------------- 6


def _check_spans(win: Window) -> None:
    """Spans are fewer reads that cover the window's runs, in order, within 2x read amplification."""
    spans, runs, i = win.spans, win.runs, 0
    for sp in spans:  # each span reads one or more consecutive, ascending runs of its shard
        assert i < len(runs) and runs[i].shard == sp.shard and runs[i].first == sp.first
        i += 1
        while (
            i < len(runs) and runs[i].shard == sp.shard and runs[i - 1].end <= runs[i].first and runs[i].end <= sp.end
        ):
            i += 1
        assert runs[i - 1].end == sp.end
    assert i == len(runs)
    assert sum(sp.end - sp.first for sp in spans) <= 2 * win.size


@given(counts_st, topology_st, shuffle_st, seed_st, epoch_st, policy_st)
def test_locality_runs_are_long(counts, topo, shuffle, seed, epoch, policy) -> None:
    assume(_plannable(counts, topo[0], policy))
    plan = _plan(counts, topo, seed=seed, epoch=epoch, policy=policy, shuffle=shuffle)
    for r in {0, topo[0] // 2, topo[0] - 1}:
        for s in plan.streams(r):
            runs = s.runs
            assert sum(run.end - run.first for run in runs) == s.size
            assert all(0 <= run.first < run.end <= counts[run.shard] for run in runs)
            # one run per shard touched; +1 only where the pad tail wraps to the start of G
            shards = Counter(run.shard for run in runs)
            assert len(runs) <= len(shards) + (1 if policy == "pad" else 0)
            # windows read exactly the stream, each at most `window` samples and one permutation
            wins = list(s.windows())
            assert sum(w.size for w in wins) == s.size
            for w in wins:
                if shuffle.interleave == 1:
                    assert w.spans == w.runs  # a fresh plan has no fragments to coalesce
                if w.order is not None:
                    assert w.size <= max(shuffle.window, CHUNK if shuffle.interleave > 1 else 0)
                    assert sorted(w.order.tolist()) == list(range(w.size))


def test_spans_coalesce_fragments_of_a_resume_inside_windows() -> None:
    kw = {"seed": 5, "epoch": 0, "sampling": Sampling(Shuffle(window=64, interleave=1))}
    plan = plan_epoch([500] * 8, topology=Topology(4, 2), **kw)  # type: ignore[arg-type]
    state = plan.state_dict(100)  # 50 per worker: inside the first 64-sample window
    resumed = plan_epoch([500] * 8, topology=Topology(3, 1), resume=state, **kw)  # type: ignore[arg-type]
    wins = [w for s in resumed.streams(0) for w in s.windows()]
    assert sum(len(w.runs) for w in wins) > 2 * sum(len(w.spans) for w in wins)  # fragments exist...
    for w in wins:
        _check_spans(w)  # ...and are read in few spans


def test_cost_does_not_grow_with_samples() -> None:
    # 5,000 shards of 10^9 samples (5 * 10^12): anything allocated per sample would exhaust memory
    big = {"seed": 1, "epoch": 0, "topology": Topology(512, 8, 256), "sampling": Sampling(Shuffle(window=4096))}
    plan = plan_epoch([10**9] * 5000, **big)  # type: ignore[arg-type]
    runs = [s.runs for s in plan.streams(511)]
    assert sum(run.end - run.first for r in runs for run in r) == plan.samples_per_rank == -(-5 * 10**12 // 512)
    first = next(plan.stream(511, 7).windows())
    assert first.size == 4096 and first.order is not None
    state = plan.state_dict(10**6)
    resumed = plan_epoch([10**9] * 5000, resume=state, **big)  # type: ignore[arg-type]
    assert resumed.stream(3, 1).skipped == plan.positions(10**6)[(10**6 + 1) % 8]


def test_locality_at_scale_is_one_read_per_shard() -> None:
    counts = [1000] * 500
    plan = plan_epoch(counts, seed=1, epoch=3, topology=Topology(64, 8, 32))
    for s in plan.streams(17):
        assert len(s.runs) <= -(-s.size // 1000) + 1  # about its share of shards


# --------------------------------------------------------------------------- 7


@given(st.integers(16, 60), st.integers(2, 8), seed_st, epoch_st)
def test_epochs_differ(shards, world, seed, epoch) -> None:
    counts = [5] * shards
    plans = [plan_epoch(counts, seed=seed, epoch=e, topology=Topology(world)) for e in (epoch, epoch + 1, epoch + 2)]
    assert plans[0].shard_order != plans[1].shard_order
    rank0 = [frozenset(run.shard for run in p.stream(0).runs) for p in plans]
    assert len(set(rank0)) > 1  # not a fixed shard-to-rank mapping


# --------------------------------------------------------------------------- state contract


def _state_plan(**over: object) -> tuple[dict, dict]:
    kw = {"seed": 7, "epoch": 1, "topology": Topology(2, 2), "sampling": Sampling(Shuffle(window=4), "pad")}
    kw.update(over)
    return plan_epoch([5, 6, 7], index_fingerprint="idx-1", **kw).state_dict(1), kw  # type: ignore[arg-type]


def test_state_is_small_versioned_json() -> None:
    plan = plan_epoch([10] * 5000, seed=3, epoch=2, topology=Topology(512, 8, 4))
    state = plan.state_dict(7)
    assert state["version"] == STATE_VERSION and state["epoch"] == 2
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 400
    assert state["fingerprint"]["seed"] == 3 and state["stages"][-1]["batches"] == 7


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"seed": 8}, "seed"),
        ({"sampling": Sampling(Shuffle(window=4), "drop")}, "policy"),
        ({"sampling": Sampling(Shuffle(window=5), "pad")}, "shuffle"),
        ({"epoch": 2}, "epoch"),
        ({"counts": [5, 6, 8]}, "samples"),
        ({"index_fingerprint": "idx-2"}, "index"),
    ],
)
def test_mismatched_state_raises_naming_what_differs(change: dict, names: str) -> None:
    state, kw = _state_plan()
    counts = change.pop("counts", [5, 6, 7])
    kw["index_fingerprint"] = change.pop("index_fingerprint", "idx-1")
    kw.update(change)
    with pytest.raises(StateMismatchError, match=rf"{names}: state has") as info:
        plan_epoch(counts, resume=state, **kw)  # type: ignore[arg-type]
    assert str(info.value).count("state has") == 1  # only the differing field is named


def test_bad_states_raise_plan_error() -> None:
    state, kw = _state_plan()
    kw["index_fingerprint"] = "idx-1"
    for broken in (
        {**state, "version": 99},
        {**state, "stages": "x"},
        {**state, "stages": [{"world_size": 2}]},
        {**state, "stages": [{**state["stages"][0], "batches": [1, 2, 3]}]},
        {**state, "stages": [{**state["stages"][0], "batches": 10_000}]},
    ):
        with pytest.raises(PlanError):
            plan_epoch([5, 6, 7], resume=broken, **kw)  # type: ignore[arg-type]
    plan = plan_epoch([5, 6, 7], **kw)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="cannot have consumed"):
        plan.state_dict(plan.batches_per_rank + 1)
    with pytest.raises(PlanError, match="one per rank"):
        plan.state_dict([1, 2, 3])


def test_finished_epoch_resumes_to_nothing_on_any_topology() -> None:
    kw = {"seed": 1, "epoch": 0, "sampling": Sampling(policy="pad")}
    plan = plan_epoch([3, 4], topology=Topology(2, 2), **kw)  # type: ignore[arg-type]
    state = plan.state_dict(plan.batches_per_rank)
    for world, workers in ((2, 2), (5, 3)):
        rest = plan_epoch([3, 4], topology=Topology(world, workers), resume=state, **kw)  # type: ignore[arg-type]
        assert rest.samples_per_rank == 0 and all(list(s) == [] for s in rest.streams(0))
