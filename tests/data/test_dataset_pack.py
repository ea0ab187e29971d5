"""StreamingDataset(pack=Pack(...)): token documents packed into sequences at read time, resumed exactly.

Documents hold unique token ids (document ``i``'s tokens are ``i * 1000 + 1 ...``), so every check
is on the tokens themselves: each document token exactly once per epoch across ranks and
workers, every separator once, the sequences in order concatenating to the epoch's stream, and a
resume on another world size and worker count continuing at the exact next token.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import streamio
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import DatasetError, PlanError, ShardFormatError
from streamio.testing import S3Endpoint
from support.loaders import take_batches

pytestmark = pytest.mark.timeout(120)

EOS = 0
LENGTHS = [0, 5, 37, 1, 90, 12, 64, 3, 150, 8, 22, 41, 7, 70, 2, 33, 19, 55]


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def documents() -> list[np.ndarray]:
    dtypes = ["<u2", "<u4", "<i4"]
    return [np.arange(i * 1000 + 1, i * 1000 + 1 + n).astype(dtypes[i % 3]) for i, n in enumerate(LENGTHS)]


def write_tokens(url: str, storage_options: dict[str, Any] | None = None) -> None:
    samples = [{"__key__": f"doc{i:04d}", "npy": npy(d), "txt": "meta"} for i, d in enumerate(documents())]
    write_dataset(samples, url, storage_options, spec=ShardSpec(max_count=4))


def collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


def plain(batches: list[list[dict[str, Any]]]) -> list[list[tuple[int, list[int]]]]:
    return [[(s["__sequence__"], s["tokens"].tolist()) for s in b] for b in batches]


def read(url: str, *, workers: int, state: Any = None, stop_after: int | None = None, **kw: Any) -> tuple[list, Any]:
    ds = streamio.StreamingDataset(url, batch_size=3, seed=4, pack=streamio.Pack(16, eos=EOS), **kw)
    return take_batches(streamio.StreamingDataLoader(ds, num_workers=workers, collate_fn=collate), state, stop_after)


def check_exactly_once(sequences: list[dict[str, Any]]) -> None:
    """Every document token once, every document's separator once, padding only after the stream's end."""
    sequences = sorted(sequences, key=lambda s: s["__sequence__"])
    assert [s["__sequence__"] for s in sequences] == list(range(len(sequences))), "a sequence was lost or repeated"
    tokens = np.concatenate([s["tokens"] for s in sequences])
    doc_ids = np.concatenate([s["doc_ids"] for s in sequences])
    real = tokens[doc_ids >= 0]
    expected = np.concatenate([np.append(d.astype(np.int64), EOS) for d in documents()])
    assert sorted(real.tolist()) == sorted(expected.tolist())
    assert (doc_ids[len(real) :] == -1).all() and len(tokens) - len(real) < 16 * 3


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (3, 0)])
def test_every_token_once_per_epoch_and_equal_batches(tmp_path: Path, as_rank: Any, world: int, workers: int) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    seen, counts = [], set()
    for rank in range(world):
        as_rank(rank, world)
        batches, _ = read(url, workers=workers)
        counts.add(tuple(len(b) for b in batches))
        seen += [s for b in batches for s in b]
    assert len(counts) == 1, f"ranks got different batches: {counts}"
    check_exactly_once(seen)
    first = min(seen, key=lambda s: s["__sequence__"])
    assert first["tokens"].dtype == np.int64 and len(first["tokens"]) == 16


def test_doc_ids_and_positions_describe_each_documents_part(tmp_path: Path, as_rank: Any) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    as_rank(0, 1)
    seqs = list(streamio.StreamingDataset(url, seed=4, shuffle=False, pack=streamio.Pack(16, eos=EOS)))
    # index order: doc 0 is empty (its separator alone), then doc 1 (5 tokens + separator), then doc 2...
    assert seqs[0]["tokens"].tolist() == [0, 1001, 1002, 1003, 1004, 1005, 0, *range(2001, 2010)]
    assert seqs[0]["doc_ids"].tolist() == [0, 1, 1, 1, 1, 1, 1] + [2] * 9
    assert seqs[0]["positions"].tolist() == [0, 0, 1, 2, 3, 4, 5, *range(9)]
    assert seqs[1]["doc_ids"][0] == 0 and seqs[1]["positions"][0] == 9  # doc 2 continues mid-document


def test_targets_give_one_more_token_overlapping_the_next_sequence(tmp_path: Path, as_rank: Any) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    as_rank(0, 1)
    seqs = list(streamio.StreamingDataset(url, shuffle=False, pack=streamio.Pack(16, eos=EOS, targets=True)))
    assert all(len(s["tokens"]) == 17 for s in seqs)
    assert all(a["tokens"][-1] == b["tokens"][0] for a, b in zip(seqs, seqs[1:], strict=False))


@pytest.mark.slow
def test_over_s3_with_workers_resume_on_another_topology_at_the_exact_next_token(s3: S3Endpoint, as_rank: Any) -> None:
    url, opts = s3.url("tok"), s3.storage_options()
    write_tokens(url, opts)
    full = []
    for rank in range(2):
        as_rank(rank, 2)
        batches, _ = read(url, workers=2, storage_options=opts)
        full.append(batches)
    head, states = [], []
    for rank in range(2):
        as_rank(rank, 2)
        batches, state = read(url, workers=2, stop_after=2, storage_options=opts)
        assert plain(batches) == plain(full[rank][:2])
        head += [s for b in batches for s in b]
        states.append(state)
    assert states[0] == states[1], "DDP ranks consume in lockstep: one state for all"
    assert len(json.dumps(states[0])) < 1000
    rest = []
    for rank in range(3):
        as_rank(rank, 3)
        batches, _ = read(url, workers=1, state=states[0], storage_options=opts)
        rest += [s for b in batches for s in b]
    assert max(s["__sequence__"] for s in head) + 1 == min(s["__sequence__"] for s in rest), "not the next token"
    check_exactly_once(head + rest)
    # the same topology resumes into the uninterrupted run's rest, batch for batch
    as_rank(1, 2)
    again, _ = read(url, workers=2, state=states[1], storage_options=opts)
    assert plain(again) == plain(full[1][2:])


def test_an_index_without_token_counts_says_how_to_get_them(tmp_path: Path) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    doc = json.loads((tmp_path / "tok" / "index.json").read_text())
    for shard in doc["shards"]:
        shard.pop("tokens")
    (tmp_path / "tok" / "index.json").write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match=r"records no token counts for member 'npy'.*streamio shard"):
        streamio.StreamingDataset(url, pack=streamio.Pack(16))


def test_a_document_longer_than_its_index_count_is_named(tmp_path: Path, as_rank: Any) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    doc = json.loads((tmp_path / "tok" / "index.json").read_text())
    doc["shards"][1]["tokens"]["npy"][2] -= 1
    (tmp_path / "tok" / "index.json").write_text(json.dumps(doc))
    as_rank(0, 1)
    with pytest.raises(
        ShardFormatError, match=r"data-000001.tar' sample 2: member 'npy' holds 64 tokens, but the index"
    ):
        list(streamio.StreamingDataset(url, shuffle=False, pack=streamio.Pack(16)))


def test_a_mixture_shares_tokens_and_resumes_on_another_topology(tmp_path: Path, as_rank: Any) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_tokens(a)
    write_tokens(b)
    mixture = [streamio.Stream(a, weight=3), streamio.Stream(b, weight=1)]

    def run(world: int, **kw: Any) -> tuple[list[dict[str, Any]], Any]:
        out, state = [], None
        for rank in range(world):
            as_rank(rank, world)
            batches, state = read(mixture, workers=0, **kw)  # type: ignore[arg-type]
            out += [s for b in batches for s in b]
        return out, state

    whole, _ = run(2)
    per_cycle = -(-(sum(LENGTHS) + len(LENGTHS)) // 16)  # sequences of one pass over a source
    described = repr(streamio.StreamingDataset(mixture, pack=streamio.Pack(16, eos=EOS)))
    assert f"/a': {per_cycle * 3 // 2}, " in described and f"/b': {per_cycle // 2}}}" in described
    sources = [s["__source__"] for s in sorted(whole, key=lambda s: s["__sequence__"])]
    assert (sources.count(0), sources.count(1)) == (per_cycle * 3 // 2, per_cycle // 2)  # 3:1 of 2 passes' worth
    assert all(2 <= sources[i : i + 8].count(0) <= 8 for i in range(0, len(sources) - 8))  # every window keeps it
    head, state = run(2, stop_after=3)
    rest, _ = run(3, state=state)
    resumed = [s for s in head + rest if s["__source__"] >= 0]  # 3 ranks pad the epoch with one sequence
    assert len(head + rest) - len(resumed) < 3
    assert sorted(s["__sequence__"] for s in resumed) == sorted(s["__sequence__"] for s in whole)
    by_number = {s["__sequence__"]: s["tokens"].tolist() for s in whole}
    assert all(by_number[s["__sequence__"]] == s["tokens"].tolist() for s in resumed)


def test_a_wrong_pack_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    with pytest.raises(PlanError, match="pack=16 must be a streamio.Pack"):
        streamio.StreamingDataset(url, pack=16)  # type: ignore[arg-type]


@pytest.mark.slow
def test_workers_hand_packed_batches_over_the_ring_as_the_same_tensors(tmp_path: Path, as_rank: Any) -> None:
    url = str(tmp_path / "tok")
    write_tokens(url)
    as_rank(0, 1)

    def batches(workers: int) -> list[dict[str, Any]]:
        ds = streamio.StreamingDataset(url, batch_size=3, seed=4, pack=streamio.Pack(16, eos=EOS))
        return list(streamio.StreamingDataLoader(ds, num_workers=workers))

    alone, forked = batches(0), batches(2)
    assert len(alone) == len(forked)
    for a, b in zip(alone, forked, strict=True):
        assert a.keys() == b.keys() and a["__sequence__"] == b["__sequence__"]
        for key in ("tokens", "doc_ids", "positions"):
            assert b[key].dtype == a[key].dtype and torch.equal(a[key], b[key])
            # through the loader's ring, not one shared-memory segment (and descriptor) per tensor
            assert not b[key].is_shared()
