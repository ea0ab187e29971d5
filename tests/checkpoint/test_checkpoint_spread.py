"""Saves whose ranks' objects are spread over key prefixes, through every room that lists or
deletes a save's objects (docs/design.md "Request rates"): the commit's size check, pruning, the
failed-save clean-up, ``verify``, ``rm``, ``gc``; and old (flat) saves beside them in one root."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from streamio.checkpoint import root
from streamio.checkpoint.admin import collect_garbage, plan_removal, remove, verify_checkpoint
from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format.layout import Placement
from streamio.storage import Store
from support.sharded_procs import Zygote

pytestmark = pytest.mark.slow


def _objects(store: Store, step: int) -> list[str]:
    """Every object of any save of ``step``, wherever it lives."""
    return sorted(o.path for o in store.list()
                  if (found := layout.locate(o.path)) and (layout.parse_save_dir(found[0]) or (-1,))[0] == step)


def _dirs(base: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_dir()}


def test_a_save_of_two_ranks_spreads_its_ranks_objects_and_every_room_finds_them(
    zygote: Zygote, tmp_path: Path
) -> None:
    base = tmp_path / "root"
    zygote.run("save", 2, {"root": str(base), "storage": {}, "steps": [1, 2, 3, 4]})  # KeepLast(3)
    store = Store(str(base))
    assert _objects(store, 1) == [] and not any("step-000000001" in d for d in _dirs(base))  # pruned everywhere
    for step in (2, 3, 4):
        sdir = layout.step_dir(step)
        doc = json.loads(store.read(layout.manifest_at(sdir)))
        assert doc["format"] == mf.SPREAD_FORMAT and doc["key_prefixes"] == 2
        assert {p.split("/")[0] for p in _objects(store, step)} == {"p-00", "p-01", sdir}
        assert sorted(p for p in _objects(store, step) if p.startswith(sdir)) == [layout.manifest_at(sdir)]
        for p in _objects(store, step):  # rank r below p-0r (two ranks, two prefixes)
            rank = re.search(r"/rank-(\d+)/", p)
            assert rank is None or p.startswith(f"p-{int(rank[1]):02x}/"), p
        assert verify_checkpoint(store, step) == []

    m4 = root.read_manifest(store, 4)
    victim = next(f for f in m4.files if f.rank == 1)
    key = m4.place(layout.step_dir(4)).path(1, victim.path)
    assert key.startswith("p-01/step-000000004/rank-00001/")
    data = bytearray(store.read(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    assert any(store.url(key) in p for p in verify_checkpoint(store, 4))

    remove(store, plan_removal(store, 3))
    assert _objects(store, 3) == [] and not any("step-000000003" in d for d in _dirs(base))
    assert _objects(store, 2) and _objects(store, 4)

    old = f"{int(time.time()) - 7200:08x}deadbeef"  # a dead save's id, two hours old
    loser = Placement(layout.step_dir(4), 2).path(1, layout.part_path(1, old, 0))  # lost the manifest race
    unfinished = Placement(layout.step_dir(9), 2).path(0, layout.part_path(0, old, 0))
    stray = "p-00/step-000000004/manifest.json"  # no save's: a manifest is only ever the save directory's
    for path in (loser, unfinished, stray):
        store.put(path, b"x")
    report = collect_garbage(store)
    assert sorted(report.objects) == sorted([loser, unfinished])
    assert store.exists(stray) and verify_checkpoint(store, 2) == []
    assert not any("step-000000009" in d for d in _dirs(base))


def test_flat_saves_of_older_streamio_restore_and_are_pruned_beside_spread_ones(
    zygote: Zygote, tmp_path: Path
) -> None:
    base = str(tmp_path / "mixed")
    zygote.run("save", 2, {"root": base, "storage": {}, "steps": [1, 2], "key_prefixes": 1})
    store = Store(base)
    assert json.loads(store.read(layout.manifest_at(layout.step_dir(2))))["format"] == mf.SHARDED_FORMAT
    assert not any(o.path.startswith("p-") for o in store.list())  # the layout before format 4
    results = zygote.run("restore", 2, {"root": base, "storage": {}, "saved_world": 2})
    assert all(r["step"] == 2 and all(v for k, v in r["checks"].items() if k != "bad") for r in results), results

    zygote.run("save", 2, {"root": base, "storage": {}, "steps": [3, 4, 5]})  # spread; KeepLast(3) prunes 1, 2
    assert _objects(store, 1) == [] and _objects(store, 2) == []
    assert root.read_manifest(store, 5).key_prefixes == 2
    results = zygote.run("restore", 2, {"root": base, "storage": {}, "saved_world": 2})
    assert all(r["step"] == 5 and all(v for k, v in r["checks"].items() if k != "bad") for r in results), results
