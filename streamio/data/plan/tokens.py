"""The epoch's token stream: documents in their planned order, each followed by its separator.

A token data set is a data set whose samples are documents: one 1-D integer member each, whose
length (its token count) the index records per sample. One epoch's **token stream** is the
concatenation of every document in the epoch's order, each followed by the separator token when
the packing has one (``Pack(eos=...)``). The order is the sample planner's shard order: shards
permuted by the key ``(seed, epoch)`` (or index order), documents in index order inside a shard,
so a reader streams each shard front to back.

A position of the stream is a global token offset ``t``. :class:`TokenStream` maps a range
``[a, b)`` of offsets to :class:`Piece` s (a document's slice, the separator being offset
``tokens`` of its document) by two binary searches: one over the shards' cumulative sizes in
epoch order, one over the document sizes of one shard (computed once per shard touched). Memory is
O(shards) plus the document counts the index already holds; nothing is O(tokens).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from streamio.data.plan.config import MAX_EPOCH, check_int
from streamio.data.plan.permutation import TAG_SHARDS, permutation
from streamio.errors import PlanError
from streamio.limits import MAX_DOCUMENT_TOKENS

__all__ = ["MAX_DOCUMENT_TOKENS", "Piece", "TokenStream", "token_counts_digest"]


_I64 = np.int64


class Piece(NamedTuple):
    """A slice ``[first, end)`` of one document's tokens in the stream.

    Offset ``tokens`` (the document's length) is its separator: a piece with ``end == tokens + 1``
    ends with the separator token, one with ``first == tokens`` is the separator alone.
    """

    shard: int
    doc: int
    first: int
    end: int

    @property
    def size(self) -> int:
        """Tokens of the stream this piece covers."""
        return self.end - self.first


def token_counts_digest(doc_tokens: Sequence[np.ndarray]) -> str:
    """A short SHA-256 of the per-shard document token counts (what a resume state is checked against)."""
    h = hashlib.sha256()
    for counts in doc_tokens:
        h.update(len(counts).to_bytes(8, "little"))
        h.update(np.asarray(counts, dtype="<i8").tobytes())
    return "sha256:" + h.hexdigest()[:32]


def _checked_counts(doc_tokens: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for shard, counts in enumerate(doc_tokens):
        arr = np.asarray(counts)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise PlanError(
                f"document token counts of shard {shard} must be a 1-D int array, not {arr.dtype}{arr.shape}."
            )
        arr = arr.astype(_I64)
        bad = np.flatnonzero((arr < 0) | (arr > MAX_DOCUMENT_TOKENS))
        if bad.size:
            raise PlanError(
                f"shard {shard} sample {int(bad[0])}: token count {int(arr[bad[0]])} is outside [0, "
                f"{MAX_DOCUMENT_TOKENS}]: no document has it; rewrite the data set (`streamio shard`, write_dataset)."
            )
        out.append(arr)
    return out


class TokenStream:
    """One epoch's (or one cycle's) documents in order, each followed by ``sep`` separator tokens (0 or 1).

    Args:
        doc_tokens: per shard (index order), each document's token count.
        seed: the base seed; the shard order is keyed by ``(seed, epoch)`` (a mixture's source
            ``i``: ``(seed, cycle, i)``).
        epoch: the epoch, or a mixture source's cycle (0 to :data:`~streamio.data.plan.config.MAX_EPOCH`).
        shuffle: permute the shard order (``False``: index order).
        sep: tokens appended after every document (1 with a separator, else 0).
        source: a mixture's source number (None: one data set).
        offset: the source's first global shard number (the pieces name global shards).

    Raises:
        PlanError: a count is negative or above :data:`MAX_DOCUMENT_TOKENS`, or an argument is out of range.
    """

    def __init__(
        self, doc_tokens: Sequence[np.ndarray], *, seed: int, epoch: int, shuffle: bool, sep: int,
        source: int | None = None, offset: int = 0,
    ) -> None:
        self.counts = _checked_counts(doc_tokens)
        self.epoch = check_int("epoch", epoch, 0, MAX_EPOCH)
        self.sep = check_int("sep", sep, 0, 1)
        self.offset = offset
        n = len(self.counts)
        key = (int(seed), self.epoch, TAG_SHARDS) + (() if source is None else (int(source),))
        self.order = permutation(key, n) if shuffle else np.arange(n, dtype=_I64)
        sizes = np.array([int(c.sum()) + self.sep * len(c) for c in self.counts], dtype=_I64)
        self._starts = np.zeros(n + 1, dtype=_I64)  # cumulative shard sizes in epoch order
        np.cumsum(sizes[self.order], out=self._starts[1:])
        self._doc_starts: dict[int, np.ndarray] = {}

    @property
    def total(self) -> int:
        """Tokens in the epoch's stream (documents plus separators)."""
        return int(self._starts[-1])

    def count(self, shard: int, doc: int) -> int:
        """Tokens of document ``doc`` of global shard ``shard`` (what the index declared)."""
        return int(self.counts[shard - self.offset][doc])

    def _docs(self, shard: int) -> np.ndarray:
        """Cumulative document sizes (with separators) of ``shard``: ``len + 1`` offsets from 0."""
        starts = self._doc_starts.get(shard)
        if starts is None:
            counts = self.counts[shard]
            starts = np.zeros(len(counts) + 1, dtype=_I64)
            np.cumsum(counts + self.sep, out=starts[1:])
            self._doc_starts[shard] = starts
        return starts

    def pieces(self, start: int, end: int) -> Iterator[Piece]:
        """The document slices covering stream offsets ``[start, end)`` (clipped to :attr:`total`), in order."""
        t, end = max(0, start), min(end, self.total)
        pos = int(np.searchsorted(self._starts, t, side="right")) - 1
        while t < end:
            shard = int(self.order[pos])
            base = int(self._starts[pos])
            docs = self._docs(shard)
            d = int(np.searchsorted(docs, t - base, side="right")) - 1
            while t < end and d < len(docs) - 1:
                lo, hi = base + int(docs[d]), base + int(docs[d + 1])
                if hi > t:  # an empty document (no tokens, no separator) covers nothing
                    stop = min(hi, end)
                    yield Piece(self.offset + shard, d, t - lo, stop - lo)
                    t = stop
                d += 1
            pos += 1
