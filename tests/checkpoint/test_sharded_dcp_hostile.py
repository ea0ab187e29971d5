"""Hostile DCP checkpoints through ``StreamioReader`` (issue 23, item 12): streamio errors, never torch's.

A forger who re-seals the manifest and re-points ``latest.json`` (``rewrite_manifest``) edits one
field of a DCP save. ``StreamioReader.load`` must raise a streamio error naming the checkpoint and
what is wrong (never torch's ``CheckpointException``, whose ``read_metadata`` branch keeps only the
text of our error inside an ``AssertionError``), before anything is allocated on the field's word
or copied into the state; ``dcp.load`` itself still raises ``CheckpointException`` (torch's
contract) with the same refusal inside. Numbers: huge, negative, float, bool; sizes that disagree
with shapes and dtypes; chunks that overlap in their stream or in the global tensor; planner data
whose list positions would make torch's ``set_element`` allocate without bound.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

from streamio.checkpoint import SaveOptions, StreamioReader, StreamioWriter
from streamio.checkpoint.dcp.metadata import MAX_LIST_INDEX
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError, CorruptDataError
from streamio.storage import Store
from support.ckpt import rewrite_manifest

OPTS = SaveOptions(block_size=1024)
Edit = Callable[[dict[str, Any]], None]


def _state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    return {"model": {"w": torch.randn(6, 4), "b": torch.randn(4)}, "extra": [torch.ones(2) * seed, torch.zeros(3)],
            "progress": {"step": seed}}


@pytest.fixture
def saved(tmp_path: Path) -> Store:
    store = Store(str(tmp_path / "dcp"))
    dcp.save(_state(1), storage_writer=StreamioWriter(store.root_url, step=1, options=OPTS))
    return store


def _chunk(doc: dict[str, Any], key: str = "model.w") -> dict[str, Any]:
    return doc["sharded"][key]["chunks"][0]


def _set(field: str, value: Any, key: str = "model.w") -> Edit:
    return lambda doc: _chunk(doc, key).__setitem__(field, value)


def _twice(doc: dict[str, Any]) -> None:
    """model.w as two chunks of its first three rows (the same box twice: the volume adds up)."""
    half = {"offsets": [0, 0], "sizes": [3, 4], "rank": 0, "nbytes": 48}
    doc["sharded"]["model.w"]["chunks"] = [dict(half, offset=0), dict(half, offset=48)]


def _planner_path(path: Any) -> Edit:
    return lambda doc: doc["replicated"]["tree"]["dcp"]["planner_data"].__setitem__("extra.0", path)


HOSTILE: dict[str, tuple[Edit, str]] = {
    "nbytes huge": (_set("nbytes", 10**30), r"'nbytes' must be an integer in \[0, 2\*\*63\)"),
    "nbytes negative": (_set("nbytes", -1), r"'nbytes' must be an integer in \[0, 2\*\*63\)"),
    "nbytes float": (_set("nbytes", 96.0), r"'nbytes' must be an integer"),
    "nbytes bool": (_set("nbytes", True), r"'nbytes' must be an integer"),
    "nbytes short": (_set("nbytes", 3), r"float32\[6, 4\] is 96 bytes, but nbytes says 3"),
    "offset huge": (_set("offset", 2**63), r"'offset' must be an integer"),
    "offset past the stream": (_set("offset", 2**62), r"spans bytes \[4611686018427387904, "),
    "offset into another tensor": (_set("offset", 64), "overlaps tensor"),
    "rank bool": (_set("rank", True), r"'rank' must be an integer"),
    "rank outside the world": (_set("rank", 7), "rank 7's stream, but the world size is 1"),
    "size huge": (_set("sizes", [10**30, 4]), "invalid sizes"),
    "shape holds 2**63 bytes": (lambda doc: doc["sharded"]["model.b"].update(
        shape=[2**61], chunks=[dict(_chunk(doc, "model.b"), sizes=[2**61], nbytes=2**63)]), "2\\*\\*63 bytes or more"),
    "shape float": (lambda doc: doc["sharded"]["model.w"].__setitem__("shape", [6.0, 4]), "invalid shape"),
    "dtype unknown": (lambda doc: doc["sharded"]["model.w"].__setitem__("dtype", "float1024"), "unknown tensor dtype"),
    "chunks overlapping in the tensor": (_twice, "'model.w': the saved chunks cover 24 of the 24 elements this rank "
                                                 "holds and overlap"),
    "planner index huge": (_planner_path(["extra", 10**30]), "DCP planner data of 'extra.0'"),
    "planner index negative": (_planner_path(["extra", -1]), "DCP planner data of 'extra.0'"),
    "planner index past the bound": (_planner_path(["extra", MAX_LIST_INDEX]), "DCP planner data of 'extra.0'"),
    "planner index bool": (_planner_path(["extra", True]), "DCP planner data of 'extra.0'"),
    "planner path empty": (_planner_path([]), "DCP planner data of 'extra.0'"),
    "planner path too deep": (_planner_path(["x"] * 201), "DCP planner data of 'extra.0'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_field_is_a_format_error_naming_the_checkpoint(saved: Store, case: str) -> None:
    edit, match = HOSTILE[case]
    doc = json.loads(saved.read("step-000000001/manifest.json"))
    edit(doc)
    rewrite_manifest(saved, 1, doc, repoint=True)
    live = _state(2)
    before = copy.deepcopy(live)
    with pytest.raises(CheckpointFormatError, match=match) as info:
        StreamioReader(saved.root_url).load(live)
    assert saved.url("step-000000001") in str(info.value)  # names the checkpoint
    assert all(torch.equal(live["model"][k], before["model"][k]) for k in ("w", "b"))
    assert live["progress"] == before["progress"]
    with pytest.raises(CheckpointException):  # what torch's own entry point raises, with our refusal inside
        dcp.load(_state(2), storage_reader=StreamioReader(saved.root_url))


def test_a_state_rebuilt_from_the_metadata_never_extends_a_list_without_bound(saved: Store) -> None:
    doc = json.loads(saved.read("step-000000001/manifest.json"))
    _planner_path(["extra", MAX_LIST_INDEX * 4])(doc)
    rewrite_manifest(saved, 1, doc, repoint=True)
    rebuilt: dict[str, Any] = {}
    with pytest.raises(CheckpointFormatError, match="DCP planner data"):
        StreamioReader(saved.root_url).load(rebuilt, planner=_EmptyStateDictLoadPlanner())
    assert rebuilt == {}


def test_load_raises_streamio_errors_for_what_dcp_load_wraps(saved: Store, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="latest.json is missing"):
        StreamioReader(str(tmp_path / "empty")).load(_state(2))
    with pytest.raises(CheckpointNotFoundError, match="step 9 was never committed"):
        StreamioReader(saved.root_url, step=9).load(_state(2))
    # a state that does not fit the checkpoint: torch's planner's error, named as such
    with pytest.raises(CheckpointError, match=r"loading checkpoint step 1 at .* through torch DCP failed on rank 0: "
                                              r"RuntimeError: Missing key in checkpoint state_dict: other"):
        StreamioReader(saved.root_url).load({"other": torch.zeros(2)})
    part = next(o.path for o in saved.list() if "/part-" in o.path)
    data = bytearray(saved.read(part))
    data[10] ^= 0xFF
    saved.put(part, bytes(data))
    live = _state(2)
    with pytest.raises(CorruptDataError):
        StreamioReader(saved.root_url).load(live)
    assert torch.equal(live["model"]["w"], _state(2)["model"]["w"])


def test_a_valid_checkpoint_still_loads(saved: Store) -> None:
    live = _state(2)
    StreamioReader(saved.root_url).load(live)
    want = _state(1)
    assert all(torch.equal(live["model"][k], want["model"][k]) for k in ("w", "b"))
    assert all(torch.equal(a, b) for a, b in zip(live["extra"], want["extra"], strict=True))
    assert live["progress"] == {"step": 1}
