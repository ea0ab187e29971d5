"""Batched verified reads (``iter_sample_batches``) hand out exactly what reading each sample alone gives.

The read path takes a shard's samples in batches (issue 39); the contract is that batching changes
nothing a consumer can see: the same samples, the same error at the same sample with the same
message, the same handler calls in the same order relative to the samples, and a failing byte
stream raises only after every sample before the failure was handed out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checksum import crc32c
from streamio.data.format.layout import SampleLayout
from streamio.data.format.plain import BATCH_BYTES
from streamio.data.format.samples import SampleSpan, iter_sample_batches, iter_samples
from streamio.data.format.tar import encode_sample
from streamio.errors import CorruptDataError

URL = "mem://batches.tar"

# a sample: its members; "long" names take a GNU long-name record (the full parser's path)
_member_names = st.sampled_from(["bin", "cls", "txt", "x" * 120, "json"])
_samples = st.lists(
    st.tuples(
        st.lists(_member_names, min_size=1, max_size=3, unique=True),
        st.integers(0, 12_000),
    ),
    min_size=1,
    max_size=14,
)


class LinkDown(OSError):
    """The byte stream failed (a reset connection)."""


def build(spec: list[tuple[list[str], int]]) -> tuple[bytes, SampleLayout]:
    """A shard of samples ``k{i}`` with the given fields, and its layout."""
    pieces = []
    for i, (fields, size) in enumerate(spec):
        members = [(f"k{i}.{ext}", bytes([i + 1]) * (size if j == 0 else 3)) for j, ext in enumerate(fields)]
        pieces.append(b"".join(encode_sample(members)))
    offsets = [0]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    return b"".join(pieces) + bytes(1024), SampleLayout(tuple(offsets), tuple(crc32c(p) for p in pieces))


def stream(data: bytes, cuts: list[int], fail_after: int | None) -> Iterator[bytes]:
    """``data`` in pieces ending at ``cuts``; raises :class:`LinkDown` after ``fail_after`` bytes."""
    pos = 0
    for end in sorted({c for c in cuts if 0 < c < len(data)}) + [len(data)]:
        if fail_after is not None and end > fail_after:
            if fail_after > pos:
                yield data[pos:fail_after]
            raise LinkDown("link down")
        yield data[pos:end]
        pos = end


def consume(batches: Iterator[list[dict[str, Any]]], events: list[tuple[str, str]]) -> None:
    """Log every sample handed out and the error that ends the stream, in the order they happen."""
    try:
        for batch in batches:
            assert batch, "an empty batch"
            events.extend(("sample", repr(sorted(s.items()))) for s in batch)
    except Exception as exc:  # noqa: BLE001 - the error is the observation
        events.append(("error", f"{type(exc).__name__}: {exc}"))


def logging_handler(events: list[tuple[str, str]], verdict: bool | None) -> Callable[[Exception], bool] | None:
    if verdict is None:
        return None

    def handler(exc: Exception) -> bool:
        events.append(("handler", f"{type(exc).__name__}: {exc}"))
        return verdict

    return handler


def one_at_a_time(
    data: bytes, layout: SampleLayout, first: int, delivered: int, verdict: bool | None
) -> list[tuple[str, str]]:
    """The reference: each sample read on its own from its own bytes (or what of them arrived)."""
    events: list[tuple[str, str]] = []
    handler = logging_handler(events, verdict)
    for i in range(first, len(layout.offsets) - 1):
        begin, end = layout.offsets[i], layout.offsets[i + 1]
        if end > delivered and delivered < len(data):  # the stream failed inside this sample
            events.append(("error", "LinkDown: link down"))
            return events
        before = len(events)
        one = iter_samples([data[begin:min(end, delivered)]], url=URL, span=SampleSpan(begin, i, 1), layout=layout,
                           handler=handler)
        consume(iter([s] for s in one), events)
        if end > len(data) or any(kind == "error" for kind, _ in events[before:]):
            return events  # a truncation ends the shard, skipped or not
    return events


@settings(max_examples=120, deadline=None)
@given(
    spec=_samples,
    data=st.data(),
    verdict=st.sampled_from([None, True, False]),
)
def test_batches_hand_out_what_each_sample_alone_gives(
    spec: list[tuple[list[str], int]], data: st.DataObject, verdict: bool | None
) -> None:
    shard, layout = build(spec)
    raw = bytearray(shard)
    n = len(spec)
    for _ in range(data.draw(st.integers(0, 2), label="flips")):  # corrupt bytes inside the samples
        raw[data.draw(st.integers(0, layout.offsets[-1] - 1), label="at")] ^= 0x40
    shard = bytes(raw)
    if data.draw(st.booleans(), label="truncated"):
        shard = shard[: data.draw(st.integers(0, layout.offsets[-1] - 1), label="cut")]
    fail_after = data.draw(st.one_of(st.none(), st.integers(0, len(shard))), label="fail_after")
    cuts = data.draw(st.lists(st.integers(1, max(1, len(shard) - 1)), max_size=6), label="cuts")
    first = data.draw(st.integers(0, n - 1), label="first")
    begin = layout.offsets[first]
    delivered = len(shard) if fail_after is None else fail_after + begin

    events: list[tuple[str, str]] = []
    handler = logging_handler(events, verdict)
    batches = iter_sample_batches(stream(shard[begin:], [c - begin for c in cuts], fail_after), url=URL,
                                  span=SampleSpan(begin, first), layout=layout, handler=handler)
    consume(batches, events)
    assert events == one_at_a_time(shard, layout, first, min(delivered, len(shard)), verdict)


def test_a_failing_stream_hands_out_the_samples_before_it_first() -> None:
    shard, layout = build([(["bin", "cls"], 1000)] * 6)
    fail_after = layout.offsets[4] + 100  # inside sample 4, after samples 0-3 arrived in one piece
    events: list[tuple[str, str]] = []
    consume(iter_sample_batches(stream(shard, [], fail_after), url=URL, span=SampleSpan(), layout=layout), events)
    assert [kind for kind, _ in events] == ["sample"] * 4 + ["error"] and events[-1][1] == "LinkDown: link down"


def test_a_corrupt_sample_in_a_batch_raises_after_the_ones_before_it() -> None:
    shard, layout = build([(["bin"], 2000)] * 5)
    raw = bytearray(shard)
    raw[layout.offsets[3] + 700] ^= 1
    got: list[str] = []
    with pytest.raises(CorruptDataError, match=r"sample 3 \(bytes 7680\.\.10240\) fails its CRC32C check"):
        for batch in iter_sample_batches([bytes(raw)], url=URL, span=SampleSpan(), layout=layout):
            got += [s["__key__"] for s in batch]
    assert got == ["k0", "k1", "k2"]


def test_a_batch_holds_at_most_batch_bytes_or_one_sample() -> None:
    """Memory is one batch: at most BATCH_BYTES of samples, or one larger sample."""
    shard, layout = build([(["bin"], 5000)] * 40 + [(["bin"], 100_000)] * 3 + [(["bin"], 10)] * 5)
    sizes = [layout.offsets[i + 1] - layout.offsets[i] for i in range(48)]
    batches = list(iter_sample_batches([shard], url=URL, span=SampleSpan(), layout=layout))
    assert [s["__key__"] for b in batches for s in b] == [f"k{i}" for i in range(48)]
    per_batch = BATCH_BYTES // sizes[0]
    assert [len(b) for b in batches] == [per_batch] * (40 // per_batch) + [40 % per_batch, 1, 1, 1, 5]
