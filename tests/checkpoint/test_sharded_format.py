"""Sharded checkpoints, single process: the format (chunks, block checksums), ranged verified reads, boxes.

The multi-process behaviour (FSDP2 on gloo, resharding, kills) is in test_checkpoint_sharded.py;
here are the pieces it rests on, each with its hostile inputs: a manifest's ``sharded`` section
and part blocks are checked when parsed, a ranged read is verified block by block and reads only
the blocks it needs, and a box copy puts every element where it belongs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streamio.checkpoint.admin.describe import describe
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.entries import ChunkEntry, FileEntry, Section, ShardedEntry
from streamio.checkpoint.format.layout import Placement
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.tensors.boxes import BoxSource, byte_span, narrow
from streamio.checkpoint.tensors.fetch import Span, fetch_spans, plan_reads
from streamio.checkpoint.tensors.resharding import plan_boxes
from streamio.checkpoint.tensors.serialize import StreamReader, block_checksums
from streamio.checksum import checksum_bytes
from streamio.errors import CheckpointFormatError, CorruptDataError
from streamio.storage import Store

BLOCK = 1024


def _part(path: str, rank: int, start: int, raw: bytes, *, block: int = BLOCK) -> FileEntry:
    blocks = block_checksums(np.frombuffer(raw, dtype=np.uint8), block) if block else ()
    return FileEntry(path, rank, start, len(raw), len(raw), checksum_bytes(raw), None, block, blocks)


def _sharded() -> dict[str, ShardedEntry]:
    # a [7, 3] float32 tensor saved by two ranks: rows 0-3 by rank 0, rows 4-6 by rank 1
    chunks = (ChunkEntry((0, 0), (4, 3), 0, 0, 48), ChunkEntry((4, 0), (3, 3), 1, 0, 36))
    layout = {"mesh": [2], "dims": ["dp"], "placements": ["Shard(dim=0)"]}
    return {"model/w": ShardedEntry("float32", (7, 3), chunks, layout)}


def _manifest(**changes: object) -> Manifest:
    files = (_part("rank-00000/part-abc-00000.bin", 0, 0, bytes(64)), _part("rank-00001/part-abc-00000.bin", 1, 0,
                                                                            bytes(64)))
    m = Manifest(step=3, save_id="abc", world_size=2, replicated=Section(tree={"model": {"$t": "dtensor",
                                                                                            "k": "model/w"}}),
                 per_rank=(Section(tree={}), Section(tree={})), files=files, sharded=_sharded())
    return dataclasses.replace(m, **changes)


def _doc(m: Manifest) -> dict:
    return json.loads(mf.manifest_to_bytes(m))


def _reparse(doc: dict) -> Manifest:
    from streamio.checkpoint.format import checks

    body = {k: v for k, v in doc.items() if k != checks.SEAL_KEY}
    return mf.manifest_from_bytes(checks.seal(json.dumps(body, separators=(",", ":")).encode()))


# ------------------------------------------------------------------------------------ format
def test_sharded_manifest_round_trips_as_format_3_and_plain_ones_stay_format_2() -> None:
    m = _manifest()
    data = mf.manifest_to_bytes(m)
    assert json.loads(data)["format"] == "streamio.checkpoint/3"
    back = mf.manifest_from_bytes(data)
    assert back.sharded == m.sharded and back.files == m.files
    plain = _manifest(sharded={}, files=tuple(dataclasses.replace(f, block_size=0, blocks=()) for f in m.files))
    doc = json.loads(mf.manifest_to_bytes(plain))
    assert doc["format"] == "streamio.checkpoint/2" and "sharded" not in doc
    assert all("blocks" not in f and "block_size" not in f for f in doc["files"])


@pytest.mark.parametrize(("edit", "detail"), [
    (lambda d: d["sharded"]["model/w"]["chunks"][1].update(offsets=[5, 0]), "reaches outside"),
    (lambda d: d["sharded"]["model/w"]["chunks"].pop(), "hold 12 elements"),
    (lambda d: d["sharded"]["model/w"]["chunks"][0].update(sizes=[4]), "dimensions"),
    (lambda d: d["sharded"]["model/w"].update(dtype="Float32"), "dtype"),
    (lambda d: d["sharded"]["model/w"].update(shape=[7, -3]), "shape"),
    (lambda d: d["sharded"]["model/w"]["chunks"][0].update(nbytes=4096), "is 48 bytes, but nbytes says 4096"),
    (lambda d: d["sharded"]["model/w"]["chunks"][0].update(offset=4096), "spans bytes"),
    (lambda d: d["sharded"]["model/w"]["chunks"][1].update(rank=5), "world size"),
    (lambda d: d["files"][0]["blocks"].append("crc32c:00000000"), "block checksums"),
    (lambda d: d["files"][0].update(blocks="crc32c:00000000"), "block checksums need"),
    (lambda d: d["files"][0].update(block_size=0), "block checksums need"),
    (lambda d: d["files"][0]["blocks"].__setitem__(0, "md5:x"), "crc32c"),
    (lambda d: d.update(sharded=[]), "'sharded' must be an object"),
])
def test_hostile_sharded_sections_and_blocks_are_refused_when_parsed(edit, detail: str) -> None:  # type: ignore[no-untyped-def]
    doc = _doc(_manifest())
    edit(doc)
    with pytest.raises(ManifestError, match=detail):
        _reparse(doc)


def test_merging_markers_checks_the_chunks_cover_each_tensor() -> None:
    from streamio.checkpoint.format.manifest import DoneMarker

    e = _sharded()["model/w"]
    first = DoneMarker(0, "abc", (), {}, Section(None), {}, {"model/w": dataclasses.replace(e, chunks=e.chunks[:1])})
    second = DoneMarker(1, "abc", (), {}, Section(None), None, {"model/w": dataclasses.replace(e, chunks=e.chunks[1:])})
    m = mf.build_manifest(3, [first, second], metrics={}, software={}, created="")
    assert m.sharded["model/w"].chunks == e.chunks
    with pytest.raises(ManifestError, match="hold 12 elements"):
        mf.build_manifest(3, [first, dataclasses.replace(second, sharded={})], metrics={}, software={}, created="")
    other = dataclasses.replace(e, shape=(8, 3), chunks=e.chunks[1:])
    with pytest.raises(ManifestError, match="different models"):
        mf.build_manifest(3, [first, dataclasses.replace(second, sharded={"model/w": other})], metrics={},
                          software={}, created="")


def test_inspect_shows_global_shape_and_the_sharding_saved_with() -> None:
    shown = describe(_manifest(), path="step-000000003", place="current", bad=None, retention=None)
    row = next(t for t in shown["tensors"] if t["key"] == "model/w")
    assert row["shape"] == [7, 3] and row["dtype"] == "float32" and row["nbytes"] == 84
    assert row["sharding"] == "Shard(dim=0) over mesh [2] (dp), 2 chunks"
    assert [(c["rank"], c["offsets"], c["sizes"]) for c in row["chunks"]] == [(0, [0, 0], [4, 3]), (1, [4, 0], [3, 3])]
    assert shown["state"] == {}  # the sharded tensor is listed, not shown as state


# ------------------------------------------------------------------------------------ ranged reads
def test_plan_reads_widens_to_blocks_merges_and_reads_blockless_parts_whole() -> None:
    a = _part("rank-00000/p0", 0, 0, bytes(4000))
    b = _part("rank-00000/p1", 0, 4000, bytes(3000), block=0)
    reads = plan_reads([a, b], [Span(0, 10, 20), Span(0, 2100, 2200), Span(0, 3990, 4010)])
    got = sorted((r.file.path, r.start, r.end, r.whole) for r in reads)
    assert got == [("rank-00000/p0", 0, 1024, False), ("rank-00000/p0", 2048, 4000, False),
                   ("rank-00000/p1", 0, 3000, True)]
    whole = plan_reads([a], [Span(0, 10, 20), Span(0, 1500, 3500)])  # adjacent blocks merge: one GET
    assert [(r.start, r.end, r.whole) for r in whole] == [(0, 4000, True)]
    with pytest.raises(CorruptDataError, match="not in the parts"):
        plan_reads([a], [Span(0, 3990, 4010)])
    with pytest.raises(CorruptDataError, match="not in the parts"):
        plan_reads([b], [Span(0, 10, 20)])  # a gap before the first part


def test_fetch_spans_verifies_blocks_and_reads_only_the_blocks_needed(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    raw = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    part = _part("rank-00000/part-x-00000.bin", 0, 0, raw)
    store.put(f"s/{part.path}", raw)
    pieces = fetch_spans(store, [part], [Span(0, 2100, 2200), Span(0, 9000, 9100)],
                         place=Placement("s"))
    assert sorted((start, len(b)) for start, b in pieces[0].items()) == [(2048, 1024), (8192, 1024)]
    seg = StreamReader(pieces[0], 0, "s").segments(2100, 100)
    assert b"".join(bytes(s) for s in seg) == raw[2100:2200]
    # a flipped byte outside the blocks needed is never read; inside them it is caught
    path = tmp_path / "s" / part.path
    damaged = bytearray(raw)
    damaged[5000] ^= 0xFF
    path.write_bytes(bytes(damaged))
    fetch_spans(store, [part], [Span(0, 2100, 2200)], place=Placement("s"))
    with pytest.raises(CorruptDataError, match="block 4 .* the object is corrupt"):
        fetch_spans(store, [part], [Span(0, 4500, 4600)], place=Placement("s"))


# ------------------------------------------------------------------------------------ boxes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_box_copies_put_every_element_in_place(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    chunk = (torch.randn(5, 6, 7, generator=gen) * 10).to(dtype)
    raw = np.frombuffer(chunk.contiguous().view(-1).view(torch.uint8).numpy().tobytes(), dtype=np.uint8)
    offsets, lengths = (1, 2, 3), (3, 2, 4)
    a, b = byte_span(chunk.shape, offsets, lengths, chunk.element_size())
    dest = torch.zeros(4, 9, 8, dtype=dtype)
    target = narrow(dest, (0, 5, 1), lengths)  # non-contiguous: rows contiguous, planes strided
    BoxSource(dtype, lengths, tuple(chunk.shape), [raw[a:b]]).copy_into(target)
    assert torch.equal(target, narrow(chunk, offsets, lengths))
    assert int(dest.ne(0).sum()) <= target.numel()  # nothing outside the box was written
    converted = torch.zeros(lengths, dtype=torch.float64)
    BoxSource(dtype, lengths, tuple(chunk.shape), [raw[a : a + 100], raw[a + 100 : b]]).copy_into(converted)
    assert torch.equal(converted, narrow(chunk, offsets, lengths).to(torch.float64))


def test_scalar_box_copy() -> None:
    raw = np.frombuffer(torch.tensor(2.5).reshape(1).view(torch.uint8).numpy().tobytes(), dtype=np.uint8)
    target = torch.zeros(())
    BoxSource(torch.float32, (), (), [raw]).copy_into(target)
    assert target.item() == 2.5


def test_plan_boxes_refuses_chunks_that_overlap_or_lie_about_their_bytes() -> None:
    e = _sharded()["model/w"]
    overlapping = dataclasses.replace(e, chunks=(ChunkEntry((0, 0), (4, 3), 0, 0, 48),
                                                 ChunkEntry((3, 0), (3, 3), 1, 0, 36)))
    with pytest.raises(CheckpointFormatError, match="overlap"):
        plan_boxes("model/w", overlapping, torch.zeros(7, 3))
    lying = dataclasses.replace(e, chunks=(e.chunks[0], dataclasses.replace(e.chunks[1], nbytes=40)))
    with pytest.raises(CheckpointFormatError, match="is 40 bytes"):
        plan_boxes("model/w", lying, torch.zeros(7, 3))
    reads = plan_boxes("model/w", e, torch.zeros(7, 3))
    assert [(r.span.rank, r.span.start, r.span.end) for r in reads] == [(0, 0, 48), (1, 0, 36)]


@pytest.mark.parametrize(("edit", "detail"), [
    (lambda d: d["sharded"].update({"model/w": 3}), "must be an object"),
    (lambda d: d["sharded"]["model/w"]["chunks"].__setitem__(0, "x"), "chunk 0: must be an object"),
    (lambda d: d["sharded"]["model/w"].update(chunks="x"), "'chunks' must be a list"),
    (lambda d: d["sharded"]["model/w"].update(layout=[]), "'layout' must be an object"),
])
def test_malformed_sharded_entries_are_refused(edit, detail: str) -> None:  # type: ignore[no-untyped-def]
    doc = _doc(_manifest())
    edit(doc)
    with pytest.raises(ManifestError, match=detail):
        _reparse(doc)


def test_tree_references_to_sharded_tensors_are_checked() -> None:
    from streamio.checkpoint.tensors.resharding import sources_for
    from streamio.checkpoint.tensors.tree import decode_tree

    with pytest.raises(CheckpointFormatError, match="sharded tensor 'x' which the manifest does not list"):
        decode_tree({"$t": "dtensor", "k": "x"}, {})
    sources, pending = sources_for(_sharded())
    with pytest.raises(CheckpointFormatError, match="saved it sharded"):
        decode_tree({"$t": "tensor", "k": "model/w"}, sources)
    live = torch.zeros(7, 3)
    assert decode_tree({"$t": "dtensor", "k": "model/w"}, sources, live) is live
    other = decode_tree({"$t": "dtensor", "k": "model/w"}, sources, torch.zeros(8, 3))
    assert other.device.type == "meta" and other.shape == (7, 3)  # reported by the mismatch check, never read
    fresh = decode_tree({"$t": "dtensor", "k": "model/w"}, sources, None)
    assert fresh.shape == (7, 3) and [p.target for p in pending] == [live, fresh]


def test_block_size_has_a_floor() -> None:
    from streamio.checkpoint import SaveOptions

    with pytest.raises(ValueError, match="block_size must be at least 1024"):
        SaveOptions(block_size=512)
