"""What `streamio shard` reads from local disk (issue 23): regular files only, links kept inside the
source, sizes checked before bytes, files streamed into the shards (bounded memory).

The FIFO cases would block for ever if the FIFO were opened: every one runs under a timeout (a real
subprocess of the CLI, or pytest-timeout in process).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from streamio.data.format.index import load_index
from streamio.data.format.layout import INDEX_NAME
from streamio.data.format.samples import iter_samples
from streamio.data.write.localfiles import LocalFile
from streamio.data.write.sources import samples_from_directory, samples_from_jsonl
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import DatasetError, SourceError
from streamio.storage import Store

_PEAK = """
import runpy, sys
sys.argv = ["streamio", *sys.argv[1:]]
try:
    runpy.run_module("streamio.cli.main", run_name="__main__")
finally:
    print(open("/proc/self/status").read().split("VmHWM:")[1].split()[0], file=sys.stderr)
"""


def streamio(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamio.cli.main", *args], capture_output=True, text=True, timeout=timeout,
    )


def tree(root: Path) -> Path:
    (root / "src" / "a").mkdir(parents=True)
    (root / "src" / "a" / "0001.txt").write_bytes(b"one")
    (root / "src" / "a" / "0002.txt").write_bytes(b"two")
    (root / "secret.txt").write_bytes(b"AKIA-outside-the-source")
    return root / "src"


@pytest.mark.timeout(60)
def test_special_files_and_escaping_links_are_refused_by_name_never_opened(tmp_path: Path) -> None:
    src = tree(tmp_path)
    os.mkfifo(src / "a" / "0003.txt")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "a" / "0004.sock"))
    os.symlink(tmp_path / "secret.txt", src / "a" / "0005.txt")
    os.symlink(tmp_path, src / "linked-dir")
    os.symlink(tmp_path / "gone", src / "a" / "0006.txt")
    try:
        with pytest.raises(SourceError) as err:
            samples_from_directory(str(src))
    finally:
        sock.close()
    text = str(err.value)
    assert "holds 5 entries `streamio shard` does not pack" in text
    for what in (
        f"{src}/a/0003.txt is a FIFO", f"{src}/a/0004.sock is a socket",
        f"{src}/a/0005.txt is a symbolic link to {tmp_path}/secret.txt, outside the source",
        f"{src}/linked-dir is a symbolic link to the directory {tmp_path} (not followed)",
        f"{src}/a/0006.txt is a symbolic link to {tmp_path}/gone, which does not exist",
    ):
        assert what in text, what


def test_links_inside_the_source_are_read_and_outside_ones_only_when_asked(tmp_path: Path) -> None:
    src = tree(tmp_path)
    os.symlink(src / "a" / "0001.txt", src / "a" / "0003.txt")  # inside: the target's bytes, the link's key
    assert [s["txt"] for s in samples_from_directory(str(src))] == [b"one", b"two", b"one"]
    os.symlink(tmp_path / "secret.txt", src / "a" / "0004.txt")
    with pytest.raises(SourceError, match="0004.txt is a symbolic link to .*secret.txt, outside the source"):
        samples_from_directory(str(src))
    samples = list(samples_from_directory(str(src), follow_symlinks=True))
    assert samples[-1] == {"__key__": "a/0004", "txt": b"AKIA-outside-the-source"}


@pytest.mark.timeout(60)
def test_a_file_swapped_for_a_fifo_after_listing_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x.bin")
    with pytest.raises(SourceError, match=r"x.bin is a FIFO, not a regular file"):
        LocalFile(str(tmp_path / "x.bin"), 10, str(tmp_path / "x.bin")).read()
    (tmp_path / "y.bin").write_bytes(b"12345")
    with pytest.raises(DatasetError, match="y.bin changed while it was read: it had 3 bytes"):
        LocalFile(str(tmp_path / "y.bin"), 3, str(tmp_path / "y.bin")).read()


@pytest.mark.timeout(60)
def test_jsonl_sources_read_regular_files_only(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jpg")
    (tmp_path / "in.jsonl").write_text(json.dumps({"__key__": "k", "jpg": "pipe.jpg"}) + "\n")
    with pytest.raises(SourceError, match="pipe.jpg is a FIFO"):
        list(samples_from_jsonl(str(tmp_path / "in.jsonl"), file_fields=["jpg"]))
    os.mkfifo(tmp_path / "lines.jsonl")
    with pytest.raises(SourceError, match="lines.jsonl is a FIFO"):
        samples_from_jsonl(str(tmp_path / "lines.jsonl"))
    (tmp_path / "big.jpg").write_bytes(bytes(5000))
    (tmp_path / "in.jsonl").write_text(json.dumps({"__key__": "k", "jpg": "big.jpg"}) + "\n")
    with pytest.raises(SourceError, match="big.jpg is 5,000 bytes, more than the 4,096 a sample may hold"):
        list(samples_from_jsonl(str(tmp_path / "in.jsonl"), file_fields=["jpg"], max_sample_bytes=4096))


@pytest.mark.parametrize("where", ["directory", "tar-glob"])
def test_the_cli_refuses_a_fifo_with_exit_2_at_once(tmp_path: Path, where: str) -> None:
    """Issue 23: a FIFO in SRC made `streamio shard` wait for ever."""
    src = tree(tmp_path)
    if where == "directory":
        os.mkfifo(src / "a" / "0003.txt")
        args = [str(src)]
    else:
        write_dataset(samples_from_directory(str(src)), str(tmp_path / "tars"), spec=ShardSpec(max_count=1))
        os.mkfifo(tmp_path / "tars" / "data-000009.tar")
        args = [f"{tmp_path}/tars/*.tar"]
    res = streamio("shard", *args, str(tmp_path / "out"), timeout=60)
    assert res.returncode == 2, res.stderr
    assert "FIFO" in res.stderr and ("0003.txt" in res.stderr or "data-000009.tar" in res.stderr)
    assert not (tmp_path / "out" / INDEX_NAME).exists()


def test_a_file_over_the_sample_limit_is_refused_by_its_size_before_reading(tmp_path: Path) -> None:
    """A 1 TiB sparse file: reading it would take hours; refusing it takes a stat."""
    src = tree(tmp_path)
    with open(src / "a" / "0003.bin", "wb") as f:
        f.truncate(1 << 40)
    res = streamio("shard", str(src), str(tmp_path / "out"), timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"{src}/a/0003.bin is 1,099,511,627,776 bytes: sample 'a/0003' would span" in res.stderr
    assert "more than the 1,073,741,824 a sample may" in res.stderr
    (src / "a" / "0003.bin").unlink()
    (src / "a" / "0003.bin").write_bytes(bytes(3000))
    with pytest.raises(SourceError, match="would span 3,584 bytes of tar records, more than the 3,000"):
        samples_from_directory(str(src), max_sample_bytes=3000)
    with pytest.raises(DatasetError, match="spans 3,584 bytes of tar records, more than the 3,000"):
        spec = ShardSpec(max_sample_bytes=3000)
        write_dataset([{"__key__": "k", "bin": bytes(3000)}], str(tmp_path / "w"), spec=spec)


@pytest.mark.parametrize("compress", [[], ["--compress", "zstd"]], ids=["tar", "zst"])
def test_a_large_file_is_streamed_into_its_shard(tmp_path: Path, compress: list[str]) -> None:
    """Issue 23: a 3 GiB file was read whole and copied again (10 GiB: 21 GB peak). Now the shard is the
    only copy (uncompressed), or a few MiB (zstd). Peak RSS of the CLI process, 300 MB of sparse file."""
    src = tmp_path / "src"
    src.mkdir()
    size = 300 << 20
    with open(src / "big.bin", "wb") as f:
        f.truncate(size)
    (src / "small.txt").write_bytes(b"x")
    res = subprocess.run(  # the peak of the CLI's own memory (VmHWM starts at exec; ru_maxrss would include
        [sys.executable, "-c", _PEAK, "shard", str(src), str(tmp_path / "ds"), *compress],  # pytest's, forked)
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    peak = int(res.stderr.splitlines()[-1]) << 10  # kB
    limit = (size if not compress else 0) + (150 << 20)  # the shard (tar only) plus the interpreter and imports
    assert peak < limit, f"peak RSS {peak >> 20} MiB, limit {limit >> 20} MiB"
    store = Store(str(tmp_path / "ds"))
    index = load_index(store)
    assert index.samples == 2
    first = next(iter_samples([store.read(index.shards[0].path)], url="x", compression=index.shards[0].compression))
    assert first["__key__"] == "big" and len(first["bin"]) == size and not any(first["bin"][:: 1 << 20])


@pytest.mark.parametrize("workers", ["1", "2"])
def test_index_refuses_a_fifo_named_like_a_shard_with_exit_2_at_once(tmp_path: Path, workers: str) -> None:
    """Issue 34 item 6: `streamio index DIR --workers N` waited for ever on a FIFO named like a shard (its
    workers blocked in open(), and the parent waited for them: SIGTERM did not end it)."""
    write_dataset(({"__key__": f"{i:03d}", "txt": "x"} for i in range(4)), str(tmp_path / "ds"),
                  spec=ShardSpec(max_count=1))
    (tmp_path / "ds" / INDEX_NAME).unlink()
    os.mkfifo(tmp_path / "ds" / "data-000099.tar")
    with subprocess.Popen(  # a session of its own: on a hang, the workers are killed with the CLI
        [sys.executable, "-m", "streamio.cli.main", "index", str(tmp_path / "ds"), "--workers", workers],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) as proc:
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("streamio index waited on the FIFO")
    assert proc.returncode == 2, err
    assert f"Error: {tmp_path}/ds/data-000099.tar is a FIFO: only regular files are read as shards" in err
    assert not (tmp_path / "ds" / INDEX_NAME).exists()


@pytest.mark.timeout(60)
def test_every_local_read_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """The store's reads of local objects (index.json, shards, checkpoint parts) open nothing that could block."""
    from streamio.errors import NotRegularFileError

    write_dataset([{"__key__": "a", "txt": "x"}], str(tmp_path / "ds"))
    store = Store(str(tmp_path / "ds"))
    os.mkfifo(tmp_path / "ds" / "pipe.tar")
    os.mkdir(tmp_path / "ds" / "dir.tar")
    for path, kind in (("pipe.tar", "a FIFO"), ("dir.tar", "a directory")):
        for read in (store.read, store.read_view, lambda p: b"".join(store.iter_bytes(p))):
            with pytest.raises(NotRegularFileError, match=rf"ds/{path} is {kind}, not a regular file"):
                read(path)
    (tmp_path / "ds" / INDEX_NAME).unlink()
    os.mkfifo(tmp_path / "ds" / INDEX_NAME)
    with pytest.raises(NotRegularFileError, match=rf"{INDEX_NAME} is a FIFO, not a regular file"):
        load_index(store)
    assert store.read("data-000000.tar")[:1] == b"a"  # regular files read as before
