"""Restore fan-out (issue 26): replicated state is read from the store once per job, not per rank.

Real rank processes (torchrun, gloo) restore through the fault proxy, which counts the bytes of
every part GET: with fan-out the store serves each part once whatever the world size; without it,
once per rank. The pointer and the manifest are read once per job whatever the setting. A share
that does not verify on the rank that read it fails the restore on every rank alike (walked past
like any damaged checkpoint), and nothing is loaded. Bytes a rank sends damaged (its own reads
verified) are read again by the rank that received them and condemn no checkpoint; a rank killed
mid-broadcast is named as a lost peer, not as a usage mistake.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint.format import layout
from streamio.checkpoint.root import committed_saves, read_bad, read_manifest, read_pointer
from streamio.checkpoint.tensors.fanout import assign
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.ckpt_fanout import run_ranks, start_ranks


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


# ------------------------------------------------------------------ the assignment (pure)
wants = st.lists(
    st.one_of(st.none(), st.dictionaries(st.tuples(st.sampled_from("abcdef"), st.just(0), st.integers(1, 4)),
                                         st.tuples(st.integers(0, 1000), st.booleans()), max_size=8)),
    min_size=1, max_size=6,
)


@given(wants)
def test_every_request_two_ranks_want_is_read_by_one_of_them_preferring_a_holder(ws: list[dict | None]) -> None:  # type: ignore[type-arg]
    askers = {k: [r for r, w in enumerate(ws) if w and k in w] for w in ws for k in (w or {})}
    holders = {k: [r for r in who if ws[r][k][1]] for k, who in askers.items()}  # type: ignore[index]
    out = assign(ws)
    assert set(out) == {k for k, who in askers.items() if len(who) > 1}
    assert all(out[k] in (holders[k] or askers[k]) for k in out)
    assert assign(list(ws)) == out  # the same on every rank


@given(st.integers(2, 8), st.lists(st.integers(1, 10_000), min_size=1, max_size=40))
def test_when_every_rank_wants_everything_shares_differ_by_at_most_one_request(world: int, sizes: list[int]) -> None:
    everything = {(f"part-{i}", 0, s): (s, False) for i, s in enumerate(sizes)}
    out = assign([everything] * world)
    load = [sum(everything[k][0] for k, r in out.items() if r == rank) for rank in range(world)]
    assert max(load) - min(load) <= max(sizes)


# ------------------------------------------------------------------ rank processes
def _saved(s3: S3Endpoint, proxy: FaultProxy, tmp_path: Path, name: str) -> tuple[str, dict, Store, str, Any]:  # type: ignore[type-arg]
    """Step 1 saved by 2 ranks through the proxy: the root, its options through the proxy, a direct
    store, the save directory and its manifest."""
    options = s3.storage_options(proxy.endpoint_url)
    root = s3.url(name)
    assert all(r["ok"] for r in run_ranks(2, "save", root, options, tmp_path / "save"))
    store = Store(root, s3.storage_options())
    pointer = read_pointer(store)
    assert pointer is not None
    return root, options, store, pointer.path, read_manifest(store, 1, path=pointer.path)


def _part_bytes(proxy: FaultProxy) -> int:
    return sum(r.response_bytes for r in proxy.log() if r.method == "GET" and "/part-" in r.path)


@pytest.mark.slow
def test_replicated_parts_are_read_once_per_job_at_any_world_size(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    root, options, _, _, manifest = _saved(s3, s3_proxy, tmp_path, "fanout")
    size = sum(f.size for f in manifest.files)
    read: dict[tuple[int, bool], int] = {}
    for world, mode in [(2, "restore"), (3, "restore"), (3, "restore-nofanout")]:
        s3_proxy.clear()
        results = run_ranks(world, mode, root, options, tmp_path / f"{mode}-{world}")
        assert all(r["ok"] and r["step"] == 1 for r in results), results
        read[(world, mode == "restore")] = _part_bytes(s3_proxy)
        # the pointer and the manifest: read by rank 0 for every rank
        assert s3_proxy.count("GET", "manifest.json") == 1 and s3_proxy.count("GET", "latest.json") == 1, world
    assert size <= read[(2, True)] <= 1.05 * size and size <= read[(3, True)] <= 1.05 * size, (read, size)
    assert read[(3, False)] >= 2.5 * size, (read, size)  # every rank reads it all without fan-out


@pytest.mark.slow
def test_a_share_that_does_not_verify_fails_the_restore_on_every_rank(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    root, options, store, sdir, manifest = _saved(s3, s3_proxy, tmp_path, "fanout-bad")
    victim = max((f for f in manifest.files), key=lambda f: f.size)  # a replicated part: every rank wants it
    key = manifest.place(sdir).path(victim.rank, victim.path)
    data = bytearray(store.read(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    results = run_ranks(2, "restore", root, options, tmp_path / "restore")
    assert not any(r["ok"] for r in results), results
    assert all("no checkpoint under" in r["error"] and "verifies" in r["error"] for r in results), results
    assert all("the object is corrupt" in r["error"] for r in results), results  # the reader's words, agreed


@pytest.mark.slow
def test_bytes_a_rank_sends_damaged_are_read_again_by_the_receiver_and_condemn_no_checkpoint(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    root, options, store, sdir, _ = _saved(s3, s3_proxy, tmp_path, "fanout-sent")
    # rank 0 flips a byte of all it broadcasts: the manifest and its share of the parts
    results = run_ranks(2, "restore", root, options, tmp_path / "restore", env={"DAMAGE_SENT_BY": "0"})
    assert all(r["ok"] and r["step"] == 1 for r in results), results
    received = results[1]["warnings"]
    assert any("that rank 0 read and sent do not verify here" in w and "not in the store" in w
               for w in received), received
    assert any("the bytes rank 0 read and sent of" in w and "a read here verified" in w for w in received), received
    saves = committed_saves(store)
    assert [s.step for s in saves] == [1] and not saves[0].bad and read_bad(store, sdir) is None


@pytest.mark.slow
def test_a_rank_killed_during_the_restore_broadcast_is_named_as_lost_not_as_a_usage_mistake(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    root, options, store, sdir, _ = _saved(s3, s3_proxy, tmp_path, "fanout-kill")
    out = tmp_path / "restore"
    procs = start_ranks(2, "restore-kill", root, options, out)
    t0 = time.monotonic()
    _, err = procs[0].communicate(timeout=120)
    elapsed = time.monotonic() - t0
    procs[1].communicate(timeout=30)
    assert procs[1].returncode == -9, "rank 1 was to kill itself mid-broadcast"
    result = json.loads((out / "rank-0.json").read_text())
    error = result["error"]
    assert error.startswith("CheckpointError: rank 0: a checkpoint collective among the 2 ranks failed while "
                            "receiving rank 1's bytes"), error
    assert "a restore loads nothing" in error and "call them on every rank" not in error, error
    again = result["again"]  # the manager refuses to go on, naming the first failure
    assert "an earlier checkpoint collective of this CheckpointManager failed" in again, again
    assert "receiving rank 1's bytes" in again and "call them on every rank" not in again, again
    assert result["seconds"] < 30 and elapsed < 60, (result, elapsed)
    assert read_bad(store, sdir) is None and layout.parse_save_dir(sdir) is not None
    pointer = read_pointer(store)
    assert pointer is not None and pointer.path == sdir
