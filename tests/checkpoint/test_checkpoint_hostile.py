"""Hostile and damaged checkpoints: bounded parts, confined paths, verified JSON, all-or-nothing.

Each test crafts what a hostile-input review of v0.1 found (issue 12, classes 4-7): a zstd part
whose frame declares 64 GiB, part paths that leave the step directory, a manifest edited after
commit or copied from another step, a tree that fails half-way, and a checkpoint of another
model. Restore must walk back past a bad checkpoint (logged) or raise naming what is at fault,
and in either case never leave the live objects half-loaded.

Forged manifests are re-sealed (``rewrite_manifest``) where the test is about a check that lies
behind the manifest's own checksum: a careless edit is caught by the seal alone.
"""

from __future__ import annotations

import copy
import json
import logging
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
import zstandard
from click.testing import CliRunner

from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions
from streamio.checkpoint.admin import verify_checkpoint
from streamio.checkpoint.format import entries as ent
from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.tensors.serialize import decode_part
from streamio.checksum import checksum_bytes
from streamio.cli.main import cli
from streamio.errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    CorruptDataError,
    StreamioError,
)
from streamio.limits import MAX_JSON_DEPTH
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.ckpt import PART_SIZE, Net, assert_same_state, fresh_state, rewrite_manifest, state_for

OPTS = SaveOptions(part_size=PART_SIZE, concurrency=4)
# a 16-byte zstd frame (single segment, 8-byte content size, one empty raw block) declaring 64 GiB
BOMB = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 64 << 30) + b"\x01\x00\x00"


def _manager(store: Store, **kw: Any) -> CheckpointManager:
    return CheckpointManager(store.root_url, storage_options=store._options, options=kw.pop("options", OPTS), **kw)


def _two(store: Store, options: SaveOptions = OPTS) -> None:
    with _manager(store, retention=KeepLast(5), async_save=False, options=options) as mgr:
        mgr.save(1, state_for(1))
        mgr.save(2, state_for(2))


def _doc(store: Store, step: int) -> dict[str, Any]:
    return json.loads(store.read(layout.manifest_path(step)))


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A checkpoint root on local disk (nested, so that ``../..`` stays in tmp_path) or S3 (moto)."""
    if request.param == "file":
        return Store(str(tmp_path / "a" / "root"))
    s3: S3Endpoint = request.getfixturevalue("s3")
    return Store(s3.url("ckpt"), s3.storage_options())


def _live(width: int = 256) -> dict[str, Any]:
    """A state to restore into whose optimizer already holds moments (they must stay unchanged)."""
    state = fresh_state(width)
    state["model"](torch.randn(16, 64)).sum().backward()
    state["optim"].step()
    state["optim"].zero_grad()
    state["counters"] = {"step": -1}
    return state


def _snapshot(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in state["model"].state_dict().items()},
        "optim": copy.deepcopy(state["optim"].state_dict()),
        "lr": [g["lr"] for g in state["optim"].param_groups],
        "sched": copy.deepcopy(state["sched"].state_dict()),
        "counters": copy.deepcopy(state["counters"]),
        "extra": state["extra"].clone(),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _assert_unchanged(state: dict[str, Any], before: dict[str, Any]) -> None:
    now = _snapshot(state)
    for key in before:
        assert _same(now[key], before[key]), f"live {key!r} changed"


def _find_lr(tree: Any) -> dict[str, Any]:
    """The first encoded optimizer param group (a dict holding 'lr') in a manifest tree."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "lr" in node:
                return node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    raise AssertionError("no 'lr' in the tree")


# --------------------------------------------------------------------------- zstd (class 4)
def test_part_whose_zstd_frame_declares_64_gib_is_corrupt_in_bounded_memory() -> None:
    entry = ent.FileEntry("rank-00000/part-a-00000.bin", 0, 0, 4096, len(BOMB), checksum_bytes(BOMB), "zstd")
    inflating = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))  # declares no size
    inflating_entry = ent.FileEntry("rank-00000/part-a-00000.bin", 0, 0, 4096, len(inflating),
                                    checksum_bytes(inflating), "zstd")
    assert zstandard.frame_content_size(BOMB) == 64 << 30 and zstandard.frame_content_size(inflating) == -1
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError, match=r"declares 68719476736 bytes.*4096 expected"):
            decode_part(BOMB, entry, "mem://part")
        with pytest.raises(CorruptDataError, match="more than the 4096 bytes expected"):
            decode_part(inflating, inflating_entry, "mem://part")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"decompression peaked at {peak} bytes"


def test_restore_walks_back_past_a_zstd_bomb_part(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(str(tmp_path))
    _two(store, SaveOptions(part_size=PART_SIZE, concurrency=4, compression="zstd"))
    doc = _doc(store, 2)
    part = doc["files"][0]
    store.put(f"{layout.step_dir(2)}/{part['path']}", BOMB)
    part["size"], part["checksum"] = len(BOMB), checksum_bytes(BOMB)  # raw_size stays what the save wrote
    rewrite_manifest(store, 2, doc, repoint=True)
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(store).restore(got) == 1
    assert_same_state(got, state_for(1))
    assert "declares 68719476736 bytes" in caplog.text and "falling back" in caplog.text
    assert any("declares 68719476736" in p for p in verify_checkpoint(store, 2))


# --------------------------------------------------------------------------- paths (class 5)
HOSTILE_PATHS = ["../../x", "/etc/hostname", "s3://other/x", "a\\..\\b", "rank-00000//p.bin", "rank-00000/./p.bin",
                 "rank-00000/p\x00.bin", "%2e%2e/x", "~/x", "", "rank-00000/..", "x" * 2000]


@pytest.mark.parametrize("hostile", HOSTILE_PATHS)
def test_part_path_outside_the_step_directory_is_refused_when_parsed(hostile: str) -> None:
    m = mf.Manifest(7, "abc", 1, ent.Section({}), (ent.Section({}),),
                    (ent.FileEntry(hostile, 0, 0, 64, 64, "crc32c:0000000a"),))
    with pytest.raises(CheckpointFormatError, match=r"manifest of step 7, file 0: path .* is not a plain") as info:
        mf.manifest_from_bytes(mf.manifest_to_bytes(m))
    assert repr(hostile)[:40] in str(info.value)
    marker = mf.DoneMarker(0, "abc", (ent.FileEntry(hostile, 0, 0, 64, 64, "crc32c:0000000a"),), {}, ent.Section({}))
    with pytest.raises(CheckpointFormatError, match="not a plain relative name"):
        mf.marker_from_bytes(mf.marker_to_bytes(marker))


def test_restore_and_verify_never_read_a_part_outside_the_root(
    root: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _two(root)
    doc = _doc(root, 2)
    original = f"{layout.step_dir(2)}/{doc['files'][0]['path']}"
    if root.protocol == "file":  # the part's exact bytes wait outside the root: reading them would "work"
        (tmp_path / "a" / "x").write_bytes(root.read(original))
    else:
        root.put(f"{layout.step_dir(2)}/../../x", root.read(original))
    doc["files"][0]["path"] = "../../x"
    rewrite_manifest(root, 2, doc, repoint=True)
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(root).restore(got) == 1
    assert_same_state(got, state_for(1))
    assert "'../../x' is not a plain relative name" in caplog.text
    (problem,) = verify_checkpoint(root, 2)
    assert root.url(layout.manifest_path(2)) in problem and "'../../x' is not a plain relative name" in problem
    unusable = r"step-000000002/manifest.json is unusable: manifest of step 2, file 0: path '\.\./\.\./x'"
    with pytest.raises(CheckpointFormatError, match=unusable):
        _manager(root).restore(fresh_state(), step=2)


def test_ckpt_verify_cli_names_the_hostile_path_and_reads_nothing(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "a" / "root"))
    _two(store)
    doc = _doc(store, 2)
    doc["files"][0]["path"] = "../../../../../../etc/hostname"
    rewrite_manifest(store, 2, doc, repoint=True)
    result = CliRunner().invoke(cli, ["ckpt", "verify", store.root_url])
    assert result.exit_code == 1, result.output
    assert "'../../../../../../etc/hostname' is not a plain relative name" in result.output
    assert "etc/hostname is" not in result.output  # no size or checksum of the local file


# --------------------------------------------------------------------------- checksums (class 6)
@pytest.mark.parametrize("edit", ["by-hand", "resealed"])
def test_manifest_edited_after_commit_is_not_restored(root: Store, edit: str, caplog: pytest.LogCaptureFixture) -> None:
    _two(root)
    doc = _doc(root, 2)
    _find_lr(doc["replicated"]["tree"]["optim"])["lr"] = 123.0
    doc["replicated"]["tree"]["counters"]["step"] = 999
    if edit == "by-hand":
        root.put(layout.manifest_path(2), json.dumps(doc, indent=1).encode())
    else:  # consistent with its own seal, but not the manifest latest.json committed
        rewrite_manifest(root, 2, doc)
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(root).restore(got) == 1
    assert_same_state(got, state_for(1))
    assert "manifest of step 2 has checksum" in caplog.text and "but latest.json recorded" in caplog.text
    assert "falling back" in caplog.text


def test_an_older_step_is_verified_by_its_own_checksum(tmp_path: Path) -> None:
    """Step 1 is not the pointer's: its seal is what covers its JSON when restore walks back."""
    store = Store(str(tmp_path))
    _two(store)
    doc = _doc(store, 1)
    _find_lr(doc["replicated"]["tree"]["optim"])["lr"] = 123.0
    store.put(layout.manifest_path(1), json.dumps(doc, separators=(",", ":")).encode())  # seal left as it was
    store.put(ptr.LATEST, b"{damaged")
    part = f"{layout.step_dir(2)}/{_doc(store, 2)['files'][0]['path']}"
    store.put(part, store.read(part)[:-1] + b"!")  # and step 2 is damaged: restore walks back to step 1
    live = _live()
    before = _snapshot(live)
    with pytest.raises(CheckpointError, match=r"step 1: .*modified or damaged after commit") as info:
        _manager(store).restore(live)
    assert f"step 2: {store.url(part)} has checksum" in str(info.value)
    _assert_unchanged(live, before)
    with pytest.raises(CheckpointFormatError, match="has checksum crc32c:[0-9a-f]{8}, but records"):
        _manager(store).restore(live, step=1)
    _assert_unchanged(live, before)


def test_manifest_copied_from_another_step_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(str(tmp_path))
    _two(store)
    data = store.read(layout.manifest_path(1))
    store.put(layout.manifest_path(2), data)  # step 2 now "holds" step 1's checkpoint ...
    pointer = json.loads(store.read(ptr.LATEST))
    pointer["manifest_checksum"] = checksum_bytes(data)  # ... and the pointer agrees
    store.put(ptr.LATEST, json.dumps(pointer).encode())
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(store).restore(got) == 1  # never step 1's content reported as step 2
    assert_same_state(got, state_for(1))
    assert "manifest of step 2 says it is step 1" in caplog.text
    with pytest.raises(CheckpointFormatError, match="says it is step 1: it was copied from another step"):
        _manager(store).restore(fresh_state(), step=2)


def test_unsealed_manifest_of_an_older_streamio(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A manifest without a seal is restored when latest.json's checksum covers it or when asked
    for by step, never picked by a walk-back that could not verify its JSON."""
    store = Store(str(tmp_path))
    _two(store)
    for step in (1, 2):
        doc = _doc(store, step)
        del doc["checksum"]
        store.put(layout.manifest_path(step), json.dumps(doc).encode())
    pointer = json.loads(store.read(ptr.LATEST))
    pointer["manifest_checksum"] = checksum_bytes(store.read(layout.manifest_path(2)))
    store.put(ptr.LATEST, json.dumps(pointer).encode())
    got = fresh_state()
    assert _manager(store).restore(got) == 2
    assert_same_state(got, state_for(2))
    store.put(ptr.LATEST, b"{damaged")
    with pytest.raises(CheckpointError, match=r"carries no checksum of its own .* restore it explicitly with step=2"):
        _manager(store).restore(fresh_state())
    got = fresh_state()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(store).restore(got, step=1) == 1
    assert_same_state(got, state_for(1))
    assert "restored unverified" in caplog.text


# --------------------------------------------------------------------------- all or nothing (class 7)
def _break(doc: dict[str, Any], how: str) -> None:
    tree = doc["replicated"]["tree"]
    bad = {
        "device": {"$t": "device", "v": "warp-drive:9"},
        "malformed": {"$t": "tuple"},
        "tree-dtype": {"$t": "dtype", "v": "float1024"},
        "missing-tensor": {"$t": "tensor", "k": "no/such/tensor"},
        "base64": {"$t": "bytes", "v": "not base64 !"},
        "unhashable": {"$t": "set", "v": [[1, 2]]},
        "object-dtype": {"$t": "npscalar", "dtype": "O", "v": 1},
    }
    if how in bad:
        tree["counters"]["zzz"] = bad[how]  # the last entry decoded: model, optimizer, lr come first
    elif how == "tensor-dtype":
        next(iter(doc["replicated"]["tensors"].values()))["dtype"] = "float1024"
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["device", "malformed", "tree-dtype", "missing-tensor", "base64", "unhashable",
                                 "object-dtype", "tensor-dtype"])
def test_a_tree_that_fails_half_way_walks_back_and_touches_nothing(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(str(tmp_path))
    _two(store)
    doc = _doc(store, 2)
    _break(doc, how)
    rewrite_manifest(store, 2, doc, repoint=True)
    live = _live()
    before = _snapshot(live)
    with pytest.raises(CheckpointFormatError):
        _manager(store).restore(live, step=2)  # explicit step: no walk-back, and nothing loaded
    _assert_unchanged(live, before)
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(store).restore(live) == 1
    assert_same_state(live, state_for(1))
    assert "checkpoint step 2" in caplog.text and "falling back" in caplog.text


def test_deeply_nested_manifest_walks_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(str(tmp_path))
    _two(store)
    doc = _doc(store, 2)
    doc["replicated"]["tree"]["counters"]["deep"] = "DEEP"
    body = json.dumps({k: v for k, v in doc.items() if k != "checksum"}, separators=(",", ":"))
    data = body.replace('"DEEP"', "[" * 100_000 + "]" * 100_000).encode()
    store.put(layout.manifest_path(2), data)
    pointer = json.loads(store.read(ptr.LATEST))
    pointer["manifest_checksum"] = checksum_bytes(data)
    store.put(ptr.LATEST, json.dumps(pointer).encode())
    live = _live()
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        assert _manager(store).restore(live) == 1
    assert_same_state(live, state_for(1))
    assert "nested too deeply" in caplog.text


def test_state_nested_deeper_than_a_manifest_may_be_is_refused_at_save(tmp_path: Path) -> None:
    deep: Any = 1
    for _ in range(MAX_JSON_DEPTH + 10):
        deep = [deep]
    with CheckpointManager(str(tmp_path), async_save=False) as mgr:
        with pytest.raises(CheckpointError, match="levels deep"):
            mgr.save(1, {"deep": deep})
        assert mgr.latest_step() is None


# --------------------------------------------------------------------------- another model
def _other(how: str) -> dict[str, Any]:
    if how == "width":
        return _live(width=128)
    live = _live()
    if how == "dtype":
        live["model"].to(torch.float64)
    elif how == "extra-layer":
        live["model"].head = torch.nn.Linear(8, 2)
    elif how == "optimizer":
        live["optim"] = torch.optim.Adam(list(live["model"].parameters())[:2], lr=5e-2)
        live["sched"] = torch.optim.lr_scheduler.StepLR(live["optim"], step_size=2)
    elif how == "missing-name":
        live["unsaved"] = {"x": 1}
    return live


@pytest.mark.parametrize(("how", "entry", "detail"), [
    ("width", "model", r"tensor 'fc1.weight' is float32\[256, 64\] in the checkpoint but float32\[128, 64\]"),
    ("dtype", "model", r"is float32\[.*\] in the checkpoint but float64"),
    ("extra-layer", "model", r"missing from the checkpoint \['head.bias', 'head.weight'\], not in the live module"),
    ("optimizer", "optim", "parameter group 0 has 7 parameters in the checkpoint, 2 in the live optimizer"),
    ("missing-name", None, r"the checkpoint has no \['unsaved'\]"),
])
def test_checkpoint_of_another_model_raises_and_leaves_the_live_state_unchanged(
    tmp_path: Path, how: str, entry: str | None, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(str(tmp_path))
    _two(store)
    live = _other(how)
    before = _snapshot(live)
    with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.restore"):
        with pytest.raises(CheckpointError, match=detail) as info:
            _manager(store).restore(live)
    message = str(info.value)
    assert f"checkpoint step 2 under {store.root_url}" in message and "nothing was loaded" in message
    if entry:
        assert f"state entry {entry!r}" in message
    assert "falling back" not in caplog.text  # the checkpoint is fine: an older one would not fit either
    _assert_unchanged(live, before)


def test_a_module_entry_that_is_not_a_tensor_is_refused_before_loading(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    _two(store)
    doc = _doc(store, 2)
    model = doc["replicated"]["tree"]["model"]
    items = model["items"] if "items" in model else None
    if items is not None:  # an OrderedDict with _metadata: [[key, value], ...]
        next(item for item in items if item[0] == "fc2.bias")[1] = 5
    else:
        model["fc2.bias"] = 5
    rewrite_manifest(store, 2, doc, repoint=True)
    live = _live()
    before = _snapshot(live)
    with pytest.raises(CheckpointError, match=r"entry 'model': 'fc2.bias' is not a tensor in the checkpoint \(int\)"):
        _manager(store).restore(live)
    _assert_unchanged(live, before)


def test_restore_into_the_same_model_still_loads_in_place(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    _two(store)
    live = _live()
    ptrs = {n: p.data_ptr() for n, p in live["model"].named_parameters()}
    assert _manager(store).restore(live) == 2
    assert_same_state(live, state_for(2))
    assert {n: p.data_ptr() for n, p in live["model"].named_parameters()} == ptrs


def test_nothing_to_restore_is_still_not_found(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError):
        _manager(Store(str(tmp_path))).restore({"model": Net()})


def test_every_restore_failure_is_a_streamio_error(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    _two(store)
    store.put(layout.manifest_path(1), b"[" * 5000)
    store.put(layout.manifest_path(2), b'{"format": "streamio.checkpoint/1", "step": 2, "files": "x"}')
    with pytest.raises(StreamioError, match="no checkpoint under .* verifies"):
        _manager(store).restore(fresh_state())
