"""Spreading a save's objects over key prefixes (docs/design.md "Request rates"): the pure layout
and the format-4 manifest that records it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint import root
from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format.checks import SEAL_KEY, ManifestError
from streamio.checkpoint.format.entries import FileEntry, Section
from streamio.checkpoint.format.layout import Placement
from streamio.checkpoint.format.manifest import DoneMarker
from streamio.checkpoint.options import SaveOptions
from streamio.checkpoint.save.abandon import discard_share
from streamio.errors import ConfigError
from streamio.storage import Store

sdirs = st.one_of(
    st.integers(0, 10**9).map(layout.step_dir),
    st.tuples(st.integers(0, 10**9), st.from_regex(r"[0-9a-f]{16}", fullmatch=True)).map(
        lambda a: layout.save_dir(*a)),
)


@given(sdirs, st.integers(1, layout.MAX_PREFIXES), st.integers(0, 100_000),
       st.from_regex(r"[0-9a-f]{16}", fullmatch=True), st.integers(0, 99_999))
def test_every_object_of_a_save_is_located_back_to_its_save(
    sdir: str, prefixes: int, rank: int, save_id: str, index: int
) -> None:
    place = Placement(sdir, prefixes)
    for rest in (layout.part_path(rank, save_id, index), layout.marker_path(rank, save_id)):
        path = place.path(rank, rest)
        assert layout.locate(path) == (sdir, rest)
        assert path.startswith(place.rank_dir(rank) + "/")
        assert any(path.startswith(d + "/") for d in place.dirs())
        assert layout.object_save_id(rest) == save_id and layout.save_id_at(path) == save_id
    assert layout.locate(layout.manifest_at(sdir)) == (sdir, layout.MANIFEST)
    assert place.marker(rank, save_id) == place.path(rank, layout.marker_path(rank, save_id))


@given(st.integers(2, layout.MAX_PREFIXES), st.integers(1, 4096))
def test_ranks_spread_evenly_over_the_prefixes(prefixes: int, world: int) -> None:
    place = Placement("step-000000001", prefixes)
    counts: dict[str, int] = {}
    for rank in range(world):
        head = place.rank_dir(rank).split("/", 1)[0]
        assert layout.is_spread_dir(head)
        counts[head] = counts.get(head, 0) + 1
    assert len(counts) == min(prefixes, world)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert set(counts) <= {d.split("/", 1)[0] for d in place.dirs()[1:]}


def test_one_prefix_is_the_layout_before_format_4() -> None:
    place = Placement("step-000000007")
    assert place.path(3, "rank-00003/part-x-00000.bin") == "step-000000007/rank-00003/part-x-00000.bin"
    assert place.dirs() == ["step-000000007"]
    spread = Placement("step-000000007", 16)
    assert spread.path(19, "rank-00019/done-x.json") == "p-03/step-000000007/rank-00019/done-x.json"
    assert spread.dirs()[:2] == ["step-000000007", "p-00/step-000000007"] and len(spread.dirs()) == 17


@pytest.mark.parametrize("path", [
    "latest.json", "retention.json", "p-03", "p-03/latest.json", "p-03/step-000000001", "p-03/step-000000001/",
    "p-03/step-000000001/manifest.json", "p-03/step-000000001/bad.json", "p-3/step-000000001/rank-00001/x",
    "p-0g/step-000000001/rank-00001/x", "q-03/step-000000001/rank-00001/x", "p-03/p-04/step-000000001/rank-00001/x",
    "step-1/rank-00001/x", "step-000000001", "",
])
def test_objects_of_no_save_are_located_nowhere(path: str) -> None:
    """A manifest or bad-save record is only ever the save directory's: one below a key prefix is
    no save's (gc and rm leave it, and no listing takes it for a committed save)."""
    assert layout.locate(path) is None


@pytest.mark.parametrize("bad", [0, -1, 257, True, 2.0, "16"])
def test_key_prefixes_are_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match="key_prefixes must be a whole number in 1..256"):
        SaveOptions(key_prefixes=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key prefixes must be a whole number in 1..256"):
        Placement("step-000000001", bad)  # type: ignore[arg-type]


def _manifest(prefixes: int) -> mf.Manifest:
    files = [FileEntry(layout.part_path(r, "abc", 0), r, 0, 8, 8, "crc32c:00000000") for r in range(3)]
    markers = [DoneMarker(r, "abc", (files[r],), {}, Section({"rng": r})) for r in range(3)]
    m = mf.build_manifest(5, markers, metrics={}, software={}, created="now")
    return dataclasses.replace(m, key_prefixes=prefixes)


def test_a_spread_manifest_is_format_4_and_records_its_prefixes() -> None:
    m = _manifest(3)
    data = mf.manifest_to_bytes(m)
    doc = json.loads(data)
    assert doc["format"] == mf.SPREAD_FORMAT and doc["key_prefixes"] == 3 and "sharded" not in doc
    back = mf.manifest_from_bytes(data)
    assert back == m and back.place("step-000000005").path(2, back.files[2].path) == (
        "p-02/step-000000005/rank-00002/part-abc-00000.bin")
    flat = json.loads(mf.manifest_to_bytes(_manifest(1)))
    assert flat["format"] == mf.FORMAT and "key_prefixes" not in flat  # read by older streamio as before


@pytest.mark.parametrize(("value", "match"), [
    (1, "key_prefixes 1 is outside 2..256"), (257, "key_prefixes 257 is outside 2..256"),
    (-2, "'key_prefixes'"), ("4", "'key_prefixes'"), (None, "'key_prefixes'"),
])
def test_a_format_4_manifest_with_a_bad_prefix_count_is_refused(value: object, match: str) -> None:
    doc = json.loads(mf.manifest_to_bytes(_manifest(4)))
    doc["key_prefixes"] = value
    del doc[SEAL_KEY]
    with pytest.raises(ManifestError, match=match):
        mf.manifest_from_bytes(json.dumps(doc).encode())


@pytest.mark.parametrize("path", ["part-abc-00000.bin", "rank-00002/part-abc-00000.bin", "rank-000010/x"])
def test_a_format_4_part_outside_its_ranks_directory_is_refused(path: str) -> None:
    """Where a spread save's part lives follows from its rank; one named elsewhere would be an
    object no listing ties to its save (gc could never remove it)."""
    doc = json.loads(mf.manifest_to_bytes(_manifest(2)))
    doc["files"][1]["path"] = path  # rank 1's
    del doc[SEAL_KEY]
    with pytest.raises(ManifestError, match=r"part .* of rank 1 is not below rank-00001/"):
        mf.manifest_from_bytes(json.dumps(doc).encode())


# ------------------------------------------------------------------------------ deleting
def _fill(store: Store, place: Placement, save_id: str, ranks: int) -> list[str]:
    paths = [place.path(r, layout.part_path(r, save_id, i)) for r in range(ranks) for i in range(2)]
    paths += [place.marker(r, save_id) for r in range(ranks)]
    for p in paths:
        store.put(p, b"x")
    return paths


@pytest.mark.parametrize("known", [True, False])
def test_deleting_a_spread_save_removes_its_objects_under_every_prefix_and_nothing_else(
    tmp_path: Path, known: bool
) -> None:
    """``known``: the prefixes come from the manifest; else (an unreadable manifest) from one
    listing of the root."""
    store = Store(str(tmp_path))
    doomed, kept = Placement("step-000000002", 4), Placement("step-000000003", 4)
    _fill(store, doomed, "a" * 16, 6)
    store.put(layout.manifest_at(doomed.sdir), b"{}")
    others = _fill(store, kept, "b" * 16, 6) + ["latest.json"]
    store.put("latest.json", b"{}")
    root.delete_save(store, doomed.sdir, save_id="a" * 16 if known else None, prefixes=4 if known else None)
    assert sorted(o.path for o in store.list()) == sorted(others)
    assert not any(doomed.sdir in str(p) for p in tmp_path.rglob("*"))  # its directories too, p-0x/ stays in use


def test_a_failed_saves_share_is_removed_below_its_prefix_and_another_writers_stays(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    place = Placement("step-000000002", 2)
    ours = _fill(store, place, "a" * 16, 2)
    theirs = _fill(store, place, "b" * 16, 2)  # another job's save of the same step
    assert discard_share(store, place, "a" * 16, 1)
    left = sorted(o.path for o in store.list())
    assert left == sorted(theirs + [p for p in ours if "/rank-00000/" in p])
    assert all(p.startswith("p-01/") for p in ours if "/rank-00001/" in p)
