"""A token count in ``index.json`` is a claim: it is bounded by the bytes that hold it, and what it
sizes (a packing plan, a worker's reads) is computed as it is reached, never materialised.

On 15d7008 one count of 2**40 tokens for a 44-byte document was accepted by the index and grew a
worker's packed read without bound (every batch of the epoch was listed, then every window).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamio
from streamio.data.dataset import StreamingDataset  # imported here: torch's import is not the budget
from streamio.data.format.index import parse_index
from streamio.data.plan import Topology
from streamio.data.plan.packing import Pack, plan_packing
from streamio.data.read.sequences import _skip
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import IndexFormatError, ShardFormatError
from streamio.limits import MAX_DOCUMENT_TOKENS
from support import hostile_corpus as hc

pytestmark = pytest.mark.timeout(120)

BUDGET = {"seconds": 8.0, "max_bytes": 32 << 20}


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def write_docs(url: str, lengths: list[int], **spec: Any) -> Path:
    samples = [{"__key__": f"d{i:04d}", "npy": npy(np.arange(n, dtype="<u2") % 60000)} for i, n in enumerate(lengths)]
    write_dataset(samples, url, spec=ShardSpec(max_count=2, **spec))
    return Path(url) / "index.json"


def edit(index: Path, change: Any) -> None:
    doc = json.loads(index.read_text())
    change(doc)
    index.write_text(json.dumps(doc))


def index_with(path: str, tokens: list[Any], **entry: Any) -> bytes:
    shard = {"path": path, "bytes": 4096, "samples": 2, "checksum": "crc32c:00000000", "tokens": {"npy": tokens}}
    shard.update(entry)
    return json.dumps({"format": "streamio.dataset/1", "samples": 2, "keys": [], "shards": [shard]}).encode()


INLINE = {"offsets": [0, 1024, 2048], "crc32c": [0, 0]}
SIDECAR = {"layout": "_layout/a.tar.bin", "layout_checksum": "crc32c:00000000"}


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        # the reported case: 2**40 tokens claimed for a sample of 1024 bytes
        (index_with("a.tar", [MAX_DOCUMENT_TOKENS, 3], **INLINE),
         r"shard 'a.tar' sample 0: token count 1099511627776 of 'npy' needs at least 2199023255552 bytes "
         r"\(2 a token\), but the sample spans 1024 bytes"),
        (index_with("a.tar", [3, 513], **INLINE), r"sample 1: token count 513 of 'npy' needs at least 1026 bytes"),
        # layouts in sidecars: the shard's size bounds the sum
        (index_with("a.tar", [1024, 1025], **SIDECAR),
         r"the token counts of 'npy' of shard 'a.tar' add up to 2049, which need at least 4098 bytes \(2 a token\), "
         r"but the shard holds 4096 bytes"),
        # .tar.zst: a sample decompresses to at most max_sample_bytes
        (index_with("a.tar.zst", [0, 5000], max_sample_bytes=8192, **INLINE),
         r"shard 'a.tar.zst' sample 1: token count 5000 of 'npy' needs at least 10000 bytes \(2 a token\), but the "
         r"sample decompresses to at most 8192 bytes"),
        (index_with("a.tar.zst", [MAX_DOCUMENT_TOKENS, 0], **SIDECAR),
         r"sample 0: token count 1099511627776 of 'npy' needs at least .* at most 1073741824 bytes"),
    ],
)
def test_a_count_more_than_its_bytes_hold_is_refused_naming_shard_sample_and_field(doc: bytes, match: str) -> None:
    _, error = hc.within(lambda: parse_index(doc, url="mem://ds/index.json"), **BUDGET)
    assert isinstance(error, IndexFormatError), repr(error)
    assert error is not None
    assert "mem://ds/index.json" in str(error)
    assert re.search(match, str(error)), str(error)


def test_counts_as_large_as_their_bytes_allow_are_accepted() -> None:
    index = parse_index(index_with("a.tar", [512, 512], **INLINE), url="mem://ds/index.json")
    assert index.token_counts("npy") == [(512, 512)]
    index = parse_index(index_with("a.tar", [2048, 0], **SIDECAR), url="mem://ds/index.json")
    assert index.token_counts("npy") == [(2048, 0)]


def test_the_reported_index_is_refused_when_the_dataset_opens(tmp_path: Path) -> None:
    """One document of 22 tokens (a 44-byte payload) claimed as 2**40: nothing is planned or read."""
    url = str(tmp_path / "tok")
    index = write_docs(url, [22, 5, 7])
    edit(index, lambda d: d["shards"][0]["tokens"]["npy"].__setitem__(0, MAX_DOCUMENT_TOKENS))
    _, error = hc.within(lambda: StreamingDataset(url, pack=streamio.Pack(16)), **BUDGET)
    assert isinstance(error, IndexFormatError), repr(error)
    assert "shard 'data-000000.tar' sample 0: token count 1099511627776 of 'npy' needs at least" in str(error)
    assert json.loads(index.read_text())["shards"][1]["tokens"]["npy"] == [7], "the index was changed"


def test_a_count_its_bytes_cannot_refute_stops_at_its_document_in_bounded_memory(tmp_path: Path, as_rank: Any) -> None:
    """A .tar.zst index that also claims a huge max_sample_bytes lets 2**40 tokens through the index
    check: the plan of 2**36 sequences is still never listed, and the read stops at the document."""
    url = str(tmp_path / "tok")
    index = write_docs(url, [22, 5, 7], compression="zstd")

    def claim(doc: dict[str, Any]) -> None:
        doc["shards"][0]["max_sample_bytes"] = 1 << 62
        doc["shards"][0]["tokens"]["npy"][1] = MAX_DOCUMENT_TOKENS

    edit(index, claim)
    as_rank(0, 1)
    ds = StreamingDataset(url, shuffle=False, pack=streamio.Pack(16), batch_size=4)
    assert len(ds) > 1 << 35  # (so list(ds) would allocate for its length hint; a loop reads)
    _, error = hc.within(lambda: [s for s in ds], **BUDGET)
    assert isinstance(error, ShardFormatError), repr(error)
    assert "data-000000.tar.zst' sample 1: member 'npy' holds 5 tokens, but the index says 1099511627776" in str(error)


def test_a_plan_of_a_trillion_sequences_is_not_materialised() -> None:
    counts = [np.full(1000, 1 << 30, dtype=np.int64) for _ in range(1000)]  # 2**30 * 10**6 tokens
    plan = plan_packing(counts, pack=Pack(1), seed=0, epoch=0, topology=Topology(3, 2, 1))

    def first_batches() -> Any:
        stream = plan.stream(2, 1)
        batches = stream.batches
        return stream.size, len(batches), batches[0], batches[-1], list(batches[:3]), next(iter(batches))

    got, error = hc.within(first_batches, **BUDGET)
    assert error is None, repr(error)
    total = 1000 * 1000 * (1 << 30)
    per_rank = -(-total // 3)
    mine = range(1, per_rank, 2)  # worker 1 of 2 reads batches 1, 3, 5, ... of one sequence each
    assert got[:2] == (len(mine), len(mine))
    assert got[2] == plan.batch(2, 1) and got[3] == plan.batch(2, mine[-1])
    assert got[4] == [plan.batch(2, 1), plan.batch(2, 3), plan.batch(2, 5)] and got[5] == plan.batch(2, 1)


@pytest.mark.parametrize(("world", "workers", "batch"), [(1, 1, 1), (3, 2, 4), (2, 3, 5), (4, 1, 7)])
def test_a_lazy_stream_holds_the_batches_a_listed_one_held(world: int, workers: int, batch: int) -> None:
    plan = plan_packing([np.array([5, 60, 7, 0, 33]), np.array([90, 1])], pack=Pack(4, eos=0), seed=3, epoch=1,
                        topology=Topology(world, workers, batch))
    for rank in range(world):
        for worker in range(workers):
            stream = plan.stream(rank, worker)
            listed = [plan.batch(rank, k) for k in range(worker, plan.batches, workers)]
            assert list(stream.batches) == listed
            assert stream.size == sum(b.count for b in listed)
            assert [stream.batches[i] for i in range(-len(listed), len(listed))] == listed + listed


def test_a_worker_reads_a_long_packed_epoch_without_listing_it(tmp_path: Path, as_rank: Any) -> None:
    """Four documents of 30,000 tokens, one token a sequence, one sequence a batch: 120,004 batches.
    The first sequences come before the epoch's batches are listed, and the memory stays small."""
    url = str(tmp_path / "long")
    write_docs(url, [30_000] * 4)
    as_rank(0, 1)
    ds = StreamingDataset(url, shuffle=False, pack=streamio.Pack(1, eos=0), batch_size=1)

    def first() -> list[int]:
        it = iter(ds)
        return [int(next(it)["tokens"][0]) for _ in range(5)]

    got, error = hc.within(first, seconds=8.0, max_bytes=24 << 20)
    assert error is None, repr(error)
    assert got == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("skip", [0, 1, 3, 4, 5, 9, 10**6])
def test_a_resuming_worker_skips_its_read_batches_by_arithmetic(skip: int) -> None:
    small = plan_packing([np.array([50, 7, 33])], pack=Pack(2), seed=0, epoch=0, topology=Topology(2, 2, 4))
    batches = small.stream(1, 0).batches
    walked, left = [], skip  # the definition: drop the first ``skip`` sequences one batch at a time
    for b in batches:
        take = min(left, b.count)
        left -= take
        if b.count > take:
            walked.append((b.first + take, b.count - take))
    assert [tuple(b) for b in _skip(batches, skip)] == walked
    huge = plan_packing([np.full(1000, 1 << 30, dtype=np.int64)], pack=Pack(1), seed=0, epoch=0, topology=Topology(1))
    got, error = hc.within(lambda: next(_skip(huge.stream(0, 0).batches, 10**11 + skip)), **BUDGET)
    assert error is None and got == (10**11 + skip, 1)


def test_a_count_more_than_its_sidecar_span_is_refused_when_the_layout_is_read(tmp_path: Path, as_rank: Any) -> None:
    """Layouts in sidecars: the index parse can bound only the shard's sum; the sample's own span
    bounds its count as soon as the reader loads the shard's layout, before its documents are read."""
    url = str(tmp_path / "tok")
    samples = [{"__key__": f"d{i}", "npy": npy(np.arange(n, dtype="<u2"))} for i, n in enumerate([3, 900])]
    write_dataset(samples, url, spec=ShardSpec(max_count=2), inline_limit=0)
    index = Path(url) / "index.json"
    edit(index, lambda d: d["shards"][0]["tokens"]["npy"].__setitem__(0, 800))  # sum 1700: within the shard
    as_rank(0, 1)
    ds = StreamingDataset(url, shuffle=False, pack=streamio.Pack(16))
    _, error = hc.within(lambda: [s for s in ds], **BUDGET)  # noqa: C416 - a loop: list() asks len() first
    assert isinstance(error, IndexFormatError), repr(error)
    assert "shard 'data-000000.tar' sample 0: token count 800 of 'npy' needs at least 1600 bytes (2 a token), but " \
           "the sample spans 1024 bytes" in str(error), str(error)
