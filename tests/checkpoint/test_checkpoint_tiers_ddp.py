"""Three gloo ranks of one node share a local tier; restore agrees on the newest step every rank can get (issue 25).

Every group of ranks is forked from one zygote (tests/support/sharded_procs.py) and runs a scenario
of tests/support/tiers_worker.py. Three ranks save steps 1-5 with ``durable_every=2`` over moto S3:
the root holds steps 2 and 4 (its retention keeps two), every rank's local root (``rank-0000R/`` of
one shared directory) holds 4 and 5. States: ``plain`` (model + Adam replicated, divided among the
ranks for writing, and per-rank data) and ``fsdp`` (FSDP2 shards and a DTensor as well). Then each
case damages a copy of the local directory and three fresh ranks restore:

* intact: every rank restores step 5 locally and reads no part from the store;
* one rank a step behind (its step 5 lost, its pointer at 4): all ranks agree on 4, read locally;
* one rank's directory deleted: all agree on 4; only that rank's parts come from the store;
* a part of step 5 corrupted on one rank (no other copy): all agree on 4, read locally;
* all three at once, with the corrupted part in step 4: all agree on 4; the store serves that part
  and the deleted rank's parts, nothing else;
* one rank per node, each with a directory of its own, one node lost: all agree on 4; the lost
  node's rank reads its shards from the store, the others read theirs locally;
* one rank per node, all intact: step 5, held only by the nodes' local tiers together, restores
  with no part read from the store (each rank serves what its node holds: restore fan-out).

Every rank checks every element of what it restored (``support.sharded_worker.check``); the proxy
in front of moto logs which part objects the ranks read from the store.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamio.checkpoint import root
from streamio.checkpoint.format.pointer import Pointer
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.sharded_procs import Zygote

pytestmark = pytest.mark.slow

WORLD = 3
WORKER = "support.tiers_worker"


@pytest.fixture(scope="module")
def saved(zygote: Zygote, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Steps 1-5 saved by three ranks, for each kind of state: the root's URL and the local directory."""
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    saved: dict[str, Any] = {"s3": s3}
    for kind in ("plain", "fsdp"):
        t0 = time.monotonic()
        args = {"root": s3.url(kind), "storage": s3.storage_options(), "local": str(tmp_path_factory.mktemp(kind)),
                "kind": kind, "steps": [1, 2, 3, 4, 5], "world": WORLD}
        assert [r["durable"] for r in zygote.run("save", WORLD, args, worker=WORKER)] == [4] * WORLD
        print(f"3-rank {kind} save of 5 steps: {time.monotonic() - t0:.1f} s")
        store = Store(args["root"], s3.storage_options())
        assert root.committed_steps(store) == [2, 4] and root.pointed_step(store) == 4
        saved[kind] = args
    return saved


# ------------------------------------------------------------------ damage to a local directory
def _rank_root(local: Path, rank: int) -> Store:
    return Store(str(local / f"rank-{rank:05d}"))


def _sdir(store: Store, step: int) -> str:
    [ref] = [s for s in root.committed_saves(store) if s.step == step]
    return ref.path


def _delete(local: Path, rank: int) -> None:
    shutil.rmtree(local / f"rank-{rank:05d}")


def _corrupt(local: Path, rank: int, step: int) -> str:
    """Flip a byte in the first part ``rank`` wrote of ``step`` (in its own local root); returns
    the part's path in the save."""
    store = _rank_root(local, rank)
    sdir = _sdir(store, step)
    m = root.read_manifest(store, step, path=sdir)
    part = next(f for f in m.files if f.rank == rank and f.path.endswith("-00000.bin"))
    key = m.place(sdir).path(part.rank, part.path)
    path = local / f"rank-{rank:05d}" / key
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    return key


def _behind(local: Path, rank: int) -> None:
    """``rank`` a step behind: its newest local save gone, its local pointer at the one before."""
    store = _rank_root(local, rank)
    newest, previous = sorted(root.committed_saves(store), key=lambda s: s.step)[::-1][:2]
    root.delete_save(store, newest.path)
    m = root.read_manifest(store, previous.step, path=previous.path)
    pointer = Pointer(step=m.step, path=previous.path, manifest_checksum=root.manifest_digest(store, previous.path),
                      save_id=m.save_id, created=m.created, timeline=m.line)
    root.swap_pointer(store, pointer, None)


# ------------------------------------------------------------------ one case
def _restore(zygote: Zygote, saved: dict[str, Any], kind: str, tmp_path: Path,
             damage: Callable[[Path], Any]) -> tuple[int, set[str], Any]:
    """Copy the saved local directory, damage it, restore on three fresh ranks; returns the step
    every rank restored, the part objects read from the store (paths in the root) and what
    ``damage`` returned."""
    s3: S3Endpoint = saved["s3"]
    local = tmp_path / "local"
    shutil.copytree(saved[kind]["local"], local)
    damaged = damage(local)
    t0 = time.monotonic()
    with FaultProxy(s3.endpoint_url) as proxy:
        args = {**saved[kind], "local": str(local), "storage": s3.storage_options(proxy.endpoint_url)}
        results = zygote.run("restore", WORLD, args, worker=WORKER)
        prefix = f"/{s3.bucket}/{kind}/"
        read = {r.path.split("?")[0].removeprefix(prefix) for r in proxy.log()
                if r.method == "GET" and "/part-" in r.path and 200 <= r.status < 300}
    print(f"3-rank {kind} restore: {time.monotonic() - t0:.1f} s")
    steps = {r["step"] for r in results}
    assert len(steps) == 1, results
    bad = {rank: r["checks"] for rank, r in enumerate(results)
           if not all(v for k, v in r["checks"].items() if k != "bad")}
    assert not bad, f"ranks whose restored state is not exact: {bad}"
    return steps.pop(), read, damaged


def _parts_of(saved: dict[str, Any], kind: str, rank: int, step: int) -> set[str]:
    store = Store(saved[kind]["root"], saved["s3"].storage_options())
    sdir = _sdir(store, step)
    m = root.read_manifest(store, step, path=sdir)
    return {m.place(sdir).path(f.rank, f.path) for f in m.files if f.rank == rank}


@pytest.mark.parametrize("kind", ["plain", "fsdp"])
def test_every_rank_restores_its_intact_local_copies_and_reads_no_part_from_the_store(
    zygote: Zygote, saved: dict[str, Any], kind: str, tmp_path: Path
) -> None:
    step, read, _ = _restore(zygote, saved, kind, tmp_path, lambda local: None)
    assert (step, read) == (5, set())


def test_one_rank_a_step_behind_makes_every_rank_restore_the_step_before(
    zygote: Zygote, saved: dict[str, Any], tmp_path: Path
) -> None:
    step, read, _ = _restore(zygote, saved, "plain", tmp_path, lambda local: _behind(local, 0))
    assert (step, read) == (4, set())


def test_a_lost_local_directory_is_read_from_the_root_and_the_others_locally(
    zygote: Zygote, saved: dict[str, Any], tmp_path: Path
) -> None:
    step, read, _ = _restore(zygote, saved, "plain", tmp_path, lambda local: _delete(local, 1))
    assert step == 4 and read and read <= _parts_of(saved, "plain", 1, 4), read


def test_a_corrupted_local_copy_with_no_other_is_never_loaded(
    zygote: Zygote, saved: dict[str, Any], tmp_path: Path
) -> None:
    step, read, _ = _restore(zygote, saved, "plain", tmp_path, lambda local: _corrupt(local, 2, 5))
    assert (step, read) == (4, set())


@pytest.mark.parametrize("kind", ["plain", "fsdp"])
def test_one_deleted_one_corrupted_one_a_step_behind(
    zygote: Zygote, saved: dict[str, Any], kind: str, tmp_path: Path
) -> None:
    def damage(local: Path) -> str:
        _delete(local, 1)
        _behind(local, 0)
        return _corrupt(local, 2, 4)

    step, read, corrupted = _restore(zygote, saved, kind, tmp_path, damage)
    from_rank1 = _parts_of(saved, kind, 1, 4)
    assert step == 4 and corrupted in read and read & from_rank1, (read, corrupted)
    assert read <= from_rank1 | {corrupted}, read - from_rank1


def test_a_lost_node_s_rank_reads_its_shards_from_the_root_and_the_others_their_own_locally(
    zygote: Zygote, saved: dict[str, Any], tmp_path: Path
) -> None:
    """One rank per node, each with a local directory of its own (no sibling to read from); node 1
    is lost. Every rank restores the newest durable step; rank 1 reads its own shards from the
    root, ranks 0 and 2 none of theirs (what they need of the others' parts, they read from the
    root too: the replicated entries are spread over the ranks that wrote them)."""
    s3: S3Endpoint = saved["s3"]
    args = {"root": s3.url("nodes"), "storage": s3.storage_options(), "local": str(tmp_path / "node-{rank}"),
            "kind": "fsdp", "steps": [1, 2, 3, 4, 5], "world": WORLD}
    assert [r["durable"] for r in zygote.run("save", WORLD, args, worker=WORKER)] == [4] * WORLD
    shutil.rmtree(tmp_path / "node-1")
    proxies = [FaultProxy(s3.endpoint_url).start() for _ in range(WORLD)]
    try:
        by_rank = [s3.storage_options(p.endpoint_url) for p in proxies]  # each rank through a proxy of its own
        results = zygote.run("restore", WORLD, {**args, "storage": by_rank}, worker=WORKER)
        own = [{r.path for r in p.log() if r.method == "GET" and f"/rank-{rank:05d}/part-" in r.path
                and 200 <= r.status < 300} for rank, p in enumerate(proxies)]
    finally:
        for p in proxies:
            p.stop()
    assert [r["step"] for r in results] == [4] * WORLD, results
    assert all(all(v for k, v in r["checks"].items() if k != "bad") for r in results), results
    assert own[1] and not own[0] and not own[2], own


@pytest.mark.parametrize("kind", ["plain", "fsdp"])
def test_a_save_spread_over_the_nodes_local_tiers_restores_without_the_store(
    zygote: Zygote, saved: dict[str, Any], tmp_path: Path, kind: str
) -> None:
    """One rank per node, each with a directory of its own: each node holds only the parts its rank
    wrote (its share of the replicated state, its shards). Step 5, on the local tiers only, still
    restores: each rank serves the parts it holds to the others over the process group (restore
    fan-out), and no rank reads a part from the store."""
    s3: S3Endpoint = saved["s3"]
    args = {"root": s3.url(f"spread-{kind}"), "storage": s3.storage_options(), "local": str(tmp_path / "node-{rank}"),
            "kind": kind, "steps": [1, 2, 3, 4, 5], "world": WORLD}
    assert [r["durable"] for r in zygote.run("save", WORLD, args, worker=WORKER)] == [4] * WORLD
    with FaultProxy(s3.endpoint_url) as proxy:
        results = zygote.run("restore", WORLD, {**args, "storage": s3.storage_options(proxy.endpoint_url)},
                             worker=WORKER)
        parts = [r.path for r in proxy.log() if r.method == "GET" and "/part-" in r.path]
    assert [r["step"] for r in results] == [5] * WORLD, results
    assert all(all(v for k, v in r["checks"].items() if k != "bad") for r in results), results
    assert parts == [], parts
