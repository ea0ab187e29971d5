"""torch DCP through streamio's storage, one process: ``dcp.save`` / ``dcp.load`` with StreamioWriter/Reader.

What a user of DCP gets: the save is a streamio checkpoint (parts with CRC32C per part and per
block, a sealed JSON manifest, ``latest.json`` swapped last), the load reads it back through
DCP's own planner, and nothing is ever pickled or unpickled: non-tensor values are JSON, a
``.metadata`` pickle beside the checkpoint is never opened, and a manifest replaced by one is
refused. Multi-rank saves and resharding are in test_checkpoint_sharded.py.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem, SavePlan, WriteItem, WriteItemType
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from streamio.checkpoint import CheckpointManager, SaveOptions, StreamioReader, StreamioWriter
from streamio.checkpoint.admin import verify_checkpoint
from streamio.checkpoint.format import manifest as mf
from streamio.cli.main import cli
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.ckpt import rewrite_manifest

OPTS = SaveOptions(part_size=32 << 10, block_size=1024, concurrency=4)


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3 * seed)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return model, opt


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "progress": {"step": step, "tags": ["a", "b"], "ids": torch.arange(3) * step}}


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        return Store(str(tmp_path / "dcp"))
    s3: S3Endpoint = request.getfixturevalue("s3")
    return Store(s3.url("dcp"), s3.storage_options())


def _dcp_failure(fn: Any) -> str:
    """What DCP raised (a CheckpointException, a BaseException, wrapping each rank's error)."""
    with pytest.raises(CheckpointException) as info:
        fn()
    return str(info.value)


def _writer(store: Store, step: int | None = None) -> StreamioWriter:
    return StreamioWriter(store.root_url, step=step, storage_options=store._options, options=OPTS)


def _reader(store: Store, step: int | None = None) -> StreamioReader:
    return StreamioReader(store.root_url, step=step, storage_options=store._options)


def test_dcp_save_and_load_round_trip_through_streamio(root: Store) -> None:
    model, opt = _model(1)
    dcp.save(_state(model, opt, 7), storage_writer=_writer(root, step=7))
    m = mf.manifest_from_bytes(root.read("step-000000007/manifest.json"))
    assert json.loads(root.read("latest.json"))["step"] == 7 and m.step == 7
    # tensors are chunks; values are JSON in the tree; parts carry block checksums
    assert {"model.0.weight", "optim.state.0.weight.exp_avg", "progress.ids"} <= set(m.sharded)
    tree = m.per_rank[0].tree
    assert tree["progress.tags"] == ["a", "b"] and any(k.startswith("optim.param_groups.") for k in tree)
    assert all(f.block_size == 1024 and f.blocks for f in m.files)
    for obj in root.list():
        head = root.read(obj.path, 0, 2)
        assert head != b"PK" and not head.startswith(b"\x80"), obj.path  # no torch.save zip, no pickle

    model2, opt2 = _model(2)
    state = _state(model2, opt2, 0)
    dcp.load(state, storage_reader=_reader(root))
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values(),
                                                 strict=True))
    want, got = opt.state_dict(), opt2.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert all(torch.equal(got["state"][i][k], v) for i, s in want["state"].items() for k, v in s.items())
    assert state["progress"]["step"] == 7 and state["progress"]["tags"] == ["a", "b"]
    assert torch.equal(state["progress"]["ids"], torch.arange(3) * 7)


def test_checkpoint_id_is_the_step_and_the_pointer_moves_last(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    writer = _writer(store)
    model, opt = _model(1)
    for step in (1, 2):
        dcp.save(_state(model, opt, step), checkpoint_id=step, storage_writer=writer)
    assert json.loads(store.read("latest.json"))["step"] == 2
    state = _state(*_model(3), 0)
    dcp.load(state, checkpoint_id="step-000000001", storage_reader=_reader(store))
    assert state["progress"]["step"] == 1
    assert StreamioWriter.validate_checkpoint_id(12) and not StreamioWriter.validate_checkpoint_id("/some/path")
    with pytest.raises(ValueError, match="is not a step"):
        writer.reset("/some/path")
    assert "CheckpointError: StreamioWriter has no step" in _dcp_failure(
        lambda: dcp.save(_state(model, opt, 3), storage_writer=_writer(store)))


class _Planted:
    """A pickle that would leave a file behind if anything unpickled it."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.sentinel,))


def test_pickled_metadata_is_never_read(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    model, opt = _model(1)
    dcp.save(_state(model, opt, 1), storage_writer=_writer(store, 1))
    sentinel = tmp_path / "unpickled"
    hostile = pickle.dumps(_Planted(sentinel))
    store.put("step-000000001/.metadata", hostile)  # what DCP's own reader would unpickle
    store.put(".metadata", hostile)
    state = _state(*_model(2), 0)
    dcp.load(state, storage_reader=_reader(store))
    assert state["progress"]["step"] == 1 and not sentinel.exists()
    # a manifest replaced by a pickle is refused as not JSON, and not unpickled either
    data = store.read("step-000000001/manifest.json")
    store.put("step-000000001/manifest.json", hostile)
    failure = _dcp_failure(lambda: dcp.load(_state(*_model(2), 0), storage_reader=_reader(store, 1)))
    assert "manifest.json is unusable" in failure and "not valid JSON" in failure and not sentinel.exists(), failure
    store.put("step-000000001/manifest.json", data)


def test_corrupt_block_fails_the_load_before_anything_is_copied(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    model, opt = _model(1)
    dcp.save(_state(model, opt, 1), storage_writer=_writer(store, 1))
    part = next(p for p in sorted(tmp_path.glob("step-*/rank-*/part-*.bin")) if p.stat().st_size > 5000)
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    part.write_bytes(bytes(raw))
    model2, opt2 = _model(2)
    before = {k: v.clone() for k, v in model2.state_dict().items()}
    failure = _dcp_failure(lambda: dcp.load(_state(model2, opt2, 0), storage_reader=_reader(store)))
    assert "CorruptDataError" in failure and "the object is corrupt" in failure, failure
    assert all(torch.equal(v, before[k]) for k, v in model2.state_dict().items())


def test_reader_refuses_a_manager_checkpoint_and_a_missing_root(tmp_path: Path) -> None:
    with CheckpointManager(str(tmp_path / "mgr")) as mgr:
        mgr.save(1, {"w": torch.ones(3)})
    reader = StreamioReader(str(tmp_path / "mgr"))
    failure = _dcp_failure(lambda: dcp.load({"w": torch.zeros(3)}, storage_reader=reader))
    assert "not written through torch DCP" in failure
    reader = StreamioReader(str(tmp_path / "mgr"))
    with pytest.raises(CheckpointFormatError, match="not written through torch DCP"):
        reader.read_metadata()
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="latest.json is missing"):
        StreamioReader(str(tmp_path / "empty")).read_metadata()


def test_values_never_go_through_pickling_planner_paths(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    writer = _writer(store, 1)
    item = WriteItem(index=MetadataIndex("progress.step"), type=WriteItemType.BYTE_IO)
    with pytest.raises(CheckpointError, match="lookup_object"):
        writer.write_data(SavePlan([item]), planner=object())  # type: ignore[arg-type]
    model, opt = _model(1)
    dcp.save(_state(model, opt, 1), storage_writer=writer)
    reader = _reader(store)
    reader.read_metadata()
    read = ReadItem(LoadItemType.BYTE_IO, MetadataIndex("progress.step"), torch.Size([]),
                    MetadataIndex("progress.step"), torch.Size([]), torch.Size([]))
    with pytest.raises(CheckpointError, match="never handing bytes to load_bytes"):
        reader.read_data(LoadPlan([read]), planner=object())  # type: ignore[arg-type]


def test_writer_and_reader_leave_the_environment_alone(tmp_path: Path) -> None:
    before = dict(os.environ)
    store = Store(str(tmp_path))
    model, opt = _model(1)
    dcp.save(_state(model, opt, 1), storage_writer=_writer(store, 1))
    assert dict(os.environ) == before and repr(_writer(store)).startswith("StreamioWriter(")


def test_verify_checks_every_block_and_inspect_lists_the_chunks(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    model, opt = _model(1)
    dcp.save(_state(model, opt, 1), storage_writer=_writer(store, 1))
    assert verify_checkpoint(store, 1) == []
    shown = CliRunner().invoke(cli, ["ckpt", "inspect", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if x.split()[:2] == ["sharded", "model.0.weight"])
    assert "[96, 64]" in line and line.endswith("(1 chunk)")
    doc = json.loads(store.read("step-000000001/manifest.json"))
    doc["files"][0]["blocks"][1] = "crc32c:00000000"  # a forger who re-seals: only the blocks can tell
    rewrite_manifest(store, 1, doc, repoint=True)
    assert any("block 1" in p and "the object is corrupt" in p for p in verify_checkpoint(store, 1))


def test_reader_and_writer_refuse_calls_out_of_order_and_malformed_inputs(tmp_path: Path) -> None:
    from streamio.checkpoint import ShardedModelState
    from streamio.checkpoint.dcp.metadata import planner_data_from_json

    store = Store(str(tmp_path))
    writer = _writer(store, 1)
    with pytest.raises(CheckpointError, match="save over the default group"):
        writer.set_up_storage_writer(False, rank=3)
    model, opt = _model(1)
    dcp.save(_state(model, opt, 1), storage_writer=writer)
    reader = _reader(store)
    with pytest.raises(CheckpointError, match="before set_up_storage_reader"):
        reader.set_up_storage_reader(None, True)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="before read_metadata"):
        reader.read_data(LoadPlan([]), planner=object())  # type: ignore[arg-type]
    reader.read_metadata()
    size = torch.Size([96, 64])
    stray = ReadItem(LoadItemType.TENSOR, MetadataIndex("model.0.weight", [0, 0]), torch.Size([0, 0]),
                     MetadataIndex("model.0.weight", [5, 0]), torch.Size([0, 0]), size)
    with pytest.raises(CheckpointFormatError, match="no chunk of 'model.0.weight' at \\[5, 0\\]"):
        reader.read_data(LoadPlan([stray]), planner=object())  # type: ignore[arg-type]
    value = ReadItem(LoadItemType.BYTE_IO, MetadataIndex("nope"), torch.Size([]), MetadataIndex("nope"),
                     torch.Size([]), torch.Size([]))
    with pytest.raises(CheckpointFormatError, match="has no value 'nope'"):
        reader.read_data(LoadPlan([value]), planner=object())  # type: ignore[arg-type]
    with pytest.raises(CheckpointFormatError, match="planner data"):
        planner_data_from_json({"a": [1.5]}, "x")
    with pytest.raises(CheckpointError, match="version 2"):
        ShardedModelState(model, opt).load_state_dict({"version": 2})


def test_sharded_model_state_through_the_manager_checks_the_fit_before_loading(tmp_path: Path) -> None:
    from streamio.checkpoint import ShardedModelState

    model, opt = _model(1)
    with CheckpointManager(str(tmp_path)) as mgr:
        mgr.save(1, {"app": ShardedModelState(model, opt)})
    model2, opt2 = _model(2)
    with CheckpointManager(str(tmp_path)) as mgr:
        assert mgr.restore({"app": ShardedModelState(model2, opt2)}) == 1
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True))
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    other = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 5), torch.nn.ReLU(),
                                torch.nn.Linear(5, 2))
    before = [p.clone() for p in other.parameters()]
    with CheckpointManager(str(tmp_path)) as mgr, pytest.raises(CheckpointError, match="its model or optimizer"):
        mgr.restore({"app": ShardedModelState(other, torch.optim.AdamW(other.parameters()))})
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), before, strict=True))
