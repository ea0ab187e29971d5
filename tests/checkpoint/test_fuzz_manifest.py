"""Property-based fuzzing of the checkpoint document parsers and the tree decoder (issue 12).

Valid ``manifest.json``, ``latest.json`` and done-marker documents are mutated (bit flips,
truncation, inserted bytes, fields rewritten to negative / huge / wrong-typed values, hostile
paths, deep nesting; re-sealed or not) and parsed. The parser must either raise a streamio error
(:class:`~streamio.errors.CheckpointFormatError`) or return a document whose every path is a
plain relative name and whose sizes add up, within a time and memory budget. Trees of tagged
values go through ``decode_tree`` the same way: a value or a ``CheckpointFormatError``, nothing
else. Example counts come from the hypothesis profile (tests/conftest.py: ``ci`` runs more).
"""

from __future__ import annotations

import dataclasses
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamio.checkpoint.format import checks, layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.format.entries import FileEntry, Section, TensorEntry
from streamio.checkpoint.format.manifest import DoneMarker, Manifest
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.tensors.tree import TAG, TreeEncoder, decode_tree
from streamio.checksum import checksum_bytes
from streamio.errors import CheckpointFormatError

TIME_BUDGET_S = 2.0
MEMORY_BUDGET = 32 << 20

HOSTILE_PATHS = ["../../x", "/etc/hostname", "s3://other/x", "a\\..\\b", "rank-00000//p", "./p", "..", "p\x00",
                 "%2e%2e/x", "C:\\x", "rank-00000/part-abc-00000.bin/../../../x", "\u2025/x", " ", "a/" * 600]
HOSTILE_VALUES = [-1, -(2**63), 2**63, 2**64, 10**30, 1.5, float("inf"), float("nan"), True, None, "", "x" * 300,
                  [], {}, [[[[[]]]]], {"$t": "tensor", "k": "nope"}, "crc32c:zzzzzzzz", "zstd", "lz4", *HOSTILE_PATHS]


def _tensor(rank: int, offset: int, nbytes: int) -> TensorEntry:
    return TensorEntry(rank, offset, nbytes, "float32", (nbytes // 4,), "crc32c:00000001")


def _manifest() -> Manifest:
    files = (
        FileEntry("rank-00000/part-abc-00000.bin", 0, 0, 128, 128, "crc32c:0000000a"),
        FileEntry("rank-00000/part-abc-00001.bin", 0, 128, 64, 40, "crc32c:0000000b", "zstd"),
        FileEntry("rank-00001/part-abc-00000.bin", 1, 0, 64, 64, "crc32c:0000000c"),
    )
    tree = {"model": {"w": {TAG: "tensor", "k": "model/w"}, "b": {TAG: "tensor", "k": "model/b"}},
            "counters": {"step": 7, "hist": {TAG: "tuple", "v": [1, {TAG: "float", "v": "inf"}]}}}
    return Manifest(
        step=7, save_id="abc", world_size=2,
        replicated=Section(tree, {"model/w": _tensor(0, 0, 128), "model/b": _tensor(1, 0, 16)}),
        per_rank=(Section({"rng": {TAG: "tensor", "k": "rng"}}, {"rng": _tensor(0, 128, 64)}), Section({"rng": None})),
        files=files, metrics={"loss": 0.5}, software={"torch": "x"}, created="2026-01-01T00:00:00+00:00",
    )


MANIFEST = mf.manifest_to_bytes(_manifest())
SPREAD = mf.manifest_to_bytes(dataclasses.replace(_manifest(), key_prefixes=2))  # format 4
MARKER = mf.marker_to_bytes(DoneMarker(0, "abc", _manifest().files[:2], {"model/w": _tensor(0, 0, 128)},
                                       Section({"rng": 1}, {"rng": _tensor(0, 128, 64)}), {"model": {"w": 1}}))
POINTER = ptr.pointer_to_bytes(Pointer(7, layout.step_dir(7), "crc32c:0123abcd", "abc", "2026-01-01T00:00:00+00:00"))


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _places(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every (container path, key) of a parsed JSON document."""
    out: list[tuple[Any, ...]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append((*path, k))
        out += _places(v, (*path, k))
    return out


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` damaged one of several ways."""
    how = draw(st.sampled_from(["flip", "truncate", "insert", "rewrite", "rewrite", "rewrite", "delete-field", "path"]))
    data = bytearray(original)
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "insert":
        i = draw(st.integers(0, len(data)))
        return bytes(data[:i]) + draw(st.binary(min_size=1, max_size=16)) + bytes(data[i:])
    doc = json.loads(original)
    place = draw(st.sampled_from(_places(doc)))
    parent = doc
    for k in place[:-1]:
        parent = parent[k]
    if how == "path" and doc.get("files"):
        parent, place = draw(st.sampled_from(doc["files"])), ("path",)
        path = st.one_of(st.sampled_from(HOSTILE_PATHS), st.text(alphabet="ab/.\\:%~\x00 ", max_size=12))
        parent["path"] = draw(path)
    elif how == "delete-field":
        if isinstance(parent, dict):
            del parent[place[-1]]
    else:
        parent[place[-1]] = draw(st.one_of(
            st.sampled_from(HOSTILE_VALUES), st.integers(-(2**70), 2**70), st.text(max_size=12),
            st.integers(1, 400).map(_nested),
        ))
    body = json.dumps({k: v for k, v in doc.items() if k != checks.SEAL_KEY}, separators=(",", ":"))
    if how == "path" or draw(st.booleans()):  # re-sealed: the checks behind the seal see it
        return checks.seal(body.encode())
    return json.dumps(doc, separators=(",", ":")).encode()


def _parse_within_budget(parse: Callable[[bytes], Any], data: bytes) -> Any:
    """``parse(data)`` or ``None`` if it raised a checkpoint format error; any other error fails."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        return parse(data)
    except CheckpointFormatError as exc:
        assert str(exc)
        return None
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert elapsed < TIME_BUDGET_S, f"parsing {len(data)} bytes took {elapsed:.2f} s"
        assert peak < MEMORY_BUDGET, f"parsing {len(data)} bytes peaked at {peak} bytes"


def _assert_confined(files: tuple[FileEntry, ...]) -> None:
    for f in files:
        parts = f.path.split("/")
        assert f.path and not f.path.startswith("/") and all(p not in ("", ".", "..") for p in parts)
        assert not any(c in f.path for c in ":\\\x00%~ "), f.path
        assert f.size >= 0 and f.raw_size >= 0 and f.start >= 0


FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(st.one_of(mutated(MANIFEST), mutated(SPREAD)), st.sampled_from([None, 7, 8]))
def test_manifest_parser_under_mutation(data: bytes, step: int | None) -> None:
    m = _parse_within_budget(lambda d: mf.manifest_from_bytes(d, step=step), data)
    if m is None:
        return
    assert isinstance(m, Manifest) and (step is None or m.step == step)
    _assert_confined(m.files)
    assert 1 <= m.key_prefixes <= layout.MAX_PREFIXES
    for f in m.files:  # wherever a part is placed, it stays below the root, named by its save
        assert layout.locate(m.place("step-000000007").path(f.rank, f.path)) == ("step-000000007", f.path)
    assert m.world_size == len(m.per_rank) >= 1
    checks.streams(m.files, [*m.replicated.tensors.items(), *(i for s in m.per_rank for i in s.tensors.items())],
                     world_size=m.world_size, what="re-check")
    for section in (m.replicated, *m.per_rank):
        assert section.tree is None or isinstance(section.tree, dict)
        _decode_or_format_error(section.tree, {k: torch.zeros(1) for k in section.tensors})


@FUZZ
@given(mutated(MARKER))
def test_marker_parser_under_mutation(data: bytes) -> None:
    marker = _parse_within_budget(mf.marker_from_bytes, data)
    if marker is None:
        return
    assert isinstance(marker, DoneMarker)
    _assert_confined(marker.files)
    assert all(f.rank == marker.rank for f in marker.files)


@FUZZ
@given(mutated(POINTER))
def test_pointer_parser_under_mutation(data: bytes) -> None:
    pointer = _parse_within_budget(ptr.pointer_from_bytes, data)
    if pointer is None:
        return
    assert isinstance(pointer, Pointer) and pointer.path == layout.step_dir(pointer.step)
    assert checks.checksum({"c": pointer.manifest_checksum}, "c", "re-check")


@given(st.binary(max_size=512))
def test_parsers_on_arbitrary_bytes(data: bytes) -> None:
    for parse in (mf.manifest_from_bytes, mf.marker_from_bytes, ptr.pointer_from_bytes):
        assert _parse_within_budget(parse, data) is None


def test_documents_beyond_the_limits_are_refused_quickly() -> None:
    deep = b'{"format":"streamio.checkpoint/1","x":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    for parse in (mf.manifest_from_bytes, mf.marker_from_bytes):
        t0 = time.perf_counter()
        with pytest.raises(CheckpointFormatError, match="nested too deeply"):
            parse(deep)
        assert time.perf_counter() - t0 < TIME_BUDGET_S
    with pytest.raises(CheckpointFormatError, match="over the 65536-byte limit"):
        ptr.pointer_from_bytes(b" " * (65 << 10))


@pytest.mark.parametrize(("field", "value", "match"), [
    ("size", -1, "integer in"),
    ("raw_size", 2**64, "integer in"),
    ("start", 64, "starts at byte 64 of rank 0's stream, expected 0"),
    ("rank", 5, "rank 5, but the world size is 2"),
    ("compression", "lz4", "compression 'lz4'"),
    ("checksum", "md5:00", "crc32c:<8 hex digits>"),
])
def test_declared_sizes_are_validated(field: str, value: Any, match: str) -> None:
    doc = json.loads(MANIFEST)
    doc["files"][0][field] = value
    body = json.dumps({k: v for k, v in doc.items() if k != checks.SEAL_KEY}, separators=(",", ":"))
    with pytest.raises(CheckpointFormatError, match=match):
        mf.manifest_from_bytes(checks.seal(body.encode()))


def test_parts_must_add_up_and_hold_every_tensor() -> None:
    doc = json.loads(MANIFEST)
    doc["files"][0]["raw_size"] = doc["files"][0]["size"] = 100  # a gap before the next part
    doc["replicated"]["tensors"]["model/w"]["offset"] = 10**6
    for edit, match in [({"files": doc["files"]}, "starts at byte 128 of rank 0's stream, expected 100"),
                        ({"replicated": doc["replicated"]}, r"spans bytes \[1000000, 1000128\) of rank 0's stream")]:
        fresh = {k: v for k, v in json.loads(MANIFEST).items() if k != checks.SEAL_KEY}
        fresh.update(edit)
        with pytest.raises(CheckpointFormatError, match=match):
            mf.manifest_from_bytes(checks.seal(json.dumps(fresh, separators=(",", ":")).encode()))


def test_a_valid_manifest_round_trips_sealed() -> None:
    m = mf.manifest_from_bytes(MANIFEST, step=7, checksum=checksum_bytes(MANIFEST))
    assert m == _manifest() and m.checksum.startswith("crc32c:")
    assert mf.manifest_from_bytes(mf.manifest_to_bytes(m)) == m


# ------------------------------------------------------------------------------ tree decoding
TENSORS = {"t": torch.arange(4, dtype=torch.float32), "b": torch.zeros(2, dtype=torch.bfloat16)}
_tags = st.sampled_from(["tensor", "ndarray", "float", "tuple", "dict", "npscalar", "size", "dtype", "device", "bytes",
                         "set", "pickle", 3, None])
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
                  st.sampled_from(["t", "b", "inf", "cpu", "cuda:99", "warp:1", "float32", "float1024", "O", "V8",
                                   "<U3", "aGk=", "***", "int64"]))


def _tagged(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    fields = st.sampled_from(["v", "k", "items", "dtype", "meta"])
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=4), children, max_size=4),
        st.builds(lambda tag, extra: {TAG: tag, **extra}, _tags, st.dictionaries(fields, children, max_size=3)),
        st.builds(lambda items: {TAG: "dict", "items": items},
                  st.lists(st.lists(children, min_size=1, max_size=3), max_size=3)),
    )


_trees = st.recursive(_leaf, _tagged, max_leaves=20)


def _decode_or_format_error(tree: Any, tensors: Any) -> None:
    try:
        decode_tree(tree, tensors, path="fuzz", defer=[])
    except CheckpointFormatError as exc:
        assert "fuzz" in str(exc) or "tensor" in str(exc)


@FUZZ
@given(_trees, st.sampled_from([None, {"w": torch.ones(4)}, [torch.ones(2)]]))
def test_decode_tree_raises_only_format_errors(tree: Any, template: Any) -> None:
    copies: list[Any] = []
    try:
        decode_tree(tree, TENSORS, template, path="fuzz", defer=copies)
    except CheckpointFormatError:
        pass
    if isinstance(template, dict):
        assert torch.equal(template["w"], torch.ones(4))  # decoding never writes into the live value


_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8), st.floats(allow_nan=False),
              st.binary(max_size=8)),
    lambda c: st.one_of(st.lists(c, max_size=3), st.tuples(c, c), st.dictionaries(st.text(max_size=4), c, max_size=3),
                        st.dictionaries(st.integers(), c, max_size=2)),
    max_leaves=15,
)


@given(_values)
def test_encoded_state_decodes_back(value: Any) -> None:
    tree = TreeEncoder({}).encode(value, "v")
    assert decode_tree(json.loads(json.dumps(tree)), {}, path="v") == value
