"""Token packing: an epoch's token stream cut into fixed-length sequences, shared by ranks and workers.

The plan is pure, like the sample planner's, and works on positions of the epoch's token stream
(:class:`~streamio.data.plan.tokens.TokenStream`: documents in the planned order, each followed by
its separator). With ``L = seq_len``:

1. **Sequences.** Sequence ``i`` is the stream's tokens ``[i*L, (i+1)*L)`` (with ``targets=True``,
   one more: ``[i*L, (i+1)*L + 1)``, the last token being the next sequence's first, so inputs and
   shifted targets come from one sample). Documents are split across sequence boundaries freely.
2. **Steps, not ranks' blocks.** Consumption under DDP is in lockstep: every rank takes one batch
   of ``B`` sequences per step. Step ``k`` of a stage that starts at sequence ``g0`` is the ``R*B``
   sequences from ``g0 + k*R*B``; rank ``r`` takes the ``B`` from ``g0 + k*R*B + r*B``. So after
   ``C`` batches per rank the job has consumed exactly the sequences ``[0, g0 + C*R*B)``: a *prefix*
   of the epoch, whatever the topology. A rank's batch ``k`` is read by DataLoader worker
   ``k % W`` (DataLoader's round-robin), each batch one contiguous range of ``B*L`` tokens.
3. **Tail policy, in sequences, the same on every rank.** With ``T`` tokens in the stream, ``N =
   ceil(T / L)`` sequences hold a token (``targets``: ``ceil((T - 1) / L)``) and ``F = floor(T / L)``
   are full (``targets``: ``floor((T - 1) / L)``). ``"pad"``: the stage reads up to ``S = g0 +
   ceil((N - g0) / R) * R`` sequences; the tokens past ``T`` are the pad token (document id -1),
   so every token of the epoch is read exactly once, plus at most ``R*L - 1`` pad tokens.
   ``"drop"``: ``S = g0 + floor((F - g0) / R) * R`` and the rest (fewer than ``R*L + L`` tokens) is
   not read. Either way every rank gets ``(S - g0) / R`` sequences: full batches, and one last
   batch of the same size on every rank.

**Resume is one int.** The state records the number of sequences of the epoch consumed, ``g``
(plus a fingerprint), independent of the tokens seen. Resuming plans a new stage from ``g0 = g``
with whatever topology the job now has: nothing consumed is read again and nothing unconsumed is
lost (beyond the tail policy of the last stage), including mid-document and mid-sequence positions
of the data, on any world size, worker count or batch size. On the same topology the new stage's
steps are exactly the uninterrupted run's remaining steps. The condition is DDP's: every rank
consumed the same number of batches (a state of unequal counts cannot be expressed, and is not
accepted).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, overload

import numpy as np

from streamio.data.plan.config import MAX_EPOCH, MAX_WORLD_SIZE, Topology, check_int
from streamio.data.plan.tokenmix import BatchLayout, MixedTokens, SingleTokens, TokenSource
from streamio.data.plan.tokens import Piece, TokenStream, token_counts_digest
from streamio.errors import PlanError, StateMismatchError
from streamio.state_version import VERSION_KEY, check_version

__all__ = [
    "PACK_STATE_VERSION", "MAX_SEQ_LEN", "Pack", "PackPlan", "PackStream", "SeqRange", "SeqRanges", "plan_packing",
]

PACK_STATE_VERSION = 1
"""Version of a packing resume state."""
MAX_SEQ_LEN = 1 << 24
"""Longest sequence a :class:`Pack` may ask for."""
MAX_TOKEN_ID = (1 << 32) - 1
"""Largest separator or pad token id (the widest token type read is uint32)."""

K_FINGERPRINT, K_EPOCH, K_SEQUENCES = "fingerprint", "epoch", "sequences"
_FIX = "resume with the data set, seed, shuffle, Pack and epoch it was taken with, or start the epoch fresh"


@dataclass(frozen=True)
class Pack:
    """Pack a token data set's documents into sequences of exactly ``seq_len`` tokens at read time.

    Attributes:
        seq_len: tokens per sequence (1 to :data:`MAX_SEQ_LEN`).
        member: the extension of each document's 1-D integer member (``.npy`` of uint16, uint32,
            int32 or int64 tokens).
        eos: separator token appended after every document, or ``None`` for none.
        tail: ``"pad"`` (the last sequences are completed with ``pad``; every token is read exactly
            once) or ``"drop"`` (the tokens that do not fill whole sequences on every rank are not
            read this epoch).
        pad: token id of padding (its document id is -1, so a mask can exclude it).
        targets: yield ``seq_len + 1`` tokens per sequence, overlapping the next by one, so
            ``tokens[:-1]`` and ``tokens[1:]`` are inputs and targets and every token is a target once.

    Raises:
        PlanError: a field out of range.
    """

    seq_len: int
    member: str = "npy"
    eos: int | None = None
    tail: Literal["pad", "drop"] = "pad"
    pad: int = 0
    targets: bool = False

    def __post_init__(self) -> None:
        check_int("Pack(seq_len)", self.seq_len, 1, MAX_SEQ_LEN)
        check_int("Pack(pad)", self.pad, 0, MAX_TOKEN_ID)
        if self.eos is not None:
            check_int("Pack(eos)", self.eos, 0, MAX_TOKEN_ID, fix=" Pass eos=None for no separator.")
        if self.tail not in ("pad", "drop"):
            raise PlanError(f"Pack(tail={self.tail!r}) must be 'pad' or 'drop'.")
        if not isinstance(self.member, str) or not self.member or "/" in self.member or self.member.startswith("."):
            raise PlanError(f"Pack(member={self.member!r}) must be a member extension such as 'npy' or 'ids.npy'.")
        if not isinstance(self.targets, bool):
            raise PlanError(f"Pack(targets={self.targets!r}) must be True or False.")

    @property
    def width(self) -> int:
        """Tokens in each yielded sequence: ``seq_len``, or ``seq_len + 1`` with ``targets``."""
        return self.seq_len + int(self.targets)

    def as_json(self) -> dict[str, Any]:
        """The settings a resume state is checked against (``member`` is not: it does not change the stream)."""
        return {"seq_len": self.seq_len, "eos": self.eos, "tail": self.tail, "pad": self.pad, "targets": self.targets}


class SeqRange(NamedTuple):
    """``count`` consecutive sequences of the epoch from sequence ``first``: one batch of a rank."""

    first: int
    count: int


class SeqRanges(Sequence[SeqRange]):
    """Rank ``rank``'s batches ``k`` for ``k`` in ``ks`` of a plan, each computed when asked for.

    A worker may read millions of batches in an epoch (a large data set, short sequences, small
    batches); they are never held: memory is O(1) whatever their number.
    """

    def __init__(self, plan: PackPlan, rank: int, ks: range) -> None:
        self.plan, self.rank, self.ks = plan, rank, ks

    def __len__(self) -> int:
        return len(self.ks)

    @overload
    def __getitem__(self, i: int) -> SeqRange: ...
    @overload
    def __getitem__(self, i: slice) -> SeqRanges: ...
    def __getitem__(self, i: int | slice) -> SeqRange | SeqRanges:
        if isinstance(i, slice):
            return SeqRanges(self.plan, self.rank, self.ks[i])
        return self.plan.batch(self.rank, self.ks[i])

    def __iter__(self) -> Iterator[SeqRange]:
        return (self.plan.batch(self.rank, k) for k in self.ks)

    @property
    def size(self) -> int:
        """Sequences in these batches (every batch is full but the stage's last, ``per_rank % batch_size``)."""
        b, per_rank = self.plan.topology.batch_size, self.plan.per_rank
        short = b - per_rank % b if per_rank % b else 0
        last = self.plan.batches - 1
        return len(self.ks) * b - (short if last in self.ks else 0)


@dataclass(frozen=True)
class PackStream:
    """What one DataLoader worker of one rank reads in a :class:`PackPlan`: its batches, in order.

    Attributes:
        rank: the rank.
        worker: the DataLoader worker id (0 with ``num_workers=0``).
        batches: the worker's batches (rank batch ``k`` is worker ``k % W``'s), computed as they are
            asked for (:class:`SeqRanges`).
    """

    rank: int
    worker: int
    batches: SeqRanges

    @property
    def size(self) -> int:
        """Sequences this stream yields."""
        return self.batches.size


def sequence_bounds(total: int, pack: Pack) -> tuple[int, int]:
    """``(N, F)``: sequences holding a token of a ``total``-token stream, and full sequences."""
    extra = int(pack.targets)
    body = max(0, total - extra)
    return -(-body // pack.seq_len), body // pack.seq_len


class PackPlan:
    """One stage of a packed epoch: sequences ``[start, end)``, shared by ``topology`` in steps.

    Built by :func:`plan_packing`; every method is a pure function of it.
    """

    def __init__(
        self, tokens: SingleTokens | MixedTokens, pack: Pack, topology: Topology, *, epoch: int, start: int,
        fingerprint: dict[str, Any],
    ) -> None:
        self.tokens, self.pack, self.topology, self.start, self.epoch = tokens, pack, topology, start, epoch
        self.fingerprint = fingerprint
        n, f = sequence_bounds(tokens.total, pack)
        r = topology.world_size
        if pack.tail == "pad":
            self.end = start + -(-max(0, n - start) // r) * r
        else:
            self.end = start + max(0, f - start) // r * r
        self.real = n
        """Sequences that hold at least one token of the stream."""

    @property
    def per_rank(self) -> int:
        """Sequences each rank reads in this stage."""
        return (self.end - self.start) // self.topology.world_size

    @property
    def batches(self) -> int:
        """Batches each rank reads in this stage (the last one may be smaller than the batch size)."""
        return -(-self.per_rank // self.topology.batch_size)

    @property
    def padding(self) -> int:
        """Pad tokens in this stage's sequences (``"pad"``; 0 under ``"drop"``)."""
        read_end = self.end * self.pack.seq_len + int(self.pack.targets)
        return max(0, read_end - max(self.tokens.total, self.start * self.pack.seq_len))

    @property
    def dropped(self) -> int:
        """Tokens of the stream after this stage's last sequence, which no stage reads (``"drop"``)."""
        return max(0, self.tokens.total - int(self.pack.targets) - self.end * self.pack.seq_len)

    def batch(self, rank: int, k: int) -> SeqRange:
        """The sequences of rank ``rank``'s batch ``k`` (0-based, from this stage's start)."""
        r, b = self.topology.world_size, self.topology.batch_size
        full = self.per_rank // b
        if k < full:
            return SeqRange(self.start + k * r * b + rank * b, b)
        last = self.per_rank - full * b
        return SeqRange(self.start + full * r * b + rank * last, last)

    def worker_batches(self, rank: int, worker: int) -> SeqRanges:
        """The batches DataLoader worker ``worker`` of ``rank`` reads, in order (batch ``k`` is worker ``k % W``'s)."""
        check_int("rank", rank, 0, self.topology.world_size - 1)
        check_int("worker", worker, 0, self.topology.workers - 1)
        return SeqRanges(self, rank, range(worker, self.batches, self.topology.workers))

    # what StreamingDataset asks of a plan, in sequences (one sequence is one sample)
    @property
    def samples_per_rank(self) -> int:
        """Sequences each rank yields in this stage (:attr:`per_rank`)."""
        return self.per_rank

    stage_samples_per_rank = samples_per_rank
    batches_per_rank = batches

    @property
    def contributions(self) -> tuple[int, ...]:
        """Sequences each source contributes to the epoch (one entry for one data set)."""
        return tuple(self.tokens.contributions) if isinstance(self.tokens, MixedTokens) else (self.real,)

    def stream(self, rank: int, worker: int) -> PackStream:
        """The batches DataLoader worker ``worker`` of ``rank`` reads (see :meth:`worker_batches`)."""
        return PackStream(rank, worker, self.worker_batches(rank, worker))

    def layout(self, batch: SeqRange) -> BatchLayout:
        """What the sequences of ``batch`` hold: segments of the sources' token streams, and their order."""
        return self.tokens.layout(batch.first, batch.count)

    def pieces(self, seq: int) -> list[Piece]:
        """The document slices of sequence ``seq``, in order (fewer tokens than :attr:`Pack.width`: padding follows)."""
        segments = self.tokens.layout(seq, 1).segments
        return segments[0].pieces if segments else []

    def consumed(self, batches: int) -> int:
        """Sequences of the epoch consumed once every rank took ``batches`` batches of this stage."""
        check_int("batches", batches, 0, self.batches, fix=f" This stage has {self.batches} batches per rank.")
        return min(self.end, self.start + batches * self.topology.world_size * self.topology.batch_size)

    def state_dict(self, batches: int) -> dict[str, Any]:
        """The resume state after every rank took ``batches`` batches of this stage (small, JSON-safe)."""
        return {
            VERSION_KEY: PACK_STATE_VERSION,
            K_FINGERPRINT: dict(self.fingerprint),
            K_EPOCH: self.epoch,
            K_SEQUENCES: self.consumed(batches),
        }


def _fingerprint(
    tokens: SingleTokens | MixedTokens, pack: Pack, seed: int, shuffle: bool, index_fingerprint: str | None
) -> dict[str, Any]:
    if isinstance(tokens, SingleTokens):
        what: dict[str, Any] = {"tokens": token_counts_digest(tokens.stream.counts), "index": index_fingerprint}
    else:
        what = {"sources": [
            {"tokens": token_counts_digest(s.counts), "index": s.fingerprint, "contribution": c}
            for s, c in zip(tokens.sources, tokens.contributions, strict=True)
        ]}
    return {
        **what,
        "seed": seed,
        "shuffle": shuffle,
        "pack": pack.as_json(),
    }


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _resume_start(state: object, fp: Mapping[str, Any], epoch: int, sequences: int) -> int:
    """The sequences consumed by ``state`` of an epoch of ``sequences``, after checking it belongs to this plan.

    A stage under ``tail="pad"`` ends at most ``world_size - 1`` all-padding sequences past the
    epoch's last, so a state may count up to ``sequences + MAX_WORLD_SIZE - 1``.
    """
    state = check_version(state, PACK_STATE_VERSION, what="packing resume state", error=PlanError, fix=_FIX)
    theirs = state.get(K_FINGERPRINT)
    if not isinstance(theirs, Mapping):
        raise PlanError(f"packing resume state has no fingerprint; pass a dict made by PackPlan.state_dict(). {_FIX}.")
    diffs = [
        f"{k}: state has {_short(theirs.get(k))}, this plan has {v!r}" for k, v in fp.items() if theirs.get(k) != v
    ]
    if state.get(K_EPOCH) != epoch:
        diffs.append(f"epoch: state has {_short(state.get(K_EPOCH))}, this plan has {epoch!r}")
    if diffs:
        raise StateMismatchError(f"packing resume state does not belong to this plan ({'; '.join(diffs)}); {_FIX}.")
    padded = sequences + MAX_WORLD_SIZE - 1
    return check_int(
        "packing resume state sequences",
        state.get(K_SEQUENCES),
        0,
        padded,
        fix=f" This epoch has {sequences} sequences (a stage pads them to at most {padded}); the state was not "
        f"made for this data set. {_FIX}.",
    )


def plan_packing(  # noqa: PLR0913 - keyword-only, the planner's inputs
    doc_tokens: Sequence[np.ndarray] | Sequence[TokenSource],
    *,
    pack: Pack,
    seed: int,
    epoch: int,
    topology: Topology,
    shuffle: bool = True,
    resume: Mapping[str, Any] | None = None,
    index_fingerprint: str | None = None,
    epoch_sequences: int | None = None,
) -> PackPlan:
    """Plan one epoch (or, with ``resume``, the rest of it) of packed sequences.

    Args:
        doc_tokens: per shard (index order), each document's token count (the index's ``tokens``); or
            a mixture: one :class:`~streamio.data.plan.tokenmix.TokenSource` per source, sharing
            each epoch by tokens (:mod:`streamio.data.plan.tokenmix`).
        pack: sequence length, separator and tail policy.
        seed: base seed of the shard order.
        epoch: the epoch.
        topology: ranks, DataLoader workers and batch size (sequences per batch) reading now.
        shuffle: permute the shard order by ``(seed, epoch)``; ``False`` reads index order.
        resume: a state from :meth:`PackPlan.state_dict` of this epoch, on any topology.
        index_fingerprint: the index's fingerprint, recorded in (and checked against) the state.
        epoch_sequences: a mixture's sequences per epoch (None: the sources' own, see
            :func:`~streamio.data.plan.mixture.contributions`).

    Returns:
        The stage from the state's position (or the epoch's start) with this topology.

    Raises:
        PlanError: an argument out of range, a hostile token count, or a malformed state.
        StateMismatchError: the state belongs to another data set, seed, shuffle, Pack or epoch.
    """
    if not isinstance(pack, Pack):
        raise PlanError(f"pack={pack!r} must be a streamio.Pack.")
    check_int("epoch", epoch, 0, MAX_EPOCH)
    sep, extra = int(pack.eos is not None), int(pack.targets)
    tokens: SingleTokens | MixedTokens
    if doc_tokens and all(isinstance(s, TokenSource) for s in doc_tokens):
        tokens = MixedTokens(
            doc_tokens, seq_len=pack.seq_len, extra=extra, sep=sep, seed=int(seed), epoch=epoch,  # type: ignore[arg-type]
            shuffle=bool(shuffle), epoch_sequences=epoch_sequences,
        )
    else:
        stream = TokenStream(doc_tokens, seed=seed, epoch=epoch, shuffle=bool(shuffle), sep=sep)  # type: ignore[arg-type]
        tokens = SingleTokens(stream, pack.seq_len, extra)
    fp = _fingerprint(tokens, pack, int(seed), bool(shuffle), index_fingerprint)
    start = 0
    if resume is not None:
        n, _ = sequence_bounds(tokens.total, pack)
        start = _resume_start(resume, fp, epoch, n)
    return PackPlan(tokens, pack, topology, epoch=epoch, start=start, fingerprint=fp)
