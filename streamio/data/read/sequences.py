"""A worker's packed batches -> fixed-length token sequences, read through the window reader.

:class:`TokenPacker` is the read half of token packing (the plan is
:mod:`streamio.data.plan.packing`). Each batch of a worker is one contiguous range of the epoch's
token stream; its documents become one window of runs (consecutive documents of a shard: one
ranged read), read, verified and cached by :class:`~streamio.data.read.reader.WindowReader` like
any sample. Each document's member is decoded as ``.npy`` (``allow_pickle=False``) and checked
against the token count the index declared; its slice is copied into the batch's token buffer,
which is cut into sequences.

A document that continues from one of the worker's batches into its next (a long document, or
``num_workers=0``) is read once: the last document of a batch is kept and its next piece taken from
it. Everything yielded is a new array (nothing aliases the kept document or the read buffers).

Each sequence is a sample ``{"tokens", "doc_ids", "positions"}``: ``tokens`` (int64, ``Pack.width``
long; the pad token after the stream's end), ``doc_ids`` (int32: 0 for the sequence's first
document, 1 for the next, ..., -1 for padding) and ``positions`` (int32: each token's offset in its
document, the separator counting as the one after its last token; 0 for padding). Intra-document
attention is ``doc_ids[:, None] == doc_ids[None, :]`` (and causal); position ids restart per
document with ``positions``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import numpy as np

from streamio.data.format.tokens import check_document, load_tokens
from streamio.data.plan import Run, Window
from streamio.data.plan.packing import PackPlan, PackStream, SeqRange, SeqRanges
from streamio.data.plan.tokenmix import BatchLayout, Segment
from streamio.data.plan.tokens import Piece
from streamio.data.read.reader import WindowReader
from streamio.errors import ShardFormatError

__all__ = ["GROUP_BATCHES", "GROUP_TOKENS", "TokenPacker"]

_I64 = np.int64
#: Tokens of the batches whose reads are scheduled together (long reads run across a group's batches).
GROUP_TOKENS = 1 << 24
#: Most batches whose reads are scheduled together (however short their sequences).
GROUP_BATCHES = 4096


def _runs(segments: list[Segment], reuse: set[tuple[int, int]]) -> tuple[Run, ...]:
    """The documents of ``segments`` to read, as runs (those in ``reuse``, kept from the batch before, are not)."""
    out: list[Run] = []
    for p in (p for seg in segments for p in seg.pieces):
        if (p.shard, p.doc) in reuse:
            continue
        if out and out[-1].shard == p.shard and out[-1].end == p.doc:
            out[-1] = Run(p.shard, out[-1].first, p.doc + 1)
        else:
            out.append(Run(p.shard, p.doc, p.doc + 1))
    return tuple(out)


def _last_docs(segments: list[Segment]) -> set[tuple[int, int]]:
    return {(seg.pieces[-1].shard, seg.pieces[-1].doc) for seg in segments if seg.pieces}


def _skip(batches: SeqRanges, skip: int) -> Iterator[SeqRange]:
    """``batches`` without their first ``skip`` sequences (a worker resuming inside its stream).

    Every batch but a stream's last is full, so whole batches are skipped by arithmetic: a
    worker resuming late in a long epoch does not walk the batches it read.
    """
    whole = min(skip // batches.plan.topology.batch_size, max(len(batches) - 1, 0))
    skip -= whole * batches.plan.topology.batch_size
    for b in batches[whole:]:
        if skip >= b.count:
            skip -= b.count
            continue
        yield SeqRange(b.first + skip, b.count - skip)
        skip = 0


def _groups(batches: Iterator[SeqRange], tokens_per_sequence: int) -> Iterator[list[SeqRange]]:
    """``batches`` in groups of about :data:`GROUP_TOKENS` tokens (from one batch to :data:`GROUP_BATCHES`)."""
    group: list[SeqRange] = []
    tokens = 0
    for b in batches:
        group.append(b)
        tokens += b.count * tokens_per_sequence
        if tokens >= GROUP_TOKENS or len(group) >= GROUP_BATCHES:
            yield group
            group, tokens = [], 0
    if group:
        yield group


class TokenPacker:
    """Reads a :class:`~streamio.data.plan.packing.PackStream` and yields its sequences.

    Args:
        reader: the dataset's window reader (built with ``decode=None``: members arrive as bytes).
        member: the field holding each document's tokens (``Pack.member``).
    """

    def __init__(self, reader: WindowReader, member: str) -> None:
        self.reader, self.member = reader, member

    def read(self, plan: PackPlan, stream: PackStream, skip: int = 0) -> Iterator[dict[str, Any]]:
        """The sequences of ``stream`` in order, after its first ``skip``.

        The stream's batches are computed as they are reached, and read in groups of about
        :data:`GROUP_TOKENS` tokens: the reader schedules one group's windows at once (runs: a few
        per batch). Each batch's layout (a piece per document) is computed again when the batch
        is filled rather than kept, so memory grows neither with the batches nor with the
        documents a worker reads in an epoch.
        """
        reuse: set[tuple[int, int]] = set()
        kept: dict[tuple[int, int], np.ndarray] = {}
        for group in _groups(_skip(stream.batches, skip), plan.pack.width):
            windows = []
            for b in group:
                layout = plan.layout(b)
                runs = _runs(layout.segments, reuse)
                if runs:
                    windows.append(Window(runs, None))
                reuse = _last_docs(layout.segments)
            with closing(self.reader.read(windows)) as docs:
                for b in group:
                    layout = plan.layout(b)
                    filled = [self._fill(plan, seg, docs, kept) for seg in layout.segments]
                    kept = {k: v for k, v in kept.items() if k in _last_docs(layout.segments)}
                    yield from _sequences(plan, b, layout, filled)

    def _fill(
        self, plan: PackPlan, seg: Segment, docs: Iterator[Any], kept: dict[tuple[int, int], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One segment's tokens, document numbers and positions (padding after the stream's end)."""
        width = seg.count * plan.pack.seq_len + int(plan.pack.targets)
        buf = np.full(width, plan.pack.pad, dtype=_I64)
        ids = np.full(width, -1, dtype=np.int32)
        pos = np.zeros(width, dtype=np.int32)
        at = 0
        for n, p in enumerate(seg.pieces):
            doc = kept.get((p.shard, p.doc))
            if doc is None:
                doc = kept[(p.shard, p.doc)] = self._document(plan, p, next(docs))
            stop = min(p.end, len(doc))
            buf[at : at + max(0, stop - p.first)] = doc[p.first : stop]
            if p.end > len(doc):  # the separator
                buf[at + p.size - 1] = plan.pack.eos
            ids[at : at + p.size] = n
            pos[at : at + p.size] = np.arange(p.first, p.end, dtype=np.int32)
            at += p.size
        return buf, ids, pos

    def _document(self, plan: PackPlan, piece: Piece, sample: Any) -> np.ndarray:
        where = f"{sample.get('__url__', piece.shard)}"
        if sample.get("__index__") != piece.doc:  # pragma: no cover - the reader yields the runs asked for
            raise ShardFormatError(f"{where}: read sample {sample.get('__index__')} where {piece.doc} was planned")
        raw = sample.get(self.member)
        if raw is None:
            raise ShardFormatError(
                f"shard {where!r} sample {piece.doc} has no member {self.member!r} (it has "
                f"{sorted(k for k in sample if not k.startswith('__'))}); give Pack(member=...) its token field"
            )
        try:
            value = load_tokens(raw)
        except (ValueError, OSError, EOFError) as exc:
            raise ShardFormatError(
                f"shard {where!r} sample {piece.doc}: member {self.member!r} is not a .npy array: {exc}"
            ) from exc
        expected = plan.tokens.count(piece.shard, piece.doc)
        return check_document(value, expected=expected, shard=where, sample=piece.doc, member=self.member)


def _sequences(
    plan: PackPlan, b: SeqRange, layout: BatchLayout, filled: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> Iterator[dict[str, Any]]:
    length, width = plan.pack.seq_len, plan.pack.width
    for j, at in enumerate(layout.order):
        if at is None:  # past the epoch's last sequence: all padding
            tokens, doc_ids = np.full(width, plan.pack.pad, dtype=_I64), np.full(width, -1, dtype=np.int32)
            positions, source = np.zeros(width, dtype=np.int32), -1
        else:
            seg, k = at
            buf, ids, pos = filled[seg]
            window = slice(k * length, k * length + width)
            tokens, doc_ids, positions = buf[window].copy(), ids[window].copy(), pos[window].copy()
            doc_ids[doc_ids >= 0] -= doc_ids[0] if doc_ids[0] >= 0 else 0
            source = layout.segments[seg].source
        yield {
            "tokens": tokens,
            "doc_ids": doc_ids,
            "positions": positions,
            "__sequence__": b.first + j,
            "__source__": source,
        }
