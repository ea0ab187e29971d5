"""Mixtures of several sources (issue 15): contributions, the invariants per epoch, resume, the state.

Every epoch is checked against an independent model built from the issue's definition
(``support.plan.mixture_sequence``): each source's epoch slice of its endless stream of cycles, the
slices merged proportionally in exact fractions, then cut into rank and worker blocks by the
package docstring's rules. The order inside a worker's shuffle window is not modelled (it is the
planner's to choose); which samples each window holds is.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from streamio.data.plan import (
    STATE_VERSION,
    EpochPlan,
    PlanSource,
    Sampling,
    Shuffle,
    Topology,
    contributions,
    plan_epoch,
)
from streamio.errors import PlanError, StateMismatchError
from support.plan import (
    Sample,
    all_streams,
    dataloader_batches,
    dataloader_order,
    largest_remainder,
    mixed,
    mixture_sequence,
    multiset,
    with_tail,
)

# Small on purpose (the epoch is materialised several times per example); empty shards are common.
counts_st = st.lists(st.integers(0, 4), min_size=1, max_size=3).map(lambda c: c if any(c) else [*c[:-1], 1])
weight_st = st.sampled_from([0.3, 0.7, 0.25, 1, 2, 3.5, 7])
topology_st = st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(1, 3))  # world, workers, batch
shuffle_st = st.builds(
    Shuffle, shards=st.booleans(), window=st.sampled_from([0, 1, 3, 8]), interleave=st.sampled_from([1, 2, 3, 32])
)
seed_st = st.integers(0, 2**63)
epoch_st = st.one_of(st.integers(0, 4), st.integers(0, 10_000))
policy_st = st.sampled_from(["pad", "drop"])


@st.composite
def mixture_st(draw: st.DrawFn, max_sources: int = 3) -> tuple[list[PlanSource], int | None]:
    """1-3 sources, each read whole, weighted or with samples=; sometimes an epoch_samples."""
    sources = []
    for i in range(draw(st.integers(1, max_sources), label="sources")):
        counts = draw(counts_st, label=f"counts {i}")
        kind = draw(st.sampled_from(["size", "weight", "samples"]), label=f"kind {i}")
        sources.append(
            PlanSource(
                np.array(counts),
                weight=draw(weight_st) if kind == "weight" else None,
                samples=draw(st.integers(1, 10)) if kind == "samples" else None,
                fingerprint=f"idx-{i}",
                name=f"mem://src{i}",
            )
        )
    epoch_samples = None
    if any(s.weight is not None for s in sources) and draw(st.booleans(), label="epoch_samples?"):
        fixed = sum(s.size if s.samples is None else s.samples for s in sources if s.weight is None)
        epoch_samples = max(1, fixed + draw(st.integers(0, 10), label="weighted part"))
    return sources, epoch_samples


def _plan(
    sources: list[PlanSource], topo: tuple[int, int, int], shuffle: Shuffle, policy: str, **kw: object
) -> EpochPlan:
    return plan_epoch(sources, topology=Topology(*topo), sampling=Sampling(shuffle, policy), **kw)  # type: ignore[arg-type]


def _model_g(sources: list[PlanSource], shares: list[int], seed: int, epoch: int, shuffle: Shuffle) -> list[Sample]:
    counts = [s.counts.tolist() for s in sources]
    return mixture_sequence(counts, shares, seed=seed, epoch=epoch, shuffle_shards=shuffle.shards)


def _plannable(total: int, world: int, policy: str) -> bool:
    return policy == "pad" or total >= world


def _worker_blocks(g: list[Sample], topo: tuple[int, int, int], policy: str) -> list[list[list[Sample]]]:
    """Each (rank, worker)'s block of G, from the package docstring's steps 3-5 (no shuffle)."""
    world, workers, b = topo[0], max(1, topo[1]), topo[2]
    n = len(g)
    per = -(-n // world) if policy == "pad" else n // world
    padded = [g[i % n] for i in range(world * per)]  # pad wraps to the start of G; drop cuts its end
    nb = -(-per // b)
    sizes = [-(-(nb - w) // workers) * b for w in range(workers)]
    if per % b and nb:
        sizes[(nb - 1) % workers] -= b - per % b  # the rank's one partial batch
    out = []
    for r in range(world):
        at, blocks = r * per, []
        for size in sizes:
            blocks.append(padded[at : at + size])
            at += size
        out.append(blocks)
    return out


def _lane_order(block: list[Sample], width: int) -> list[Sample]:
    """A worker block read over ``min(width, n)`` near-equal contiguous lanes, merged proportionally."""
    n = len(block)
    if width <= 1 or n <= 1:
        return list(block)
    lanes = min(width, n)
    return mixed([block[j * n // lanes : (j + 1) * n // lanes] for j in range(lanes)])


# --------------------------------------------------------------------------- contributions()


def _src(size: int, name: str = "s", **kw: object) -> PlanSource:
    return PlanSource(np.array([size]), name=name, **kw)  # type: ignore[arg-type]


@given(mixture_st(max_sources=6), st.data())
def test_contributions_are_exact(mix, data) -> None:
    sources, epoch_samples = mix
    shares = contributions(sources, epoch_samples)
    weighted = [i for i, s in enumerate(sources) if s.weight is not None]
    fixed = {i: s.size if s.samples is None else s.samples for i, s in enumerate(sources) if s.weight is None}
    for i, c in fixed.items():  # samples= as stated; neither: the source's own size
        assert shares[i] == c
    pool = (sum(sources[i].size for i in weighted) if epoch_samples is None else epoch_samples - sum(fixed.values()))
    assert sum(shares) == sum(fixed.values()) + pool  # the epoch, exactly
    if epoch_samples is not None:
        assert sum(shares) == epoch_samples
    if weighted:  # proportional to the weights, rounded by largest remainder, in exact fractions
        got = [shares[i] for i in weighted]
        assert got == largest_remainder([sources[i].weight for i in weighted], pool)  # type: ignore[misc]
        total_w = sum(Fraction(sources[k].weight) for k in weighted)  # type: ignore[arg-type]
        for i, c in zip(weighted, got, strict=True):
            assert abs(c - pool * Fraction(sources[i].weight) / total_w) < 1  # type: ignore[arg-type]
    # scaling every weight changes nothing (powers of two: exact in binary floating point)
    k = data.draw(st.sampled_from([2, 4, 0.5]), label="weight scale")
    scaled = [PlanSource(s.counts, s.weight * k if s.weight else None, s.samples) for s in sources]
    assert contributions(scaled, epoch_samples) == shares


def test_contributions_examples() -> None:
    # 70/30 of 1000 + 500 samples: the weighted sources fill their own sizes' total
    assert contributions([_src(1000, weight=0.7), _src(500, weight=0.3)]) == [1050, 450]
    assert contributions([_src(1000, weight=0.7), _src(500, weight=0.3)], epoch_samples=100) == [70, 30]
    # a fixed source (its size) and a samples= source are taken as stated; the weighted share the rest
    mix = [_src(10), _src(50, samples=7), _src(3, weight=1), _src(4, weight=2)]
    assert contributions(mix) == [10, 7, 2, 5]
    assert contributions(mix, epoch_samples=17 + 10) == [10, 7, 3, 7]
    assert contributions(mix, epoch_samples=17) == [10, 7, 0, 0]  # nothing left to share
    # largest remainder: thirds of 10 round 4, 3, 3 (the tie goes to the first source)
    assert contributions([_src(1, weight=1), _src(1, weight=1), _src(1, weight=1)], epoch_samples=10) == [4, 3, 3]
    assert contributions([_src(5)], epoch_samples=5) == [5]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"weight": 1, "samples": 3}, r"mem://a: give weight= or samples=, not both"),
        ({"weight": 0}, r"mem://a: weight=0 must be a finite number > 0"),
        ({"weight": -0.5}, r"mem://a: weight=-0.5 must be a finite number > 0"),
        ({"weight": float("nan")}, r"mem://a: weight=nan must be a finite number > 0"),
        ({"weight": float("inf")}, r"mem://a: weight=inf must be a finite number > 0"),
        ({"weight": True}, r"mem://a: weight=True must be a finite number > 0"),
        ({"weight": "0.7"}, r"mem://a: weight='0.7' must be a finite number > 0"),
        ({"samples": 0}, r"mem://a: samples=0 must be an int >= 1"),
        ({"samples": -3}, r"mem://a: samples=-3 must be an int >= 1"),
        ({"samples": True}, r"mem://a: samples=True must be an int >= 1"),
        ({"samples": 2.0}, r"mem://a: samples=2.0 must be an int >= 1"),
        ({"counts": np.array([0, 0])}, r"mem://a has no samples; a mixture cannot draw from an empty source"),
        ({"counts": np.zeros(0, dtype=np.int64)}, r"mem://a has no samples"),
        ({"counts": np.array([3, -1])}, r"mem://a: sample counts must be a 1-D sequence of ints >= 0"),
        ({"counts": np.array([1.5])}, r"mem://a: sample counts must be a 1-D sequence of ints >= 0"),
        ({"counts": np.ones((2, 2), dtype=np.int64)}, r"mem://a: sample counts must be a 1-D sequence"),
    ],
)
def test_a_bad_source_names_itself(kw: dict, message: str) -> None:
    counts = kw.pop("counts", np.array([4, 2]))
    with pytest.raises(PlanError, match=message):
        PlanSource(counts, name="mem://a", **kw)


def test_bad_mixtures_raise_plan_error_naming_the_fix() -> None:
    with pytest.raises(PlanError, match="a mixture needs at least one source"):
        contributions([])
    fixed = [_src(10, "mem://a"), _src(50, "mem://b", samples=7)]
    with pytest.raises(PlanError, match=r"epoch_samples=16 but the sources without a weight contribute 17: give"):
        contributions([*fixed, _src(3, weight=1)], epoch_samples=16)  # below the fixed part
    with pytest.raises(PlanError, match=r"epoch_samples=18 but the sources without a weight contribute 17"):
        contributions(fixed, epoch_samples=18)  # more than fixed, but no weighted source to fill it
    assert contributions(fixed, epoch_samples=17) == [10, 7]  # exactly the fixed part needs no weight
    for bad in (0, -1, True, 2.5):
        with pytest.raises(PlanError, match=rf"epoch_samples={bad!r} must be an int >= 1"):
            contributions(fixed, epoch_samples=bad)  # type: ignore[arg-type]
    # plan_epoch raises the same errors
    with pytest.raises(PlanError, match="epoch_samples=16"):
        plan_epoch([*fixed, _src(3, weight=1)], seed=0, epoch=0, topology=Topology(1), epoch_samples=16)


# --------------------------------------------------------------------------- the invariants, per epoch


@given(mixture_st(), topology_st, shuffle_st, seed_st, epoch_st, policy_st)
def test_each_source_contributes_exactly_its_count(mix, topo, shuffle, seed, epoch, policy) -> None:
    sources, epoch_samples = mix
    shares = contributions(sources, epoch_samples)
    assume(_plannable(sum(shares), topo[0], policy))
    plan = _plan(sources, topo, shuffle, policy, seed=seed, epoch=epoch, epoch_samples=epoch_samples)
    assert list(plan.contributions) == shares and plan.total_samples == sum(shares)
    world = topo[0]
    streams = all_streams(plan)
    # equal samples and batches on every rank, as announced
    assert {len(s) for s in streams} == {plan.samples_per_rank}
    assert {dataloader_batches(plan, r) for r in range(world)} == {plan.batches_per_rank}
    # the multiset of the epoch is the model's G, +- exactly the stated tail (< world)
    g = _model_g(sources, shares, seed, epoch, shuffle)
    assert len(g) == sum(shares)
    assert (plan.padding if policy == "pad" else plan.dropped) < world
    assert (plan.dropped if policy == "pad" else plan.padding) == 0
    got = multiset(streams)
    assert got == with_tail(g, policy, plan.padding, plan.dropped)
    # so each source contributes exactly its count, before the tail
    offsets = np.cumsum([0] + [s.counts.size for s in sources])
    per_source = Counter(int(np.searchsorted(offsets, shard, side="right")) - 1 for shard, _ in got.elements())
    tail = plan.padding + plan.dropped
    assert all(abs(per_source[i] - c) <= tail for i, c in enumerate(shares))
    if not tail:
        assert [per_source[i] for i in range(len(sources))] == shares
    assert plan.check() == []


@given(mixture_st(), topology_st, shuffle_st, seed_st, epoch_st, policy_st)
def test_workers_read_their_blocks_and_windows_stay_local(mix, topo, shuffle, seed, epoch, policy) -> None:
    # which samples each (rank, worker) reads is fixed by position: blocks of G through the tail
    # policy; lanes reorder a block, the window shuffle permutes `window` consecutive stream samples
    sources, epoch_samples = mix
    shares = contributions(sources, epoch_samples)
    assume(_plannable(sum(shares), topo[0], policy))
    plan = _plan(sources, topo, shuffle, policy, seed=seed, epoch=epoch, epoch_samples=epoch_samples)
    again = _plan(list(sources), topo, shuffle, policy, seed=seed, epoch=epoch, epoch_samples=epoch_samples)
    blocks = _worker_blocks(_model_g(sources, shares, seed, epoch, shuffle), topo, policy)
    for r in {0, topo[0] - 1}:
        for w, stream in enumerate(plan.streams(r)):
            got = list(stream)
            assert got == list(again.stream(r, w)) and stream.runs == again.stream(r, w).runs  # deterministic
            want = _lane_order(blocks[r][w], shuffle.interleave)
            if shuffle.window <= 1:
                assert got == want  # no sample shuffle: the block (or its lanes) in order
            else:
                k = shuffle.window
                assert [Counter(got[i : i + k]) for i in range(0, len(got), k)] == [
                    Counter(want[i : i + k]) for i in range(0, len(want), k)
                ]


@given(mixture_st(), st.integers(0, 3), shuffle_st, seed_st, st.integers(2, 4))
def test_every_sample_once_per_cycle_over_consecutive_epochs(mix, workers, shuffle, seed, epochs) -> None:
    # Over epochs 0 .. E-1 a source has yielded positions [0, E*c) of its stream of cycles: every
    # sample q or q + 1 times (q = E*c // size), exactly (E*c) % size of them q + 1 times. So a source
    # larger than its share sees disjoint parts until all are seen, and a smaller one repeats evenly.
    sources, epoch_samples = mix
    shares = contributions(sources, epoch_samples)
    seen: list[Counter] = [Counter() for _ in sources]
    offsets = np.cumsum([0] + [s.counts.size for s in sources])
    for epoch in range(epochs):
        plan = _plan(sources, (1, workers, 3), shuffle, "pad", seed=seed, epoch=epoch, epoch_samples=epoch_samples)
        for shard, i in plan.rank_order(0):
            seen[int(np.searchsorted(offsets, shard, side="right")) - 1][(shard, i)] += 1
    for i, (src, c, got) in enumerate(zip(sources, shares, seen, strict=True)):
        q, extra = divmod(epochs * c, src.size)
        universe = {(int(offsets[i]) + s, k) for s, n in enumerate(src.counts.tolist()) for k in range(n)}
        assert set(got) <= universe
        times = Counter(got[x] for x in universe)  # how many samples were seen how often
        assert +times == +Counter({q: src.size - extra, q + 1: extra})


@pytest.mark.parametrize(("samples", "seed"), [(2, 1), (4, 0)])
def test_each_sample_floor_or_ceil_times_per_epoch(samples: int, seed: int) -> None:
    sources = [PlanSource(np.array([1, 1, 1]), samples=samples), PlanSource(np.array([2]))]
    plan = plan_epoch(sources, seed=seed, epoch=1, topology=Topology(1), sampling=Sampling(Shuffle(window=0)))
    got = Counter(plan.rank_order(0))
    per = [got[(s, 0)] for s in range(3)]
    assert set(per) <= {samples // 3, -(-samples // 3)}, per


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("shuffle", [Shuffle(window=0, interleave=1), Shuffle(window=0, interleave=3)])
def test_streams_longer_than_a_chunk(shuffle: Shuffle) -> None:
    # a mixture without a sample shuffle is read in windows of CHUNK (4096) stream positions: a
    # worker of 9,000 samples crosses two chunk boundaries, and a resume lands inside the second
    sources = [PlanSource(np.array([1500] * 4), weight=2), PlanSource(np.array([1000] * 3), weight=1)]
    kw = {"seed": 5, "epoch": 1, "sampling": Sampling(shuffle)}
    plan = plan_epoch(sources, topology=Topology(1, 1, 7), **kw)  # type: ignore[arg-type]
    assert plan.contributions == (6000, 3000) and plan.check() == []
    full = list(plan.rank_order(0))
    assert full == _lane_order(_model_g(sources, [6000, 3000], 5, 1, shuffle), shuffle.interleave)
    state = plan.state_dict(700)  # 4,900 samples
    same = plan_epoch(sources, topology=Topology(1, 1, 7), resume=state, **kw)  # type: ignore[arg-type]
    assert list(same.rank_order(0)) == full[4900:]
    other = plan_epoch(sources, topology=Topology(2, 3, 5), resume=state, **kw)  # type: ignore[arg-type]
    assert multiset(all_streams(other)) == Counter(full[4900:])  # 4,100 left: even over 2 ranks, no tail


@given(mixture_st(), topology_st, shuffle_st, seed_st, policy_st, st.data())
def test_resume_same_topology_is_the_uninterrupted_remainder(mix, topo, shuffle, seed, policy, data) -> None:
    sources, epoch_samples = mix
    assume(_plannable(sum(contributions(sources, epoch_samples)), topo[0], policy))
    kw = {"seed": seed, "epoch": 3, "epoch_samples": epoch_samples}
    plan = _plan(sources, topo, shuffle, policy, **kw)
    full = all_streams(plan)
    c1 = data.draw(st.integers(0, plan.batches_per_rank), label="first stop (batches)")
    state = json.loads(json.dumps(plan.state_dict(c1)))
    resumed = _plan(sources, topo, shuffle, policy, resume=state, **kw)
    done = min(c1 * plan.batch_size, plan.samples_per_rank)
    assert resumed.stage == 0 and resumed.samples_per_rank == plan.samples_per_rank - done
    for r in {0, topo[0] - 1}:
        assert dataloader_order(resumed, r) == full[r][done:]
    c2 = data.draw(st.integers(0, resumed.batches_per_rank), label="second stop (batches)")
    again = _plan(sources, topo, shuffle, policy, resume=json.loads(json.dumps(resumed.state_dict(c2))), **kw)
    done2 = min((c1 + c2) * plan.batch_size, plan.samples_per_rank)
    assert dataloader_order(again, topo[0] - 1) == full[-1][done2:]


# 2-3 topology changes per example, each stage read whole: the costliest property here, so it runs at
# most 150 examples (under the ci profile's 300) to stay near 2 s.
@settings(max_examples=min(150, settings.default.max_examples))
@given(mixture_st(), st.lists(topology_st, min_size=3, max_size=4), shuffle_st, seed_st, policy_st, st.data())
def test_resume_on_new_topologies_loses_and_repeats_nothing(mix, topos, shuffle, seed, policy, data) -> None:
    sources, epoch_samples = mix
    shares = contributions(sources, epoch_samples)
    assume(_plannable(sum(shares), topos[0][0], policy))
    kw = {"seed": seed, "epoch": 2, "epoch_samples": epoch_samples}
    plan = _plan(sources, topos[0], shuffle, policy, **kw)
    streams = all_streams(plan)
    left = multiset(streams)  # what the current stage still owes
    consumed: Counter = Counter()
    state: dict = {}
    for i, topo in enumerate(topos):
        if i:
            before = plan.stage
            plan = _plan(sources, topo, shuffle, policy, resume=state, **kw)
            streams = all_streams(plan)
            got = multiset(streams)
            assert {len(s) for s in streams} == {plan.samples_per_rank}  # equal work again
            if plan.stage == before:  # the same topology continues its stage
                assert got == left
            else:  # a new stage owes exactly the rest, +- its own stated tail (so the shares are kept)
                assert plan.stage == before + 1
                if policy == "pad":
                    extra = got - left
                    assert not (left - got) and set(extra) <= set(left)
                    assert sum(extra.values()) == plan.padding < topo[0]
                else:
                    assert not (got - left) and sum((left - got).values()) == plan.dropped < topo[0]
            left = got
        last = i == len(topos) - 1
        stop = plan.batches_per_rank if last else data.draw(st.integers(0, plan.batches_per_rank), label=f"stop {i}")
        taken = multiset([s[: stop * plan.batch_size] for s in streams])
        consumed += taken
        left -= taken
        state = json.loads(json.dumps(plan.state_dict(stop)))
        assert len(state["stages"]) <= i + 1
    # the whole epoch against the model: every sample of G at least once (pad) / at most once (drop)
    g = Counter(_model_g(sources, shares, seed, 2, shuffle))
    assert not (g - consumed) if policy == "pad" else not (consumed - g)
    assert not left


# --------------------------------------------------------------------------- the state


def _mixture(scale: int, n: int) -> list[PlanSource]:
    return [
        PlanSource(np.array([100 * scale] * (3 + i)), weight=[0.7, 0.3, 1.5][i % 3], fingerprint=f"sha256:{i:064x}")
        for i in range(n)
    ]


@pytest.mark.parametrize("n_sources", [1, 2, 8])
def test_state_is_small_json_and_independent_of_sample_counts(n_sources: int) -> None:
    topos = [Topology(4, 2, 8), Topology(3, 1, 8), Topology(5, 2, 8)]
    lengths = {}
    for scale in (1, 10**9):
        sources = _mixture(scale, n_sources)
        kw = {"seed": 1, "epoch": 4, "sampling": Sampling(Shuffle(window=0))}
        plan = plan_epoch(sources, topology=topos[0], **kw)  # type: ignore[arg-type]
        for topo in topos[1:]:  # two topology changes: three stages
            plan = plan_epoch(sources, topology=topo, resume=plan.state_dict(1), **kw)  # type: ignore[arg-type]
        state = plan.state_dict(1)
        text = json.dumps(state)
        assert json.loads(text) == state and state["version"] == STATE_VERSION and len(state["stages"]) == 3
        assert len(state["fingerprint"]["sources"]) == n_sources
        lengths[scale] = len(text)
    # O(sources + stages): a fixed part, each source's digest, index and contribution, each stage
    assert lengths[1] <= 250 + 200 * n_sources + 80 * 3
    # 10^9 times the samples: only the contributions' digits grow
    assert lengths[10**9] - lengths[1] <= 9 * n_sources


_BASE = [
    {"counts": [5, 0, 7], "weight": 0.7, "fingerprint": "idx-a"},
    {"counts": [4, 9], "weight": 0.3, "fingerprint": "idx-b"},
    {"counts": [6], "samples": 5, "fingerprint": "idx-c"},
]


def _sources(specs: list[dict]) -> list[PlanSource]:
    return [PlanSource(np.array(s["counts"]), s.get("weight"), s.get("samples"), s["fingerprint"]) for s in specs]


_ALL = (r"samples: state has", r"index: state has", r"samples per epoch")


def _changed(i: int, **over: object) -> list[dict]:
    return [{**s, **over} if k == i else s for k, s in enumerate(_BASE)]


@pytest.mark.parametrize(
    ("specs", "epoch_samples", "names"),
    [
        (_changed(1, weight=0.5), None, [r"source 0 samples per epoch \(its weight", r"source 1 samples per epoch"]),
        (_changed(2, samples=6), None, [r"source 2 samples per epoch \(its weight, samples= or epoch_samples\)"]),
        (_changed(1, counts=[4, 8]), None, [r"source 1 samples: state has", r"source 1 samples per epoch"]),
        (_changed(2, counts=[6, 1]), None, [r"source 2 samples: state has"]),
        (_changed(0, fingerprint="idx-z"), None, [r"source 0 index: state has 'idx-a', this plan has 'idx-z'"]),
        ([_BASE[1], _BASE[0], _BASE[2]], None, [rf"source {i} {what}" for i in (0, 1) for what in _ALL]),
        (_BASE, 40, [r"source 0 samples per epoch", r"source 1 samples per epoch"]),
        (_BASE[:2], None, [r"sources: the state has 3 sources, this plan has 2"]),
        (_BASE[:1], None, [r"sources: the state is of 3 source\(s\) read as a mixture"]),
    ],
)
def test_a_changed_mixture_is_a_state_mismatch_naming_the_source(specs, epoch_samples, names) -> None:
    kw = {"seed": 3, "epoch": 1, "topology": Topology(2, 2, 2), "sampling": Sampling()}
    state = plan_epoch(_sources(_BASE), **kw).state_dict(2)  # type: ignore[arg-type]
    sources = _sources(specs)
    if len(specs) == 1:  # one data set read whole (no weight) against a mixture's state
        sources = [PlanSource(sources[0].counts, fingerprint=sources[0].fingerprint)]
    with pytest.raises(StateMismatchError) as info:
        plan_epoch(sources, resume=state, epoch_samples=epoch_samples, **kw)  # type: ignore[arg-type]
    for name in names:
        assert len(re.findall(name, str(info.value))) == 1, str(info.value)
    if names[0].startswith("source "):  # nothing but the differences is named
        assert str(info.value).count("state has") == len(names), str(info.value)


def test_a_weight_change_that_keeps_the_contributions_resumes_the_same_plan() -> None:
    # the plan is a function of the contributions, which the state records, not of the weights
    kw = {"seed": 3, "epoch": 1, "topology": Topology(2, 2, 2), "sampling": Sampling()}
    plan = plan_epoch(_sources(_BASE), **kw)  # type: ignore[arg-type]
    doubled = _sources([{**s, "weight": s["weight"] * 2} if "weight" in s else s for s in _BASE])
    resumed = plan_epoch(doubled, resume=plan.state_dict(2), **kw)  # type: ignore[arg-type]
    assert list(resumed.rank_order(1)) == list(plan.rank_order(1))[4:]


# --------------------------------------------------------------------------- shuffle quality


def _batch_spread(shuffle: Shuffle) -> tuple[float, float]:
    """Mean distinct shards and classes per batch of 32: 64 shards x 40 samples, 10 classes sorted by shard."""
    counts = [40] * 64
    plan = plan_epoch(counts, seed=0, epoch=0, topology=Topology(1, 2, 32), sampling=Sampling(shuffle))
    order = list(plan.rank_order(0))
    assert sorted(order) == [(s, i) for s in range(64) for i in range(40)]
    batches = [order[i : i + 32] for i in range(0, len(order), 32)]
    shards = [len({s for s, _ in b}) for b in batches]
    classes = [len({s * 10 // 64 for s, _ in b}) for b in batches]
    return sum(shards) / len(batches), sum(classes) / len(batches)


def test_default_shuffle_draws_a_batch_from_many_shards() -> None:
    default = _batch_spread(Shuffle())
    sequential = _batch_spread(Shuffle(interleave=1))
    print(
        "\n64 shards x 40 samples, 10 classes, 1 rank x 2 workers, batch 32: distinct shards / classes per batch: "
        f"Shuffle() {default[0]:.1f} / {default[1]:.1f}, "
        f"Shuffle(interleave=1) {sequential[0]:.1f} / {sequential[1]:.1f}"
    )
    assert default[0] >= 16  # the goal (iid would be ~27)
    assert sequential[0] < default[0] / 2  # one shard after another: a batch spans the few shards of a window
