"""Ctrl-C and SIGTERM during `streamio shard` (issue 23): a real CLI process, killed mid-write, on a local
directory and on S3 (moto). The old dataset stays whole and readable; nothing is left that makes a partial
dataset look whole; the next `--overwrite` removes what the interrupted write stored.

The trigger is deterministic: the source has far more samples than the write can store before the test
signals it (20,000 one-sample shards), and the test signals as soon as the first shard of the new write is
listed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streamio.cli.main import cli
from streamio.data.format.index import load_index
from streamio.data.format.layout import INDEX_NAME, WRITING_NAME
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store
from streamio.testing import S3Endpoint

pytestmark = pytest.mark.slow

CODES = {signal.SIGINT: (130, "Aborted: interrupted."), signal.SIGTERM: (143, "Aborted: terminated (SIGTERM).")}


def jsonl(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"__key__": f"k{i:06d}", "i": i}) + "\n" for i in range(n)))
    return path


def target(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Store, dict[str, str]]:
    if where == "s3":
        s3: S3Endpoint = request.getfixturevalue("s3")
        return s3.url("ds"), Store(s3.url("ds"), s3.storage_options()), s3.env()
    return str(tmp_path / "ds"), Store(str(tmp_path / "ds")), {}


def run(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
    res = CliRunner().invoke(cli, list(args), env=env)
    assert res.exit_code == code, (res.exit_code, res.output)
    return res.stdout if code == 0 else res.stderr


def interrupted_shard(src: Path, url: str, store: Store, env: dict[str, str], sig: signal.Signals, *extra: str) -> str:
    """Start `streamio shard`, signal it once its first new shard is stored, and return its stderr."""
    before = {o.path for o in store.list()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamio.cli.main", "shard", str(src), url, "--max-count", "1", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.endswith(".tar") and p not in before for p in (o.path for o in store.list())):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no shard appeared"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    code, said = CODES[sig]
    assert proc.returncode == code and err.rstrip().endswith(said), (proc.returncode, err)
    assert "Traceback" not in err
    return err


def no_temp_files(url: str, store: Store, where: str) -> None:
    if where == "s3":
        assert store.incomplete_uploads() == []
    else:
        assert [n for n in os.listdir(url) if n.endswith(".streamio-tmp")] == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_interrupted_overwrite_leaves_the_old_dataset_whole(
    tmp_path: Path, where: str, sig: signal.Signals, request: pytest.FixtureRequest
) -> None:
    url, store, env = target(where, tmp_path, request)
    old_samples = ({"__key__": f"old{i}", "txt": f"old {i}"} for i in range(8))
    old = write_dataset(old_samples, store, spec=ShardSpec(max_count=2))
    index_bytes = store.read(INDEX_NAME)
    err = interrupted_shard(jsonl(tmp_path / "big.jsonl", 20_000), url, store, env, sig, "--overwrite")
    assert f"{url} still holds the dataset it held before" in err and "--overwrite" in err
    assert store.read(INDEX_NAME) == index_bytes  # the old index, untouched ...
    report = json.loads(run("verify", url, "--json", env=env))  # ... and every old shard whole
    assert report["ok"] and report["checked"] == 4 and load_index(store).fingerprint == old.fingerprint
    no_temp_files(url, store, where)
    left = [o.path for o in store.list() if o.path.endswith(".tar") and o.path not in {s.path for s in old.shards}]
    assert left and store.exists(WRITING_NAME)  # the interrupted write's shards, claimed by its marker

    new = json.loads(run("shard", str(jsonl(tmp_path / "small.jsonl", 3)), url, "--overwrite", "--json", env=env))
    index = load_index(store)
    assert new["samples"] == 3 and index.fingerprint == new["fingerprint"]
    assert {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in index.shards}  # old + leftovers gone


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_interrupted_first_write_is_not_taken_for_a_dataset(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    url, store, env = target(where, tmp_path, request)
    interrupted_shard(jsonl(tmp_path / "big.jsonl", 20_000), url, store, env, signal.SIGINT)
    assert not store.exists(INDEX_NAME)
    for verb in ("inspect", "ls", "verify"):
        err = run(verb, url, code=3, env=env)
        assert "did not finish" in err and "must not be indexed" in err and "--overwrite" in err, verb
        assert "streamio index" not in err, verb  # the old advice: it would make a partial dataset look whole
    err = run("index", url, code=1, env=env)
    assert "indexing them would make a partial dataset look whole" in err and not store.exists(INDEX_NAME)
    err = run("shard", str(jsonl(tmp_path / "small.jsonl", 3)), url, code=2, env=env)
    assert "did not finish" in err and "--overwrite" in err
    run("shard", str(tmp_path / "small.jsonl"), url, "--overwrite", env=env)
    index = load_index(store)
    assert index.samples == 3 and {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in index.shards}


def test_a_write_that_stores_nothing_leaves_nothing(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match="the source is empty"):
        write_dataset([], store)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(_interrupted(), store)
    assert [o.path for o in store.list()] == []  # no marker: the next write needs no --overwrite


def _interrupted() -> Any:
    raise KeyboardInterrupt
    yield  # pragma: no cover - makes this a generator
