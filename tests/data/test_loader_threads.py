"""StreamingDataLoader(threads=N): the batches and the state of num_workers=0, made on threads of this process."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.data.options import DatasetOptions
from streamio.errors import ConfigError, DatasetError, StreamioError
from streamio.testing import FaultProxy, S3Endpoint
from support.dataset import all_keys, key, make_dataset
from support.loaders import take_batches

COUNTS = [5, 7, 3, 9, 11, 2, 8]  # 45 samples
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ds_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "uneven")
    make_dataset(url, None, COUNTS)
    return url


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("streamio-loader")]


def with_reversed(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform that keeps the bytes, adds one member and records the thread it ran on."""
    return {**sample, "rev": sample["txt"][::-1], "thread": threading.current_thread().name}


def read(url: str, *, batch: int, stop_after: int | None = None, state: Any = None, **kw: Any) -> tuple[
        list[dict[str, Any]], Any]:
    ds = StreamingDataset(url, batch_size=batch, transform=kw.pop("transform", with_reversed),
                          decode=kw.pop("decode", None), options=kw.pop("options", None))
    ds.set_epoch(1)
    return take_batches(StreamingDataLoader(ds, **kw), state, stop_after)


def keys(batches: list[dict[str, Any]]) -> list[list[str]]:
    return [b["__key__"] for b in batches]


@pytest.mark.parametrize(("threads", "batch", "drop_last"), [(1, 4, False), (2, 3, True), (4, 1, False), (3, 8, False)])
def test_thread_batches_are_those_of_num_workers_0_key_for_key_and_byte_for_byte(
    ds_url: str, threads: int, batch: int, drop_last: bool
) -> None:
    plain, plain_state = read(ds_url, batch=batch, drop_last=drop_last)
    threaded, state = read(ds_url, batch=batch, drop_last=drop_last, threads=threads)
    assert keys(threaded) == keys(plain) and len(plain) == len(StreamingDataLoader(
        StreamingDataset(ds_url, batch_size=batch), drop_last=drop_last))
    for a, b in zip(plain, threaded, strict=True):
        assert a["txt"] == b["txt"] and a["rev"] == b["rev"] and a["__index__"] == b["__index__"]
        assert torch.equal(a["cls"], b["cls"]) if isinstance(a["cls"], torch.Tensor) else a["cls"] == b["cls"]
    assert {t for b in plain for t in b["thread"]} == {"MainThread"}
    assert {t for b in threaded for t in b["thread"]} <= {f"streamio-loader-{i}" for i in range(threads)}
    assert state == plain_state  # the end of the same epoch
    assert not loader_threads()


def test_batches_are_made_on_several_threads_at_once(ds_url: str) -> None:
    lock, running, most = threading.Lock(), [0], [0]

    def slow(sample: dict[str, Any]) -> dict[str, Any]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)  # releases the GIL, as a JPEG decode does
        with lock:
            running[0] -= 1
        return sample

    batches, _ = read(ds_url, batch=2, threads=3, transform=slow)
    assert sum(len(b["__key__"]) for b in batches) == len(all_keys(COUNTS))
    assert 2 <= most[0] <= 3


def test_a_thread_state_is_the_num_workers_0_state_and_resumes_with_workers_and_back(ds_url: str) -> None:
    full, _ = read(ds_url, batch=4)
    head, state = read(ds_url, batch=4, threads=2, stop_after=3)
    assert keys(head) == keys(full[:3])
    ds = StreamingDataset(ds_url, batch_size=4, transform=with_reversed)
    ds.set_epoch(1)
    loader = StreamingDataLoader(ds, threads=2)
    for n, _ in enumerate(loader, 1):
        if n == 3:
            time.sleep(0.1)  # the threads run ahead: 4 batches made, 3 handed out
            assert loader.state_dict() == state  # taken inside the loop, as a checkpoint is
            break
    _, plain_state = read(ds_url, batch=4, stop_after=3)
    assert state == plain_state  # the same position, so it resumes wherever num_workers=0's does
    rest, _ = read(ds_url, batch=4, threads=3, state=state)
    assert keys(rest) == keys(full[3:])
    # a thread state resumed by worker processes: the rest of the epoch, each sample once
    in_workers, _ = read(ds_url, batch=4, num_workers=2, state=state)
    taken = [k for b in keys(head) + keys(in_workers) for k in b]
    assert sorted(taken) == sorted(k for b in keys(full) for k in b)
    # and back: a state of 2 workers resumed on threads gives what num_workers=0 gives from it
    w2_head, w2_state = read(ds_url, batch=4, num_workers=2, stop_after=4)
    on_threads, _ = read(ds_url, batch=4, threads=2, state=w2_state)
    assert keys(on_threads) == keys(read(ds_url, batch=4, state=w2_state)[0])
    taken = [k for b in keys(w2_head) + keys(on_threads) for k in b]
    assert sorted(taken) == sorted(k for b in keys(full) for k in b)


def test_a_transform_error_is_raised_at_its_batch_after_every_earlier_one(ds_url: str) -> None:
    order = [k for b in keys(read(ds_url, batch=2)[0]) for k in b]
    bad = order[7]  # in batch 3

    def transform_that_breaks(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__key__"] in order[:4]:
            time.sleep(0.2)  # batches 0 and 1 finish after batch 3 failed
        if sample["__key__"] == bad:
            raise ValueError(f"cannot transform {bad}")
        return sample

    ds = StreamingDataset(ds_url, batch_size=2, transform=transform_that_breaks)
    ds.set_epoch(1)
    it = iter(StreamingDataLoader(ds, threads=4))
    got = [next(it)["__key__"] for _ in range(3)]
    with pytest.raises(ValueError, match=f"cannot transform {bad}") as info:
        next(it)
    assert got == [order[0:2], order[2:4], order[4:6]]
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "transform_that_breaks"
    assert next(it, None) is None  # the iteration ended with the error
    assert not loader_threads()


@pytest.mark.parametrize("handler", [None, lambda exc: True], ids=["no-handler", "skipping-handler"])
def test_a_decode_error_on_sample_k_is_raised_where_num_workers_0_raises_it(
    ds_url: str, handler: Callable[[Exception], bool] | None
) -> None:
    bad = key(3, 4)

    def text(data: bytes) -> str:
        if data == bad.encode():
            raise UnicodeDecodeError("utf-8", data, 0, 1, "refused by the test")
        return data.decode()

    def until_error(**kw: Any) -> tuple[list[list[str]], BaseException]:
        ds = StreamingDataset(ds_url, batch_size=4, shuffle=False, decode={"txt": text},
                              options=DatasetOptions(handler=handler))
        got = []
        with pytest.raises(DatasetError) as info:
            for b in StreamingDataLoader(ds, **kw):
                got.append(b["__key__"])
        return got, info.value

    plain, plain_error = until_error()
    threaded, error = until_error(threads=3)
    assert threaded == plain and [k for b in plain for k in b] == all_keys(COUNTS)[:16]  # sample 19 in batch 4
    assert str(error) == str(plain_error) and f"'txt' of sample {bad!r}" in str(error)  # not the handler's to skip
    assert isinstance(error.__cause__, UnicodeDecodeError)
    assert not loader_threads()


def test_a_shard_that_cannot_be_read_fails_in_its_place(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    make_dataset(url, None, COUNTS)
    victim = sorted(p for p in Path(url).iterdir() if p.name.startswith("part003"))[0]
    victim.unlink()

    def until_error(**kw: Any) -> tuple[list[list[str]], BaseException]:
        got = []
        with pytest.raises(StreamioError) as info:
            for b in StreamingDataLoader(StreamingDataset(url, batch_size=3, shuffle=False), **kw):
                got.append(b["__key__"])
        return got, info.value

    plain, plain_error = until_error()
    threaded, error = until_error(threads=2)
    assert threaded == plain and [k for b in plain for k in b] == all_keys(COUNTS[:3])[:15]
    assert type(error) is type(plain_error) and victim.name in str(error)
    assert not loader_threads()


def test_threads_over_s3_with_latency_and_a_503_storm_give_the_clean_batches(s3: S3Endpoint) -> None:
    url = s3.url("threads")
    make_dataset(url, s3.storage_options(), COUNTS[:4])
    ds = StreamingDataset(url, batch_size=4, storage_options=s3.storage_options())
    clean = keys(list(StreamingDataLoader(ds)))
    with FaultProxy(s3.endpoint_url) as proxy:
        proxy.set_latency(0.02)
        proxy.fail_next(3, 503, "SlowDown", method="GET", path_contains=".tar")
        ds = StreamingDataset(url, batch_size=4, storage_options=s3.storage_options(proxy.endpoint_url))
        threaded = keys(list(StreamingDataLoader(ds, threads=2)))
        assert sum(r.status == 503 for r in proxy.log()) == 3  # the storm happened and was retried
    assert threaded == clean


@pytest.mark.parametrize("how", ["end", "break", "dropped", "error"])
def test_no_thread_is_left_when_the_loop_ends_breaks_is_dropped_or_raises(ds_url: str, how: str) -> None:
    before = set(threading.enumerate())

    def transform(sample: dict[str, Any]) -> dict[str, Any]:
        if how == "error" and sample["__index__"] == 2:
            raise RuntimeError("stop here")
        return sample

    loader = StreamingDataLoader(StreamingDataset(ds_url, batch_size=2, transform=transform), threads=3)
    if how == "end":
        assert len(list(loader)) == len(loader)
    elif how == "break":
        for _ in loader:
            assert loader_threads()  # the pipeline runs while the loop does
            break
    elif how == "dropped":
        it = iter(loader)
        next(it)
        del it
        gc.collect()
    else:
        with pytest.raises(RuntimeError, match="stop here"):
            list(loader)
    assert set(threading.enumerate()) <= before  # the loader's threads and the dataset's prefetch threads


def test_a_transform_that_never_returns_costs_the_loop_join_s_and_a_warning_naming_it(
    ds_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from streamio.data.dataloader import threaded

    monkeypatch.setattr(threaded, "JOIN_S", 0.3)
    stuck = threading.Event()

    def hangs_after_the_first_batch(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__index__"] >= 2:
            stuck.wait(30)  # a transform that does not return (until the test ends)
        return sample

    ds = StreamingDataset(ds_url, batch_size=2, shuffle=False, transform=hangs_after_the_first_batch)
    try:
        began = time.monotonic()
        for _ in StreamingDataLoader(ds, threads=2):
            break
        assert time.monotonic() - began < 5
        assert "still run" in caplog.text and "streamio-loader-" in caplog.text
    finally:
        stuck.set()
    for t in threading.enumerate():
        if t.name.startswith("streamio-loader"):
            t.join(5)
    assert not loader_threads()


@pytest.mark.parametrize(("kw", "match"), [
    ({"threads": -1}, r"threads=-1\): give the number of threads"),
    ({"threads": True}, r"threads=True\)"),
    ({"threads": 2.0}, r"threads=2.0\)"),
    ({"threads": "2"}, r"threads='2'\)"),
    ({"threads": 10**6}, r"threads=1000000\): .* an int from 0 \(none: the usual DataLoader\) to 256"),
    ({"threads": 2, "num_workers": 2}, r"threads=2, num_workers=2\): choose one"),
    ({"threads": 2, "pin_memory": True}, r"pin_memory=True\) is not supported"),
])
def test_threads_that_cannot_work_are_refused_naming_the_fix(ds_url: str, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StreamingDataLoader(StreamingDataset(ds_url, batch_size=2), **kw)


def test_loader_metrics_count_thread_batches_and_their_waits(ds_url: str) -> None:
    from streamio import metrics

    before = metrics.snapshot()
    n = len(list(StreamingDataLoader(StreamingDataset(ds_url, batch_size=4), threads=2)))
    after = metrics.snapshot()
    assert n == 12
    assert after["streamio_loader_batches_total"] - before["streamio_loader_batches_total"] == n
    assert after["streamio_loader_wait_seconds"]["count"] - before["streamio_loader_wait_seconds"]["count"] == n


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["slow", "stuck"])
def test_ctrl_c_mid_epoch_stops_the_process_without_a_hang(ds_url: str, mode: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "support.threads_sigint", ds_url, mode], cwd=REPO / "tests",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # after its second batch, mid-epoch, batches being made on 2 threads
    assert line.startswith("batches 2"), (line, proc.stderr.read() if proc.stderr else "")
    time.sleep(0.5)  # stuck: the loop waits in next() for the batch that never comes
    proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - began < 5  # a transform that does not return is not waited for
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    assert "still run" not in err  # the threads stopped, none left behind


_TRACED = """
import json, os, sys
sys.path.insert(0, "tests")
from support.dataset import make_dataset
from streamio import StreamingDataLoader, StreamingDataset
make_dataset(sys.argv[1], None, [5, 7, 3, 9])
loader = StreamingDataLoader(StreamingDataset(sys.argv[1], batch_size=4, decode="auto"), threads=2)
print(json.dumps({"pid": os.getpid(), "batches": len(list(loader))}))
"""


@pytest.mark.slow
def test_trace_spans_show_decode_and_collate_on_the_loader_threads_and_the_wait_in_the_loop(tmp_path: Path) -> None:
    env = {**os.environ, "STREAMIO_TRACE": str(tmp_path / "trace.json")}
    proc = subprocess.run([sys.executable, "-c", _TRACED, str(tmp_path / "ds")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    doc = json.loads((tmp_path / f"trace.{out['pid']}.json").read_text())
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    spans = [(e["name"], names[e["tid"]]) for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sum(1 for s in spans if s == ("wait", "MainThread")) == out["batches"] + 1 == 7  # the last finds the end
    decodes = [t for n, t in spans if n == "decode"]
    collates = [t for n, t in spans if n == "collate"]
    assert len(decodes) == 24 and len(collates) == 6
    assert set(decodes) | set(collates) <= {"streamio-loader-0", "streamio-loader-1"}
