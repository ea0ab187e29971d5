"""Bounded saves (issue 37): ``SaveOptions(save_timeout_s=...)`` over moto behind a FaultProxy that
stalls the save's part uploads (no answer until released).

A save that does not commit in time raises ``SaveTimeoutError`` within the bound (plus a margin for
these shared CPUs) naming the rank and the part it waited for; the pointer and the listing still
name the previous step; the stuck upload is abandoned (``close`` returns at once, the interpreter
exits at once, a WARNING names it); once the store answers again the next save commits and
restores bit-exact, and what the abandoned upload wrote late is removed.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions
from streamio.checkpoint.format import layout
from streamio.errors import CheckpointError, ConfigError, SaveTimeoutError
from streamio.storage import Store
from streamio.testing import S3Endpoint
from streamio.testing.proxy import FaultProxy
from support.ckpt import light_state_for

BOUND = 3.0
MARGIN = 3.0  # two shared CPUs, other test workers beside: generous, still far below "for ever"
OPTS = SaveOptions(part_size=64 << 10, concurrency=2, save_timeout_s=BOUND)


def _bounded(s3: S3Endpoint, proxy: FaultProxy, **kwargs: object) -> CheckpointManager:
    """Step 1 saved without a bound (a first save here pays for the first connection, planning
    and a loaded machine), then a bounded manager through ``proxy`` that continues it."""
    with CheckpointManager(s3.url("run"), async_save=False, storage_options=s3.storage_options(),
                           options=SaveOptions(part_size=64 << 10)) as first:
        first.save(1, light_state_for(1))
    ckpt = CheckpointManager(s3.url("run"), options=OPTS, storage_options=s3.storage_options(proxy.endpoint_url),
                             **kwargs)  # type: ignore[arg-type]
    assert ckpt.adopt() == 1
    return ckpt


def _stall_parts(proxy: FaultProxy) -> None:
    proxy.stall(method="PUT", path_contains="/part-")


def _held(proxy: FaultProxy, n: int = 1, within_s: float = 10.0) -> None:
    end = time.monotonic() + within_s
    while proxy.held() < n and time.monotonic() < end:
        time.sleep(0.01)


def _stray(store: Store, save_id: str) -> list[str]:
    return [o.path for o in store.list("") if layout.save_id_at(o.path) == save_id] if store.exists("") else []


def test_save_timeout_must_be_positive_finite_or_none() -> None:
    assert SaveOptions().save_timeout_s is None and SaveOptions(save_timeout_s=0.5).save_timeout_s == 0.5
    for bad in (0, -1.0, float("inf"), float("nan"), True, "60"):
        with pytest.raises(ConfigError, match=r"save_timeout_s must be a positive finite number of seconds or None"):
            SaveOptions(save_timeout_s=bad)  # type: ignore[arg-type]


def test_sync_save_whose_parts_stall_fails_within_the_bound_and_the_next_one_commits(
    s3: S3Endpoint, moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    direct = Store(s3.url("run"), s3.storage_options())
    with FaultProxy(moto_endpoint) as proxy:
        ckpt = _bounded(s3, proxy, async_save=False)
        _stall_parts(proxy)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.save.bound"), \
                pytest.raises(SaveTimeoutError) as info:
            ckpt.save(2, light_state_for(2))
        took = time.monotonic() - began
        assert BOUND - 0.1 <= took <= BOUND + MARGIN, took
        message = str(info.value)
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, CheckpointError)
        assert f"saving step 2 to {s3.url('run')}" in message and "save_timeout_s=3 s" in message
        assert "rank 0 was uploading its share, waiting for s3://" in message and "/rank-00000/part-" in message
        assert "The previous checkpoint stays current" in message and "SaveOptions(save_timeout_s=...)" in message
        assert any("rank 0 abandons uploading its share after save_timeout_s=3 s" in r.getMessage()
                   for r in caplog.records)
        # nothing of step 2 is visible: the pointer and the listing name step 1 only
        assert ckpt.latest_step() == 1 and ckpt.steps() == [1]
        found = re.search(r"s3://\S+?/run/(\S+\.bin)", message)
        assert found is not None
        save_id = layout.save_id_at(found.group(1))
        assert save_id and save_id in message
        # the store answers again: the held PUT lands late, the abandoned thread then removes its share
        proxy.release()
        ckpt.save(3, light_state_for(3))
        assert ckpt.latest_step() == 3 and ckpt.steps() == [1, 3]
        end = time.monotonic() + 15
        while _stray(direct, save_id) and time.monotonic() < end:
            time.sleep(0.1)
        assert _stray(direct, save_id) == []
        ckpt.close()
    fresh = light_state_for(0)
    assert CheckpointManager(s3.url("run"), storage_options=s3.storage_options()).restore(fresh) == 3
    want = light_state_for(3)
    for (k, a), (_, b) in zip(fresh["model"].state_dict().items(), want["model"].state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert fresh["counters"] == {"step": 3} and torch.equal(fresh["extra"], want["extra"])


def test_async_save_timeout_is_raised_by_the_next_save_and_close_returns_at_once(
    s3: S3Endpoint, moto_endpoint: str
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        ckpt = _bounded(s3, proxy)
        _stall_parts(proxy)
        began = time.monotonic()
        ckpt.save(2, light_state_for(2))
        assert time.monotonic() - began < BOUND  # returns after the host copy
        with pytest.raises(SaveTimeoutError, match=r"saving step 2 .* within save_timeout_s=3 s: rank 0 was "
                                                   r"uploading its share, waiting for s3://\S+/rank-00000/part-"):
            ckpt.save(3, light_state_for(3))
        assert time.monotonic() - began <= BOUND + MARGIN
        _held(proxy)
        assert proxy.held() >= 1  # the abandoned upload is still stuck ...
        began = time.monotonic()
        ckpt.close()  # ... and nothing waits for it
        assert time.monotonic() - began < 1.0
        assert ckpt.latest_step() == 1 and ckpt.steps() == [1]


CHILD = r"""
import json, sys, time
from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions
from support.ckpt import light_state_for
ckpt = CheckpointManager(sys.argv[1], options=SaveOptions(part_size=64 << 10, save_timeout_s=float(sys.argv[3])),
                         storage_options=json.loads(sys.argv[2]))
ckpt.save(2, light_state_for(2))
print(f"saved {time.time()}", flush=True)
"""


@pytest.mark.slow
def test_interpreter_exit_after_a_timed_out_save_is_prompt_and_reports_it(s3: S3Endpoint, moto_endpoint: str) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        CheckpointManager(s3.url("run"), async_save=False, options=SaveOptions(part_size=64 << 10),
                          storage_options=s3.storage_options()).save(1, light_state_for(1))
        _stall_parts(proxy)
        env = {"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        options = json.dumps(s3.storage_options(proxy.endpoint_url))
        child = subprocess.run([sys.executable, "-c", CHILD, s3.url("run"), options, str(BOUND)],
                               capture_output=True, text=True, env=env, timeout=120)
        ended = time.time()
        assert proxy.held() >= 1  # still stuck when the child had gone
    assert child.returncode == 1, child.stderr[-3000:]
    assert child.stdout.startswith("saved ")
    took = ended - float(child.stdout.split()[1])  # from the async save's return to the child's end
    assert "checkpoint step 2 was not committed to" in child.stderr and "SaveTimeoutError" in child.stderr
    assert "abandons uploading its share" in child.stderr
    assert Store(s3.url("run"), s3.storage_options()).exists("latest.json")
    assert CheckpointManager(s3.url("run"), storage_options=s3.storage_options()).latest_step() == 1
    assert took <= BOUND + MARGIN, took  # the exit waited for the save's bound, not for the stuck upload


@pytest.mark.slow
def test_with_a_local_tier_the_bound_covers_the_upload_and_the_local_copy_stands(
    s3: S3Endpoint, moto_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        ckpt = _bounded(s3, proxy, local=LocalTier(str(tmp_path / "tier")))
        _stall_parts(proxy)
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="streamio.checkpoint.save.tiers"):
            ckpt.save(2, light_state_for(2))
            ckpt.wait()  # the upload failed within its bound: logged, the local copy stands
        assert time.monotonic() - began <= BOUND + MARGIN
        assert any("checkpoint step 2 is committed locally but could not be made durable" in r.getMessage()
                   and "did not commit within save_timeout_s=3 s: rank 0 was uploading its share" in r.getMessage()
                   for r in caplog.records)
        assert ckpt.durable_step is None and ckpt.latest_step() == 1 and ckpt.steps() == [1]
        began = time.monotonic()
        ckpt.close()
        assert time.monotonic() - began < 1.0
        fresh = light_state_for(0)
        local = CheckpointManager(s3.url("run"), local=LocalTier(str(tmp_path / "tier")),
                                  storage_options=s3.storage_options())
        assert local.restore(fresh) == 2 and fresh["counters"] == {"step": 2}  # the local copy


@pytest.mark.slow
def test_a_manifest_that_lands_after_the_bound_is_taken_back_and_no_listing_offers_the_step(
    s3: S3Endpoint, moto_endpoint: str
) -> None:
    direct = Store(s3.url("run"), s3.storage_options())
    with FaultProxy(moto_endpoint) as proxy:
        ckpt = _bounded(s3, proxy, async_save=False)
        proxy.stall(method="PUT", path_contains="/manifest.json")
        began = time.monotonic()
        with pytest.raises(SaveTimeoutError) as info:
            ckpt.save(2, light_state_for(2))
        assert time.monotonic() - began <= BOUND + MARGIN
        message = str(info.value)
        assert "rank 0 was publishing the manifest and the pointer, waiting for s3://" in message
        assert "/step-000000002/manifest.json" in message and "The previous checkpoint stays current" in message
        proxy.release()  # the manifest lands now; its pointer swap is refused, the manifest taken back
        end = time.monotonic() + 15
        while not (proxy.count("PUT", "step-000000002/manifest.json") and proxy.count("DELETE", "manifest.json")):
            assert time.monotonic() < end, proxy.log()
            time.sleep(0.05)
        assert direct.exists("step-000000002/manifest.json") is False
        assert ckpt.latest_step() == 1 and ckpt.steps() == [1]
        ckpt.save(2, light_state_for(2))  # the same step again, once the store answers
        assert ckpt.latest_step() == 2 and ckpt.steps() == [1, 2]
        ckpt.close()


def test_taking_a_late_manifest_back_never_touches_another_saves_manifest(tmp_path: Path) -> None:
    from streamio.checkpoint.save.abandon import withdraw_manifest

    ckpt = CheckpointManager(str(tmp_path / "root"), async_save=False)
    ckpt.save(1, {"w": torch.arange(10)})
    store, sdir = Store(str(tmp_path / "root")), layout.step_dir(1)
    before = store.read(layout.manifest_at(sdir))
    withdraw_manifest(store, 1, sdir, "another-save-id")  # a save of the same step by someone else
    assert store.read(layout.manifest_at(sdir)) == before and ckpt.steps() == [1] and ckpt.latest_step() == 1
