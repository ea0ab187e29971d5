"""`streamio shard --workers N` and `streamio index --workers N` (real CLI processes): the same bytes for
every N, on a local directory and on S3 (moto); Ctrl-C with workers leaves no index and says how to clean up."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamio.data.format.layout import INDEX_NAME, WRITING_NAME
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store
from streamio.testing import S3Endpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def streamio(*args: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run([sys.executable, "-m", "streamio.cli.main", *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    assert res.returncode == 0, res.stderr
    return res.stdout


def digests(store: Store) -> dict[str, str]:
    return {o.path: hashlib.sha256(store.read(o.path)).hexdigest() for o in store.list()}


def tree(root: Path, n: int) -> Path:
    """A source tree of ``n`` samples of uneven sizes (two members each), a few hundred samples per batch."""
    for i in range(n):
        (root / f"{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"{i % 3}" / f"{i:05d}.bin").write_bytes(random.Random(i).randbytes(32 * (1 + i % 40)))
        (root / f"{i % 3}" / f"{i:05d}.cls").write_text(str(i % 10))
    return root


@pytest.mark.parametrize(
    "extra", [(), ("--shuffle", "--seed", "7", "--compress", "zstd")], ids=["plain", "zstd-shuffle"]
)
def test_shard_writes_the_same_dataset_for_every_worker_count(tmp_path: Path, extra: tuple[str, ...]) -> None:
    src = tree(tmp_path / "src", 300)
    seen = {}
    for workers in (1, 2, 3):
        dest = tmp_path / f"ds{workers}"
        streamio("shard", str(src), str(dest), "--max-size", "20KB", "--workers", str(workers), *extra)
        seen[workers] = digests(Store(str(dest)))
    assert len(seen[1]) > 10 and seen[1] == seen[2] == seen[3]  # every shard, sidecar and index.json, byte for byte


def test_shard_on_s3_with_workers_is_the_one_process_dataset(tmp_path: Path, s3: S3Endpoint) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"__key__": f"k{i:05d}", "v": "x" * (i % 300)}) + "\n" for i in range(500)))
    for workers in (1, 2):
        streamio("shard", str(src), s3.url(f"ds{workers}"), "--max-count", "37", "--workers", str(workers),
                 env=s3.env())
    one, two = (digests(Store(s3.url(f"ds{w}"), s3.storage_options())) for w in (1, 2))
    assert len(one) == 15 and one == two


def test_index_writes_the_same_index_for_every_worker_count(s3: S3Endpoint) -> None:
    store = Store(s3.url("shards"), s3.storage_options())
    write_dataset(({"__key__": f"{i:05d}", "txt": "t" * (i % 97)} for i in range(400)), store,
                  spec=ShardSpec(max_count=23))
    store.delete(INDEX_NAME)
    written = {}
    for workers in (1, 2, 3):
        doc = json.loads(streamio("index", s3.url("shards"), "--workers", str(workers), "--concurrency", "4",
                                  "--overwrite", "--json", env=s3.env()))
        written[workers] = (store.read(INDEX_NAME), doc["fingerprint"])
    assert written[1] == written[2] == written[3]


def test_ctrl_c_with_workers_leaves_no_index_and_says_how_to_clean_up(tmp_path: Path) -> None:
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps({"__key__": f"k{i:06d}", "i": i}) + "\n" for i in range(20_000)))
    dest = tmp_path / "ds"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamio.cli.main", "shard", str(src), str(dest), "--max-count", "1", "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (dest.exists() and any(n.endswith(".tar") for n in os.listdir(dest))):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no shard appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and err.rstrip().endswith("Aborted: interrupted."), err
    assert "Traceback" not in err and "--overwrite" in err
    assert not (dest / INDEX_NAME).exists() and (dest / WRITING_NAME).exists()
    streamio("shard", str(src), str(dest), "--overwrite", "--workers", "2")  # what the message says to do
    assert {o.path for o in Store(str(dest)).list()} == {INDEX_NAME, "data-000000.tar"}


def test_pack_in_processes_cuts_by_size_as_one_writer_does_and_names_bad_samples(tmp_path: Path) -> None:
    from streamio.data.write.fanout import pack_in_processes
    from streamio.data.write.writer import DatasetWriter
    from streamio.errors import DatasetError

    samples = [{"txt": "x" * (i * 97 % 3000), "cls": i} for i in range(150)]  # no __key__: numbered in order
    spec = ShardSpec(max_bytes=20_000)
    one = write_dataset(samples, str(tmp_path / "one"), spec=spec)
    with DatasetWriter(str(tmp_path / "two"), spec=spec) as writer:
        pack_in_processes(writer, samples, workers=2)
    assert writer.close().fingerprint == one.fingerprint and len(one.shards) > 5
    assert digests(Store(str(tmp_path / "one"))) == digests(Store(str(tmp_path / "two")))

    bad = [*samples[:70], {"__key__": "a.b", "txt": "x"}]
    with pytest.raises(DatasetError, match=r"sample 70: key 'a.b' has a dot"), \
            DatasetWriter(str(tmp_path / "bad"), spec=spec) as writer:
        pack_in_processes(writer, bad, workers=2)
    assert not Store(str(tmp_path / "bad")).exists(INDEX_NAME)
    repeated = [{"__key__": "k", "txt": "1"}, {"__key__": "k", "txt": "2"}]
    with pytest.raises(DatasetError, match="sample 1: key 'k' repeats the previous sample's key"), \
            DatasetWriter(str(tmp_path / "rep"), spec=spec) as writer:
        pack_in_processes(writer, repeated, workers=2)


def test_token_counts_are_the_same_for_every_worker_count(tmp_path: Path) -> None:
    """Documents shard in worker processes with their token counts (what Pack plans by)."""
    import numpy as np

    from streamio.data.format.index import load_index

    src = tmp_path / "src"
    src.mkdir()
    for i in range(200):
        np.save(src / f"{i:05d}.npy", np.arange(1 + i % 37, dtype=np.uint32))
    seen = {}
    for workers in (1, 2):
        dest = tmp_path / f"ds{workers}"
        streamio("shard", str(src), str(dest), "--max-size", "8KB", "--workers", str(workers))
        seen[workers] = load_index(Store(str(dest))).token_counts("npy")
    assert len(seen[1]) > 2 and seen[1] == seen[2]
    assert [c for shard in seen[2] for c in shard] == [1 + i % 37 for i in range(200)]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(int(entry))
        if fields is not None and int(fields[1]) == pid:
            with contextlib.suppress(OSError):
                found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended (its new parent reaps it)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")
def test_shard_workers_end_with_a_parent_killed_with_sigkill(tmp_path: Path) -> None:
    """Issue 34 item 10: the workers of a `streamio shard --workers 2` killed with -9 ran on for good."""
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps({"__key__": f"k{i:06d}", "i": i}) + "\n" for i in range(20_000)))
    dest = tmp_path / "ds"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamio.cli.main", "shard", str(src), str(dest), "--max-count", "1", "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    kids: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while not (dest.exists() and any(n.endswith(".tar") for n in os.listdir(dest))):  # the workers are storing
            assert proc.poll() is None and time.monotonic() < deadline, "no shard appeared"
            time.sleep(0.02)
        kids = _children(proc.pid)  # the 2 workers and multiprocessing's resource tracker
        assert sum("spawn_main" in cmd for cmd in kids.values()) == 2, kids
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(map(_running, kids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [cmd for pid, cmd in kids.items() if _running(pid)]
    finally:
        proc.kill()
        proc.wait()
        for pid in filter(_running, kids):  # what the parent left running (before the fix): ours to end
            os.kill(pid, signal.SIGKILL)


_ORPHAN = """
import os, sys, time
from streamio.data.write.fanout import _watch
parent = os.getpid()  # before the fork: the child may first run after this process is killed
child = os.fork()
if child == 0:
    _watch(parent, 0.05)  # the watchdog alone, as where prctl is missing
    os._exit(3)  # not reached: the watchdog kills its process
print(child, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the process through /proc")
def test_the_watchdog_alone_ends_a_worker_whose_parent_died() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        child = int(proc.stdout.readline())  # type: ignore[union-attr]
        assert _running(child)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _running(child)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        if child and _running(child):
            os.kill(child, signal.SIGKILL)
