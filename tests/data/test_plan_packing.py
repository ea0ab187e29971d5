"""Properties of the token-packing plan, against an explicit model of the epoch's token stream.

The model writes the whole stream out (every token named by ``(shard, doc, offset)``, the separator
being offset ``len(doc)``), so "exactly once", "equal per rank" and "resume loses or repeats
nothing" are checked token by token, not through the plan's own arithmetic.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.data.plan import Topology
from streamio.data.plan.config import MAX_WORLD_SIZE
from streamio.data.plan.packing import Pack, PackPlan, plan_packing
from streamio.data.plan.permutation import TAG_SHARDS, permutation
from streamio.data.plan.tokenmix import TokenSource
from streamio.data.plan.tokens import TokenStream
from streamio.errors import PlanError, StateMismatchError
from streamio.limits import MAX_DOCUMENT_TOKENS

PAD = (-1, -1, -1)

counts_st = st.lists(st.lists(st.integers(0, 12), max_size=6), min_size=1, max_size=6).map(
    lambda shards: [np.array(s, dtype=np.int64) for s in shards]
)
pack_st = st.builds(
    Pack,
    seq_len=st.integers(1, 9),
    eos=st.sampled_from([None, 7]),
    tail=st.sampled_from(["pad", "drop"]),
    targets=st.booleans(),
)
topo_st = st.builds(Topology, world_size=st.integers(1, 5), num_workers=st.integers(0, 3), batch_size=st.integers(1, 4))


def model_stream(
    counts: list[np.ndarray], *, seed: int, epoch: int, shuffle: bool, sep: int
) -> list[tuple[int, int, int]]:
    order = permutation((seed, epoch, TAG_SHARDS), len(counts)) if shuffle else range(len(counts))
    return [(int(s), d, t) for s in order for d, n in enumerate(counts[int(s)]) for t in range(int(n) + sep)]


def tokens_of(plan: PackPlan, seq: int) -> list[tuple[int, int, int]]:
    out = [(p.shard, p.doc, t) for p in plan.pieces(seq) for t in range(p.first, p.end)]
    return out + [PAD] * (plan.pack.width - len(out))


def read_stage(plan: PackPlan, batches: int | None = None) -> list[list[list[tuple[int, int, int]]]]:
    """What each rank's consumer receives, batch by batch, with workers interleaved as DataLoader does."""
    topo = plan.topology
    take = plan.batches if batches is None else batches
    ranks = []
    for r in range(topo.world_size):
        per_worker = [list(plan.worker_batches(r, w)) for w in range(topo.workers)]
        got = [per_worker[k % topo.workers][k // topo.workers] for k in range(take)]
        assert sum(len(p) for p in per_worker) == plan.batches
        ranks.append([[tok for s in range(b.first, b.first + b.count) for tok in tokens_of(plan, s)] for b in got])
    return ranks


def inputs(seq_tokens: list[tuple[int, int, int]], pack: Pack) -> list[tuple[int, int, int]]:
    """The tokens a sequence is trained on once: all, or with ``targets`` its targets (all but the first)."""
    return seq_tokens[1:] if pack.targets else seq_tokens


def consumed_inputs(plan: PackPlan, batches: int | None = None) -> list[tuple[int, int, int]]:
    out = []
    for rank in read_stage(plan, batches):
        for batch in rank:
            for i in range(0, len(batch), plan.pack.width):
                out += inputs(batch[i : i + plan.pack.width], plan.pack)
    return out


def check_epoch(stream: list, read: list, pack: Pack, world: int) -> None:
    """Every token of the stream once (the tail policy's part excepted), padding only at the end."""
    stream = stream[1:] if pack.targets else stream  # with targets, the first token is no sequence's target
    real = [t for t in read if t != PAD]
    assert sorted(real) == sorted(set(real)), "a token was read twice"
    if pack.tail == "pad":
        assert sorted(real) == sorted(stream)
        assert len(read) - len(real) < world * pack.seq_len + pack.seq_len
    else:
        assert len(read) == len(real) and sorted(real) == sorted(stream[: len(real)])
        assert len(stream) - len(real) < world * pack.seq_len + pack.seq_len


@given(counts=counts_st, pack=pack_st, topo=topo_st, seed=st.integers(0, 3), shuffle=st.booleans())
def test_one_epoch_reads_every_token_once_and_equal_per_rank(counts, pack, topo, seed, shuffle) -> None:
    plan = plan_packing(counts, pack=pack, seed=seed, epoch=1, topology=topo, shuffle=shuffle)
    stream = model_stream(counts, seed=seed, epoch=1, shuffle=shuffle, sep=int(pack.eos is not None))
    ranks = read_stage(plan)
    assert len({tuple(len(b) for b in rank) for rank in ranks}) == 1, "ranks got different batches"
    for rank in ranks:
        assert all(len(b) == plan.topology.batch_size * pack.width for b in rank[:-1])
    check_epoch(stream, consumed_inputs(plan), pack, topo.world_size)
    # the stream's order is kept: sequences in order concatenate to the stream's prefix
    seqs = [t for s in range(plan.end) for t in inputs(tokens_of(plan, s), pack) if t != PAD]
    assert seqs == (stream[1:] if pack.targets else stream)[: len(seqs)]


@given(
    counts=counts_st,
    pack=pack_st,
    seed=st.integers(0, 3),
    stages=st.lists(st.tuples(topo_st, st.floats(0, 1)), min_size=1, max_size=4),
)
def test_resume_on_other_topologies_loses_and_repeats_nothing(counts, pack, seed, stages) -> None:
    stream = model_stream(counts, seed=seed, epoch=0, shuffle=True, sep=int(pack.eos is not None))
    state, read = None, []
    for i, (topo, frac) in enumerate(stages):
        plan = plan_packing(counts, pack=pack, seed=seed, epoch=0, topology=topo, resume=state)
        taken = plan.batches if i == len(stages) - 1 else int(frac * plan.batches)
        read += consumed_inputs(plan, taken)
        state = json.loads(json.dumps(plan.state_dict(taken)))
        assert len(json.dumps(state)) < 400
    # the stage that reads the epoch's end pads (or drops) for its own world size
    check_epoch(stream, read, pack, max(topo.world_size for topo, _ in stages))
    # at the end of the epoch nothing is left: under "pad" on any topology, under "drop" on the last one
    # (a smaller world may read the sequences a larger one dropped: they were never read)
    again = stages[0][0] if pack.tail == "pad" else stages[-1][0]
    assert plan_packing(counts, pack=pack, seed=seed, epoch=0, topology=again, resume=state).batches == 0


@given(counts=counts_st, pack=pack_st, topo=topo_st, frac=st.floats(0, 1))
def test_resume_on_the_same_topology_is_the_uninterrupted_run(counts, pack, topo, frac) -> None:
    whole = plan_packing(counts, pack=pack, seed=5, epoch=2, topology=topo)
    taken = int(frac * whole.batches)
    rest = plan_packing(counts, pack=pack, seed=5, epoch=2, topology=topo, resume=whole.state_dict(taken))
    assert [r[taken:] for r in read_stage(whole)] == read_stage(rest)


@given(counts=counts_st, pack=pack_st, topo=topo_st)
def test_the_plan_is_deterministic_and_keyed_by_seed_and_epoch(counts, pack, topo) -> None:
    def run(seed: int, epoch: int) -> list:
        return read_stage(plan_packing(counts, pack=pack, seed=seed, epoch=epoch, topology=topo))

    assert run(1, 0) == run(1, 0)


def test_seed_and_epoch_are_a_tuple_not_a_sum() -> None:
    counts = [np.array([3]) for _ in range(12)]
    a = TokenStream(counts, seed=1, epoch=0, shuffle=True, sep=0).order.tolist()
    b = TokenStream(counts, seed=0, epoch=1, shuffle=True, sep=0).order.tolist()
    assert a != b


def test_state_is_small_and_independent_of_tokens_seen() -> None:
    counts = [np.full(1000, 1000, dtype=np.int64) for _ in range(1000)]  # 1e9 tokens
    plan = plan_packing(counts, pack=Pack(2048, eos=0), seed=0, epoch=0, topology=Topology(8, 2, 4))
    after_1m = plan.state_dict(1_000_000 // (2048 * 8 * 4))
    after_all = plan.state_dict(plan.batches)
    assert len(json.dumps(after_all)) - len(json.dumps(after_1m)) <= 4
    assert len(json.dumps(after_all)) < 300


@pytest.mark.parametrize("bad", [-1, MAX_DOCUMENT_TOKENS + 1])
def test_a_hostile_token_count_is_refused_naming_shard_and_sample(bad: int) -> None:
    counts = [np.array([1, 2]), np.array([4, bad, 3])]
    with pytest.raises(PlanError, match=r"shard 1 sample 1: token count .* outside"):
        plan_packing(counts, pack=Pack(4), seed=0, epoch=0, topology=Topology(1))


def test_counts_that_are_not_integers_are_refused() -> None:
    with pytest.raises(PlanError, match="shard 0 must be a 1-D int array"):
        plan_packing([np.array([1.5])], pack=Pack(4), seed=0, epoch=0, topology=Topology(1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 0}, r"Pack\(seq_len\)=0"),
        ({"seq_len": 4, "eos": -1}, r"Pack\(eos\)=-1 .*eos=None"),
        ({"seq_len": 4, "tail": "wrap"}, r"Pack\(tail='wrap'\)"),
        ({"seq_len": 4, "member": "a/npy"}, r"Pack\(member='a/npy'\)"),
        ({"seq_len": 4, "member": ".npy"}, r"Pack\(member='.npy'\)"),
        ({"seq_len": 4, "pad": 1 << 40}, r"Pack\(pad\)=.*above the limit"),
        ({"seq_len": 4, "targets": 1}, r"Pack\(targets=1\)"),
    ],
)
def test_a_bad_pack_is_refused_naming_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        Pack(**kwargs)


def _state() -> dict:
    return plan_packing([np.array([5, 6, 7])], pack=Pack(4), seed=0, epoch=0, topology=Topology(2)).state_dict(1)


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda s: s.update(version=9), PlanError, "version 9"),
        (lambda s: s.pop("fingerprint"), PlanError, "no fingerprint"),
        (lambda s: s.update(epoch=3), StateMismatchError, "epoch: state has 3"),
        (lambda s: s["fingerprint"].update(seed=1), StateMismatchError, "seed: state has 1"),
        (lambda s: s["fingerprint"]["pack"].update(seq_len=8), StateMismatchError, "pack: state has"),
        (lambda s: s.update(sequences=-1), PlanError, "sequences=-1 must be an int >= 0"),
        (lambda s: s.update(sequences=1 << 40), PlanError, "sequences=.* above the limit"),
        (lambda s: s.update(sequences="3"), PlanError, "sequences='3'"),
        (lambda s: s.update(sequences=True), PlanError, "sequences=True"),
    ],
)
def test_a_foreign_or_hostile_state_is_refused(edit, error, match) -> None:
    state = _state()
    edit(state)
    with pytest.raises(error, match=match):
        plan_packing([np.array([5, 6, 7])], pack=Pack(4), seed=0, epoch=0, topology=Topology(3), resume=state)


def test_a_state_past_the_epoch_quotes_the_epochs_sequences() -> None:
    """18 tokens in sequences of 4: 5 sequences (on 15d7008 the message said 1048581, its limit)."""
    state = _state()
    state["sequences"] = 1 << 21
    padded = 5 + MAX_WORLD_SIZE - 1  # a stage of the widest world pads at most world_size - 1 sequences
    with pytest.raises(PlanError, match=rf"sequences=2097152 is above the limit of {padded}\. This epoch has 5 "
                                        rf"sequences \(a stage pads them to at most {padded}\); the state was not"):
        plan_packing([np.array([5, 6, 7])], pack=Pack(4), seed=0, epoch=0, topology=Topology(3), resume=state)


def test_batches_beyond_the_stage_are_refused() -> None:
    plan = plan_packing([np.array([5, 6, 7])], pack=Pack(4), seed=0, epoch=0, topology=Topology(2))
    with pytest.raises(PlanError, match=r"batches=4 is above the limit of 3\. This stage has 3 batches per rank"):
        plan.state_dict(4)


def test_padding_and_dropped_are_stated() -> None:
    # 18 tokens + 3 separators = 21; seq_len 4 over 2 ranks
    pad = plan_packing([np.array([5, 6, 7])], pack=Pack(4, eos=0), seed=0, epoch=0, topology=Topology(2))
    assert (pad.end, pad.padding, pad.dropped) == (6, 3, 0)
    drop = plan_packing([np.array([5, 6, 7])], pack=Pack(4, eos=0, tail="drop"), seed=0, epoch=0, topology=Topology(2))
    assert (drop.end, drop.padding, drop.dropped) == (4, 0, 5)


# ----------------------------------------------------------------------------- mixtures (shares in tokens)
def model_source(counts: list[np.ndarray], j: int, offset: int, seed: int, sep: int, upto: int) -> list:
    """Source ``j``'s endless stream (cycles keyed by (seed, cycle, j)), its first ``upto`` tokens."""
    out: list = []
    q = 0
    while len(out) < upto and sum(int(c.sum()) for c in counts) + sep * sum(len(c) for c in counts):
        order = permutation((seed, q, TAG_SHARDS, j), len(counts))
        out += [
            (offset + int(s), d, t) for s in order for d, n in enumerate(counts[int(s)]) for t in range(int(n) + sep)
        ]
        q += 1
    return out[:upto]


mix_st = st.lists(
    st.tuples(counts_st, st.one_of(st.none(), st.integers(1, 4)), st.one_of(st.none(), st.integers(1, 7))),
    min_size=1,
    max_size=3,
).filter(lambda srcs: all(sum(int(c.sum()) + len(c) for c in counts) > 0 for counts, _, _ in srcs))


@given(
    srcs=mix_st,
    pack=pack_st.filter(lambda p: p.eos is not None),
    seed=st.integers(0, 2),
    epoch=st.integers(0, 2),
    stages=st.lists(st.tuples(topo_st, st.floats(0, 1)), min_size=1, max_size=3),
)
def test_a_mixture_reads_each_sources_token_share_exactly_once_across_topologies(srcs, pack, seed, epoch, stages):
    sources = [TokenSource(c, weight=w, sequences=None if w else n) for c, w, n in srcs]
    state, read = None, []
    for i, (topo, frac) in enumerate(stages):
        plan = plan_packing(sources, pack=pack, seed=seed, epoch=epoch, topology=topo, resume=state)
        taken = plan.batches if i == len(stages) - 1 else int(frac * plan.batches)
        for rank in read_stage(plan, taken):
            read += [tok for batch in rank for tok in batch]
        state = json.loads(json.dumps(plan.state_dict(taken)))
    shares = plan.tokens.contributions
    offsets = np.cumsum([0] + [len(c) for c, _, _ in srcs])
    expected: collections.Counter = collections.Counter()
    for j, ((counts, _, _), c) in enumerate(zip(srcs, shares, strict=True)):
        stream = model_source(counts, j, int(offsets[j]), seed, 1, ((epoch + 1) * c) * pack.seq_len + pack.width)
        for k in range(epoch * c, (epoch + 1) * c):  # source j's sequences of this epoch, as the plan defines them
            expected.update(stream[k * pack.seq_len : k * pack.seq_len + pack.width])
    got = collections.Counter(t for t in read if t != PAD)
    world = max(topo.world_size for topo, _ in stages)  # the stage that reads the epoch's end pads (or drops)
    assert not got - expected, "a token was read more often than the epoch's share holds it"
    if pack.tail == "pad":
        assert got == expected and read.count(PAD) < world * pack.width
    else:  # "drop": fewer than world_size sequences of the epoch's end are not read
        assert sum((expected - got).values()) < world * pack.width and PAD not in read


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@given(field=st.sampled_from(["version", "fingerprint", "epoch", "sequences", "extra"]), value=json_values)
def test_a_fuzzed_state_resumes_within_the_epoch_or_raises_a_plan_error(field: str, value: object) -> None:
    counts = [np.array([5, 6, 7])]
    state = plan_packing(counts, pack=Pack(4), seed=0, epoch=0, topology=Topology(2)).state_dict(1)
    state[field] = value
    try:
        plan = plan_packing(counts, pack=Pack(4), seed=0, epoch=0, topology=Topology(3), resume=state)
    except PlanError:
        return
    assert 0 <= plan.start <= plan.end and plan.start <= plan.real + MAX_WORLD_SIZE  # consumed padding, at most
    assert plan.end <= max(plan.start, plan.real + 2)  # from there, the rest of the epoch for 3 ranks
