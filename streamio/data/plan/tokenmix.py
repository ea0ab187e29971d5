"""Which tokens each packed sequence holds: one data set's stream, or a mixture shared by token shares.

A packing plan (:mod:`streamio.data.plan.packing`) numbers an epoch's sequences and deals them to
ranks and workers; this module says what sequence ``i`` *is*. :meth:`layout` describes a batch of
consecutive sequences as **segments** (each one contiguous range of one source's token stream:
one sequential read) and the order in which the batch's sequences come out of them.

* **One data set** (:class:`SingleTokens`): the epoch's token stream
  (:class:`~streamio.data.plan.tokens.TokenStream`); sequence ``i`` is its tokens ``[i*L, (i+1)*L)``,
  a batch is one segment.
* **A mixture** (:class:`MixedTokens`): each source ``j`` is an endless stream of *cycles* (cycle
  ``q``: all its documents, shards permuted by ``(seed, q, j)``), cut into sequences of ``L``
  tokens across cycle boundaries. Weights are shares of *sequences*, i.e. of tokens: source ``j``
  contributes ``c_j`` sequences per epoch (:func:`~streamio.data.plan.mixture.contributions` over
  the sources' sequences per cycle, so ``Stream(samples=)`` and ``epoch_samples`` count sequences),
  epoch ``e`` takes its sequences ``[e*c_j, (e+1)*c_j)`` (every token of a source before any
  repeats), and the epoch's sequences are the sources' interleaved in proportion
  (:class:`~streamio.data.plan.interleave.Interleave`): any ``w`` consecutive sequences hold
  ``w * c_j / sum(c)`` of source ``j`` within 2, so every batch keeps the token shares. A batch is
  one segment per source it draws from (the source's sequences in it are consecutive).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from streamio.data.plan.interleave import Interleave
from streamio.data.plan.mixture import PlanSource, contributions
from streamio.data.plan.tokens import Piece, TokenStream
from streamio.errors import PlanError

__all__ = ["BatchLayout", "MixedTokens", "Segment", "SingleTokens", "TokenSource"]


@dataclass(frozen=True)
class TokenSource:
    """One source of a packed mixture as the planner sees it.

    Attributes:
        counts: per shard (index order), each document's token count.
        weight: relative share of each epoch's tokens, or None.
        sequences: sequences per epoch (an int >= 1), or None.
        fingerprint: the source index's fingerprint (recorded in resume states), or None.
        name: how errors name the source (its URL).
    """

    counts: Sequence[np.ndarray]
    weight: float | None = None
    sequences: int | None = None
    fingerprint: str | None = None
    name: str = "source"


class Segment(NamedTuple):
    """``count`` consecutive sequences of one source, as the document pieces of their tokens."""

    source: int
    pieces: list[Piece]
    count: int


class BatchLayout(NamedTuple):
    """A batch's segments, and per sequence in batch order its ``(segment, index)`` (None: all padding)."""

    segments: list[Segment]
    order: list[tuple[int, int] | None]


class SingleTokens:
    """One data set's epoch stream, cut into sequences of ``seq_len`` (``extra``: the overlap of ``targets``)."""

    def __init__(self, stream: TokenStream, seq_len: int, extra: int) -> None:
        self.stream, self.seq_len, self.extra = stream, seq_len, extra
        self.total = stream.total

    def count(self, shard: int, doc: int) -> int:
        """Tokens of a document, as the index declared them."""
        return self.stream.count(shard, doc)

    def layout(self, first: int, count: int) -> BatchLayout:
        """Sequences ``[first, first + count)``: one segment (tokens past the stream's end are padding)."""
        lo = first * self.seq_len
        pieces = list(self.stream.pieces(lo, lo + count * self.seq_len + self.extra))
        return BatchLayout([Segment(0, pieces, count)], [(0, j) for j in range(count)])


class MixedTokens:
    """A mixture's epoch of sequences (see the module docstring).

    Raises:
        PlanError: a source without tokens, or shares that cannot be met (see :func:`contributions`).
    """

    def __init__(
        self,
        sources: Sequence[TokenSource],
        *,
        seq_len: int,
        extra: int,
        sep: int,
        seed: int,
        epoch: int,
        shuffle: bool,
        epoch_sequences: int | None,
    ) -> None:
        self.seq_len, self.extra, self.epoch = seq_len, extra, epoch
        self._args = {"seed": seed, "shuffle": shuffle, "sep": sep}
        offsets = np.cumsum([0] + [len(s.counts) for s in sources]).tolist()
        self.sources, self.offsets = list(sources), offsets
        self._cycles: dict[tuple[int, int], TokenStream] = {}
        first = [self._cycle(j, 0) for j in range(len(sources))]
        self.cycle_tokens = [s.total for s in first]
        per_cycle = []
        for src, tokens in zip(sources, self.cycle_tokens, strict=True):
            if tokens == 0:
                raise PlanError(f"{src.name} has no tokens; a mixture cannot draw from an empty source")
            per_cycle.append(np.array([-(-tokens // seq_len)], dtype=np.int64))
        specs = [
            PlanSource(n, weight=s.weight, samples=s.sequences, name=s.name)
            for s, n in zip(sources, per_cycle, strict=True)
        ]
        self.contributions = contributions(specs, epoch_sequences)
        self.mix = Interleave(self.contributions)
        self.total = sum(self.contributions) * seq_len + extra  # a virtual stream: every sequence is full

    def _cycle(self, j: int, q: int) -> TokenStream:
        found = self._cycles.get((j, q))
        if found is None:
            if len(self._cycles) >= 4 * len(self.sources):
                self._cycles.clear()
            found = TokenStream(self.sources[j].counts, epoch=q, source=j, offset=self.offsets[j], **self._args)
            self._cycles[(j, q)] = found
        return found

    def count(self, shard: int, doc: int) -> int:
        """Tokens of a document (global shard number), as the index declared them."""
        j = int(np.searchsorted(self.offsets, shard, side="right")) - 1
        return int(self.sources[j].counts[shard - self.offsets[j]][doc])

    def _pieces(self, j: int, a: int, b: int) -> list[Piece]:
        """Source ``j``'s endless stream, offsets ``[a, b)``, across cycles."""
        size = self.cycle_tokens[j]
        out: list[Piece] = []
        while a < b:
            q, at = divmod(a, size)
            stop = min(b, (q + 1) * size)
            out += self._cycle(j, q).pieces(at, at + stop - a)
            a = stop
        return out

    def layout(self, first: int, count: int) -> BatchLayout:
        """Sequences ``[first, first + count)``: one segment per source drawn from, in the interleaved order."""
        real = sum(self.contributions)
        stop = min(first + count, real)
        if first >= stop:
            return BatchLayout([], [None] * count)
        lo, hi, order = self.mix.items(first, stop)
        segments, where = [], []
        for j, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            if b > a:
                base = self.epoch * self.contributions[j]
                tokens = self._pieces(j, (base + a) * self.seq_len, (base + b) * self.seq_len + self.extra)
                where += [(len(segments), k) for k in range(b - a)]
                segments.append(Segment(j, tokens, b - a))
        placed: list[tuple[int, int] | None] = [where[int(i)] for i in order]
        return BatchLayout(segments, placed + [None] * (first + count - stop))
