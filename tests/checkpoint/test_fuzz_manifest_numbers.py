"""Every number a checkpoint document declares is range-checked when it is parsed (issue 23, item 12).

The numeric fields of a manifest (plain and sharded), a done marker, ``latest.json`` and DCP's
planner data are rewritten to huge, negative, float and bool values (one to three at a time, the
document re-sealed as a careful forger would). Parsing must raise a
:class:`~streamio.errors.CheckpointFormatError` (nothing else), or return a document whose every
number is an integer in ``[0, 2**63)`` and usable as it says: each tensor's shape times its
item size is its ``nbytes`` and makes a tensor (on the ``meta`` device: no allocation), parts end
below ``2**63``, no two tensors share a byte of a stream, a sharded tensor's global shape holds
less than ``2**63`` bytes and DCP's metadata builds from it. A value that parses and fails later,
on use, is what this guards against (``10**30`` in a shape used to restore and fail there).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from hypothesis import example, given
from hypothesis import strategies as st
from test_fuzz_manifest import FUZZ, MANIFEST, MARKER, POINTER, _parse_within_budget, _places

from streamio.checkpoint.dcp.metadata import MAX_LIST_INDEX, metadata_of
from streamio.checkpoint.format import checks, layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.format.entries import DTYPE_SIZES, ChunkEntry, FileEntry, Section, ShardedEntry, TensorEntry
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.tensors.tree import TAG, decode_tree, dtype_from_name
from streamio.errors import CheckpointFormatError

BLOCK = 16


def _sharded_manifest() -> Manifest:
    """Format 3, as StreamioWriter writes it: two ranks' chunks of one tensor, a plain tensor, planner data."""
    w = ShardedEntry("float32", (4, 3), (ChunkEntry((0, 0), (2, 3), 0, 0, 24), ChunkEntry((2, 0), (2, 3), 1, 0, 24)))
    b = ShardedEntry("bfloat16", (5,), (ChunkEntry((0,), (5,), 0, 64, 10),))
    blocks = ("crc32c:00000001",) * 8
    files = (FileEntry("rank-00000/part-abc-00000.bin", 0, 0, 128, 128, "crc32c:0000000a", None, BLOCK, blocks),
             FileEntry("rank-00001/part-abc-00000.bin", 1, 0, 64, 64, "crc32c:0000000b", None, BLOCK, blocks[:4]))
    planner = {"model.w": ["model", "w"], "model.b": ["model", "b"], "extra.1": ["extra", 1]}
    return Manifest(
        step=3, save_id="abc", world_size=2, files=files, sharded={"model.w": w, "model.b": b},
        replicated=Section({"dcp": {"planner_data": planner}}),
        per_rank=(Section({"progress.step": 3}, {"extra.1": TensorEntry(0, 96, 8, "int64", (1,), "crc32c:00000003")}),
                  Section({})),
    )


SHARDED = mf.manifest_to_bytes(_sharded_manifest())
HOSTILE_NUMBERS = [-1, -(2**63), 2**63 - 1, 2**63, 2**64, 10**30, 1.5, 96.0, 1e300, -0.0, True, False, 0, 1]


def _get(doc: Any, place: tuple[Any, ...]) -> Any:
    for k in place:
        doc = doc[k]
    return doc


def _numeric_places(doc: Any) -> list[tuple[Any, ...]]:
    """Every number of the document outside free-form values (metrics, software, the state trees),
    and the list positions of DCP's planner data."""
    out = []
    for place in _places(doc):
        value = _get(doc, place)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or place[0] in ("metrics", "software"):
            continue
        if "tree" in place[:3] and place[:4] != ("replicated", "tree", "dcp", "planner_data"):
            continue
        out.append(place)
    return out


@st.composite
def renumbered(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` with one to three numeric fields rewritten, re-sealed (the checks behind the seal see it)."""
    doc = json.loads(original)
    places = _numeric_places(doc)
    for _ in range(draw(st.integers(1, 3))):
        place = draw(st.sampled_from(places))
        value = draw(st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.integers(-(2**70), 2**70),
                               st.floats(allow_nan=False, allow_infinity=False)))
        _get(doc, place[:-1])[place[-1]] = value
    return _encoded(doc)


def _encoded(doc: dict[str, Any]) -> bytes:
    """A document's bytes, sealed if it was (a manifest)."""
    body = json.dumps({k: v for k, v in doc.items() if k != checks.SEAL_KEY}, separators=(",", ":")).encode()
    return checks.seal(body) if checks.SEAL_KEY in doc else body


def _sharded_with(place: tuple[Any, ...], value: Any) -> bytes:
    doc = json.loads(SHARDED)
    _get(doc, place[:-1])[place[-1]] = value
    return _encoded(doc)


def _in_range(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= checks.MAX_INT for v in values)


def _itemsize(dtype: str) -> int:
    return dtype_from_name(dtype).itemsize  # torch's own, not the table under test


def _usable_tensor(shape: tuple[int, ...], dtype: str, nbytes: int) -> None:
    assert _in_range(nbytes, *shape) and math.prod(shape) * _itemsize(dtype) == nbytes, (shape, dtype, nbytes)
    t = torch.empty(shape, dtype=dtype_from_name(dtype), device="meta")  # the sizes torch accepts, nothing allocated
    assert t.numel() * t.element_size() == nbytes


def _assert_usable(m: Manifest) -> None:
    """Every number in range and consistent, and what restore does with it works."""
    assert _in_range(m.step, m.world_size) and 1 <= m.world_size == len(m.per_rank)
    for f in m.files:
        assert _in_range(f.rank, f.start, f.raw_size, f.size, f.block_size) and f.start + f.raw_size <= checks.MAX_INT
    entries = [*m.replicated.tensors.items(), *(i for s in m.per_rank for i in s.tensors.items())]
    for _, t in entries:
        assert _in_range(t.rank, t.offset)
        _usable_tensor(t.shape, t.dtype, t.nbytes)
    chunks = [(f"{k} {c.offsets}", c) for k, e in m.sharded.items() for c in e.chunks]
    for key, e in m.sharded.items():
        assert math.prod(e.shape) * _itemsize(e.dtype) <= checks.MAX_INT, key
        torch.empty(e.shape, dtype=dtype_from_name(e.dtype), device="meta")
        for c in e.chunks:
            assert _in_range(c.rank, c.offset, *c.offsets) and all(o + s <= n for o, s, n in
                                                                  zip(c.offsets, c.sizes, e.shape, strict=True))
            _usable_tensor(c.sizes, e.dtype, c.nbytes)
    checks.streams(m.files, entries + chunks, world_size=m.world_size, what="re-check")  # inside, disjoint
    assert mf.manifest_from_bytes(mf.manifest_to_bytes(m)) == m


@FUZZ
@given(renumbered(MANIFEST))
def test_numbers_of_a_manifest_are_in_range_or_refused(data: bytes) -> None:
    m = _parse_within_budget(mf.manifest_from_bytes, data)
    if m is not None:
        _assert_usable(m)


@FUZZ
@given(renumbered(SHARDED))
@example(_sharded_with(("sharded", "model.w", "shape", 0), 10**30))
@example(_sharded_with(("sharded", "model.b", "chunks", 0, "nbytes"), 10**30))
@example(_sharded_with(("replicated", "tree", "dcp", "planner_data", "extra.1", 1), 10**30))
def test_numbers_of_a_sharded_manifest_and_its_dcp_metadata_are_in_range_or_refused(data: bytes) -> None:
    m = _parse_within_budget(mf.manifest_from_bytes, data)
    if m is None:
        return
    _assert_usable(m)
    try:
        md = metadata_of(m, "fuzz")
    except CheckpointFormatError:
        return
    for path in (md.planner_data or {}).values():
        assert all(isinstance(p, str) or (_in_range(p) and p < MAX_LIST_INDEX) for p in path), path
    for key, tmd in md.state_dict_metadata.items():
        if hasattr(tmd, "chunks"):
            assert all(math.prod(c.sizes) * tmd.properties.dtype.itemsize <= checks.MAX_INT for c in tmd.chunks), key


@FUZZ
@given(renumbered(MARKER))
def test_numbers_of_a_done_marker_are_in_range_or_refused(data: bytes) -> None:
    marker = _parse_within_budget(mf.marker_from_bytes, data)
    if marker is None:
        return
    assert _in_range(marker.rank)
    for f in marker.files:
        assert _in_range(f.rank, f.start, f.raw_size, f.size) and f.start + f.raw_size <= checks.MAX_INT
    for t in [*marker.replicated_tensors.values(), *marker.per_rank.tensors.values()]:
        _usable_tensor(t.shape, t.dtype, t.nbytes)


@FUZZ
@given(renumbered(POINTER))
def test_numbers_of_the_pointer_are_in_range_or_refused(data: bytes) -> None:
    pointer = _parse_within_budget(ptr.pointer_from_bytes, data)
    if pointer is not None:
        assert _in_range(pointer.step) and pointer.path == layout.step_dir(pointer.step)
        assert all(_in_range(step) for _, step in pointer.timeline.history)


@given(st.lists(st.one_of(st.integers(-(2**70), 2**70), st.sampled_from(HOSTILE_NUMBERS)), max_size=4))
@example([10**30])
def test_a_size_in_a_state_tree_is_a_64_bit_integer_or_refused(sizes: list[Any]) -> None:
    try:
        value = decode_tree({TAG: "size", "v": sizes}, {}, path="fuzz")
    except CheckpointFormatError:
        return
    assert repr(value) and all(-(2**63) <= n < 2**63 for n in value)  # usable: repr used to overflow


def test_the_dtype_table_is_torchs() -> None:
    got = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
    assert {name: d.itemsize for name, d in got.items()} == dict(DTYPE_SIZES)
