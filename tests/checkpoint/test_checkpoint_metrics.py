"""Checkpoint phases and part bytes in the metrics, against the manifests and the proxy's log.

Saves go to moto through the fault proxy: the part bytes counted as written equal the part sizes
the manifests record and the PUT bodies the proxy forwarded for those objects; a restore's read
bytes equal the restored manifest's parts and the proxy's GET bodies for them. ``blocked`` is
observed once per ``save()``, ``durable`` once per save made durable (an async save's after
``wait()``), ``local`` once per local commit, ``restore`` once per restore; a torch DCP save and load through
StreamioWriter / StreamioReader the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamio import metrics
from streamio.checkpoint.format import layout
from streamio.checkpoint.manager import CheckpointManager
from streamio.checkpoint.options import LocalTier, SaveOptions
from streamio.checkpoint.root import read_manifest
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.ckpt import PART_SIZE, light_state_for

OPTIONS = SaveOptions(part_size=PART_SIZE, concurrency=4)


def phases(snap: dict[str, Any]) -> dict[str, tuple[int, float]]:
    """phase -> (observations, seconds)."""
    return {k.split('"')[1]: (v["count"], v["sum"]) for k, v in snap["streamio_checkpoint_seconds"].items()}


def part_bytes(store: Store, step: int) -> dict[str, int]:
    """The stored size of each part of ``step``, by its key below the root (as the proxy sees it)."""
    manifest = read_manifest(store, step)
    place = manifest.place(layout.step_dir(step))
    return {place.path(f.rank, f.path): f.size for f in manifest.files}


def proxied(proxy: FaultProxy, method: str, keys: dict[str, int]) -> int:
    """Body bytes the proxy forwarded for ``keys`` (request bodies of PUTs, response bodies of GETs)."""
    records = [r for r in proxy.log() if r.method == method and 200 <= r.status < 300
               and any(r.path.endswith("/" + k) for k in keys)]
    return sum(r.request_bytes if method == "PUT" else r.response_bytes for r in records)


def test_save_and_restore_phases_and_part_bytes_match_the_manifests_and_the_proxy(
    s3: S3Endpoint, moto_endpoint: str
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        options = s3.storage_options(proxy.endpoint_url)
        metrics.reset()
        with CheckpointManager(s3.url("ck"), storage_options=options, options=OPTIONS) as ckpt:
            ckpt.save(1, light_state_for(1))
            ckpt.save(2, light_state_for(2))  # waits for step 1's commit first
            stats = ckpt.wait()
        snap = metrics.snapshot()
        store = Store(s3.url("ck"), options)
        written = {**part_bytes(store, 1), **part_bytes(store, 2)}
        seen = phases(snap)
        assert seen["blocked"][0] == 2 and seen["durable"][0] == 2 and "restore" not in seen and "local" not in seen
        assert stats is not None and seen["durable"][1] >= stats.durable_s  # step 2's durable is one of the two
        assert snap["streamio_checkpoint_bytes_total"] == {'direction="write"': sum(written.values())}
        assert proxied(proxy, "PUT", written) == sum(written.values())

        metrics.reset()
        proxy.clear()
        with CheckpointManager(s3.url("ck"), storage_options=options, options=OPTIONS) as again:
            assert again.restore(light_state_for(0)) == 2
        snap = metrics.snapshot()
        read = part_bytes(store, 2)
        assert {k: v[0] for k, v in phases(snap).items()} == {"restore": 1}
        assert snap["streamio_checkpoint_bytes_total"] == {'direction="read"': sum(read.values())}
        assert proxied(proxy, "GET", read) == sum(read.values())


def test_a_local_tier_observes_local_and_durable_once_per_save(tmp_path: Path) -> None:
    metrics.reset()
    tier = LocalTier(str(tmp_path / "nvme"))
    with CheckpointManager(str(tmp_path / "root"), options=OPTIONS, local=tier) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, light_state_for(step), durable=True if step == 3 else "local")
        ckpt.wait()
    seen = phases(metrics.snapshot())
    assert {k: v[0] for k, v in seen.items()} == {"blocked": 3, "local": 3, "durable": 1}


def test_a_torch_dcp_save_and_load_observe_the_same_phases_and_bytes(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from streamio.checkpoint import StreamioReader, StreamioWriter

    root = str(tmp_path / "dcp")
    metrics.reset()
    dcp.save(light_state_for(1), storage_writer=StreamioWriter(root, step=1, options=OPTIONS))
    snap = metrics.snapshot()
    written = part_bytes(Store(root), 1)
    assert {k: v[0] for k, v in phases(snap).items()} == {"blocked": 1, "durable": 1}
    assert snap["streamio_checkpoint_bytes_total"] == {'direction="write"': sum(written.values())}

    metrics.reset()
    dcp.load(light_state_for(0), storage_reader=StreamioReader(root))
    snap = metrics.snapshot()
    assert {k: v[0] for k, v in phases(snap).items()} == {"restore": 1}
    assert snap["streamio_checkpoint_bytes_total"] == {'direction="read"': sum(written.values())}
