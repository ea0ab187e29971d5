"""Pure parts of the checkpoint format: schemas, retention policies, tree encoding, layout, shares."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.entries import FileEntry, Section, TensorEntry
from streamio.checkpoint.format.manifest import DoneMarker
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.retention import (
    CheckpointRecord,
    KeepAll,
    KeepBest,
    KeepEvery,
    KeepLast,
    steps_to_delete,
)
from streamio.checkpoint.tensors.serialize import HostBuffer, assign_shares, plan_layout
from streamio.checkpoint.tensors.tree import TreeEncoder, decode_tree
from streamio.errors import CheckpointError

# ------------------------------------------------------------------------------ retention
records_st = st.lists(
    st.builds(CheckpointRecord, st.integers(0, 10_000), st.fixed_dictionaries({"loss": st.floats(-10, 10)})),
    min_size=1, max_size=30, unique_by=lambda r: r.step,
).map(lambda rs: sorted(rs, key=lambda r: r.step))
policy_st = st.recursive(
    st.one_of(
        st.builds(KeepLast, st.integers(1, 5)),
        st.builds(KeepBest, st.just("loss"), st.sampled_from(["min", "max"]), st.integers(1, 3)),
        st.builds(KeepEvery, st.integers(1, 50)),
    ),
    lambda inner: st.tuples(inner, inner).map(lambda ab: ab[0] | ab[1]),
    max_leaves=4,
)


@given(records_st, policy_st, st.data())
def test_retention_never_deletes_the_current_checkpoint(
    records: list[CheckpointRecord], policy: Any, data: Any
) -> None:
    current = data.draw(st.sampled_from([r.step for r in records]))
    doomed = steps_to_delete(policy, records, current=current)
    assert current not in doomed
    assert set(doomed) == {r.step for r in records} - policy.keep(records) - {current}


@given(records_st, st.integers(1, 5))
def test_keep_last_keeps_exactly_the_newest(records: list[CheckpointRecord], k: int) -> None:
    assert KeepLast(k).keep(records) == {r.step for r in records[-k:]}


@given(records_st, st.sampled_from(["min", "max"]))
def test_keep_best_keeps_the_extreme(records: list[CheckpointRecord], mode: str) -> None:
    (kept,) = KeepBest("loss", mode=mode).keep(records)  # type: ignore[arg-type]
    values = [r.metrics["loss"] for r in records]
    best = min(values) if mode == "min" else max(values)
    assert {r.metrics["loss"] for r in records if r.step == kept} == {best}
    # ties go to the newest
    assert kept == max(r.step for r in records if r.metrics["loss"] == best)


def test_keep_best_ignores_missing_nan_and_bool_metrics() -> None:
    records = [
        CheckpointRecord(1, {}),
        CheckpointRecord(2, {"loss": float("nan")}),
        CheckpointRecord(3, {"loss": True}),
        CheckpointRecord(4, {"loss": 2.0}),
        CheckpointRecord(5, {"loss": 3}),
    ]
    assert KeepBest("loss").keep(records) == {4}
    assert KeepBest("loss", mode="max").keep(records) == {5}
    assert KeepEvery(2).keep(records) == {2, 4} and KeepAll().keep(records) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("bad", [lambda: KeepLast(0), lambda: KeepBest("x", mode="low"), lambda: KeepEvery(0)])  # type: ignore[arg-type]
def test_policies_reject_nonsense(bad: Any) -> None:
    with pytest.raises(ValueError):
        bad()


# ------------------------------------------------------------------------------ schemas
def _markers() -> list[DoneMarker]:
    t = TensorEntry(0, 0, 16, "float32", (2, 2), "crc32c:00000001")
    f0 = FileEntry("rank-00000/part-abc-00000.bin", 0, 0, 64, 64, "crc32c:0000000a")
    f1 = FileEntry("rank-00001/part-abc-00000.bin", 1, 0, 64, 30, "crc32c:0000000b", "zstd")
    return [
        DoneMarker(
            0, "abc", (f0,), {"model/w": t},
            Section({"rng": {"$t": "tensor", "k": "rng/s"}}, {"rng/s": dataclasses.replace(t, offset=16)}),
            {"model": {"w": 1}},
        ),
        DoneMarker(
            1, "abc", (f1,), {"model/b": TensorEntry(1, 0, 4, "bfloat16", (2,), "crc32c:00000002")},
            Section({"rng": 1}),
        ),
    ]


def test_manifest_round_trip_through_markers() -> None:
    markers = [mf.marker_from_bytes(mf.marker_to_bytes(m)) for m in _markers()]
    m = mf.build_manifest(7, markers, metrics={"loss": 0.5}, software={"torch": "x"}, created="now")
    back = mf.manifest_from_bytes(mf.manifest_to_bytes(m))
    assert back == m
    assert back.world_size == 2 and set(back.replicated.tensors) == {"model/w", "model/b"}
    assert back.replicated.tree == {"model": {"w": 1}} and back.per_rank[1].tree == {"rng": 1}
    assert [f.path for f in back.files if f.rank == 1] == ["rank-00001/part-abc-00000.bin"] and back.total_bytes == 94


def test_build_manifest_rejects_mixed_saves_and_double_claims() -> None:
    a, b = _markers()
    with pytest.raises(ManifestError, match="expected save 'abc'"):
        mf.build_manifest(1, [a, DoneMarker(1, "zzz", (), {}, Section(None))], metrics={}, software={}, created="")
    with pytest.raises(ManifestError, match="saved by two ranks"):
        mf.build_manifest(
            1, [a, DoneMarker(1, "abc", (), dict(a.replicated_tensors), Section(None))],
            metrics={}, software={}, created="",
        )


@pytest.mark.parametrize(
    ("doc", "unknown", "match"),
    [
        (b"[1]", False, "must be a JSON object"),
        (b"{", False, "not valid JSON"),
        (b'{"format": "streamio.checkpoint/9"}', True, "upgrade streamio"),
        (b'{"format": "torch.dcp"}', True, "not written by streamio"),
        (json.dumps({"format": mf.FORMAT, "step": -1, "files": [], "per_rank": [{"tree": None, "tensors": {}}],
                     "world_size": 1, "save_id": "a", "replicated": {"tree": None, "tensors": {}}}).encode(),
         False, "'step'"),
        (json.dumps({"format": mf.FORMAT, "step": 1, "files": [], "per_rank": [], "world_size": 2, "save_id": "a",
                     "replicated": {"tree": None, "tensors": {}}}).encode(), False, "world_size 2 but 0"),
    ],
)
def test_manifest_validation(doc: bytes, unknown: bool, match: str) -> None:
    with pytest.raises(ManifestError, match=match) as info:
        mf.manifest_from_bytes(doc)
    assert info.value.unknown_version is unknown


def test_pointer_round_trip_and_path_check() -> None:
    p = Pointer(12, layout.step_dir(12), "crc32c:00000000", "abc", "t")
    assert ptr.pointer_from_bytes(ptr.pointer_to_bytes(p)) == p
    bad = json.loads(ptr.pointer_to_bytes(p))
    bad["path"] = "../elsewhere"
    with pytest.raises(ManifestError, match="expected 'step-000000012'"):
        ptr.pointer_from_bytes(json.dumps(bad).encode())


def test_paths() -> None:
    assert layout.step_dir(45000) == "step-000045000" and layout.parse_step_dir("step-000045000") == 45000
    assert layout.parse_step_dir("step-12") is None and layout.parse_step_dir("latest.json") is None
    assert layout.part_path(3, "abc", 2) == "rank-00003/part-abc-00002.bin"
    with pytest.raises(ValueError):
        layout.step_dir(-1)


@given(st.integers(0, 10_000), st.integers(1, 3000))
def test_split_ranges_cover_exactly(total: int, part: int) -> None:
    ranges = layout.split_ranges(total, part)
    assert [a for a, _ in ranges] == list(range(0, total, part))
    assert all(0 < b - a <= part for a, b in ranges) and (ranges[-1][1] if ranges else 0) == total


# ------------------------------------------------------------------------------ tree encoding
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                      st.text(max_size=5), st.binary(max_size=5))
tree_st = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.dictionaries(st.one_of(st.integers(), st.tuples(st.integers())), inner, max_size=3),
    ),
    max_leaves=12,
)


@given(tree_st)
def test_tree_encoding_round_trips_through_json(value: Any) -> None:
    tensors: dict[str, torch.Tensor] = {}
    encoded = TreeEncoder(tensors).encode(value, "x")
    assert tensors == {}
    assert decode_tree(json.loads(json.dumps(encoded, allow_nan=False)), {}) == value


def test_tag_key_in_user_dict_is_escaped() -> None:
    value = {"$t": "tensor", "k": "nope"}
    encoded = TreeEncoder().encode(value, "x")
    assert decode_tree(json.loads(json.dumps(encoded)), {}) == value


def test_tensor_keys_are_unique_and_named_by_path() -> None:
    tensors: dict[str, torch.Tensor] = {}
    enc = TreeEncoder(tensors)
    enc.encode({"a": torch.ones(1), "b": [torch.zeros(2)]}, "m")
    enc.encode(torch.ones(3), "m/a")
    assert list(tensors) == ["m/a", "m/b/0", "m/a~2"]


def test_non_finite_floats_and_odd_types() -> None:
    value = {"inf": float("inf"), "ninf": float("-inf"), "size": torch.Size([1]), "dt": torch.bfloat16,
             "dev": torch.device("cpu"), "set": frozenset({1})}
    out = decode_tree(json.loads(json.dumps(TreeEncoder().encode(value, "v"), allow_nan=False)), {})
    assert out["inf"] == math.inf and out["ninf"] == -math.inf and out["size"] == torch.Size([1])
    assert out["dt"] is torch.bfloat16 and out["dev"] == torch.device("cpu") and out["set"] == {1}


def test_unknown_objects_are_refused_not_pickled() -> None:
    class Opaque:
        pass

    with pytest.raises(CheckpointError, match=r"'s/obj' of type Opaque"):
        TreeEncoder().encode({"obj": Opaque()}, "s")


# ------------------------------------------------------------------------------ layout and shares
def test_layout_is_aligned_and_host_buffer_is_reused() -> None:
    tensors = {"a": torch.arange(3, dtype=torch.int8), "b": torch.randn(5, dtype=torch.float64), "c": torch.zeros(0)}
    layout = plan_layout(list(tensors.items()))
    assert [s.offset for s in layout.slots] == [0, 64, 128] and layout.total == 128
    buf = HostBuffer()
    stream = buf.snapshot(layout, tensors)
    first = stream.ctypes.data
    assert bytes(stream[64:104]) == tensors["b"].numpy().tobytes()
    tensors["b"].add_(1)  # the snapshot is a copy
    assert bytes(stream[64:104]) != tensors["b"].numpy().tobytes()
    again = buf.snapshot(layout, tensors)
    assert again.ctypes.data == first and bytes(again[64:104]) == tensors["b"].numpy().tobytes()


@given(
    st.dictionaries(st.text(min_size=1, max_size=6), st.integers(0, 10_000), min_size=1, max_size=40),
    st.integers(1, 8),
)
def test_shares_are_deterministic_and_balanced(sizes: dict[str, int], world: int) -> None:
    owner = assign_shares(sizes, world)
    assert owner == assign_shares(dict(reversed(list(sizes.items()))), world)
    load = [sum(n for k, n in sizes.items() if owner[k] == r) for r in range(world)]
    assert max(load) - min(load) <= max(sizes.values())


def test_rank0_keys_stay_on_rank0() -> None:
    owner = assign_shares({"w": 100, "bn.mean": 10, "bn.var": 10}, 2, rank0=["bn.mean", "bn.var"])
    assert owner["bn.mean"] == owner["bn.var"] == 0 and owner["w"] == 1
