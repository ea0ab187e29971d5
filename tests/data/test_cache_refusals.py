"""Cache writes the system refuses: a CacheWriteError whose advice fits the cause, and a read that goes on.

Issue 23, item 12: a cache write refused by the file-size limit (RLIMIT_FSIZE -> EFBIG; Python
ignores SIGXFSZ, so it is an error, not a kill) surfaced as a raw ``OSError`` and stopped the read;
a read-only or vanished cache directory got the advice "remove it". Under the default policy
(``CacheConfig(on_error="bypass")``) the read now continues from the store without the cache for
what it refuses, with one warning per cause; ``on_error="raise"`` raises the CacheWriteError.
The limits are real: a child process with RLIMIT_FSIZE, one that may not write its cache
directory (as root: without CAP_DAC_OVERRIDE), and a directory removed while the job runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamio.data.cache import CacheConfig
from streamio.data.dataset import StreamingDataset
from streamio.data.options import DatasetOptions
from streamio.errors import CacheWriteError
from support.dataset import all_keys, make_dataset

CHILD = str(Path(__file__).parents[1] / "support" / "cache_refusals.py")
COUNTS = [40, 60, 3, 50]  # shards of ~3 KB to ~80 KB
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # <linux/prctl.h>, <linux/capability.h>


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "ds")
    make_dataset(url, None, COUNTS)
    return url


def child(url: str, cache: Path, policy: str, *extra: str, **popen: Any) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, CHILD, url, str(cache), policy, *extra],
        capture_output=True, text=True, timeout=120, check=False, cwd=tempfile.gettempdir(), **popen,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_the_file_size_limit_bypasses_the_cache_and_says_which_limit(url: str, tmp_path: Path) -> None:
    got = child(url, tmp_path / "cache", "bypass", str(40_000))  # the two big shards exceed it
    assert got["error"] is None and got["keys"] == sorted(all_keys(COUNTS))
    [warning] = [m for m in got["logged"] if "cannot write" in m]  # once per cause, not per shard
    assert str(tmp_path / "cache") in warning
    assert "RLIMIT_FSIZE, `ulimit -f`: 40000 bytes" in warning and "ulimit -f unlimited" in warning


def test_the_file_size_limit_raises_a_cache_write_error_under_the_raise_policy(url: str, tmp_path: Path) -> None:
    got = child(url, tmp_path / "cache", "raise", str(40_000))
    assert got["error"].startswith("streamio.errors.CacheWriteError: cache ")
    assert str(tmp_path / "cache") in got["error"] and "40000 bytes" in got["error"]


def without_dac_override() -> None:
    """In the child, as root: drop the capabilities that let root write anywhere (from the bounding set,
    so they stay dropped across exec). Root is still the owner the cache directory must have.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize("policy", ["bypass", "raise"])
def test_a_directory_this_user_may_not_write_points_at_a_writable_one(url: str, tmp_path: Path, policy: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o500)  # its owner may read it, not write it: every lock or data file is refused
    got = child(url, cache, policy, preexec_fn=without_dac_override if os.geteuid() == 0 else None)
    advice = "this user may not write there: point CacheConfig(directory=...) at a writable local directory"
    if policy == "bypass":
        assert got["error"] is None and got["keys"] == sorted(all_keys(COUNTS))
        assert any(advice in m for m in got["logged"]), got["logged"]
    else:
        assert got["error"].startswith("streamio.errors.CacheWriteError") and advice in got["error"]
    assert "remove it" not in json.dumps(got)


@pytest.mark.parametrize("policy", ["bypass", "raise"])
def test_a_directory_removed_while_running_says_so(
    url: str, tmp_path: Path, policy: str, as_rank: Callable[[int, int], None], caplog: pytest.LogCaptureFixture
) -> None:
    as_rank(0, 1)
    cache = tmp_path / "cache"
    options = DatasetOptions(cache=CacheConfig(cache, max_bytes=1 << 30, on_error=policy))  # type: ignore[arg-type]
    ds = StreamingDataset(url, shuffle=False, options=options)
    assert len(list(ds)) == sum(COUNTS)  # the directory is open and holds the shards
    shutil.rmtree(cache)
    advice = "the directory was removed while this process was using it: recreate it"
    if policy == "raise":
        with pytest.raises(CacheWriteError, match=advice):
            list(ds)
        return
    with caplog.at_level("WARNING", logger="streamio.data.cache"):
        keys = sorted(s["__key__"] for s in ds)
    assert keys == sorted(all_keys(COUNTS)) and advice in caplog.text and "remove it" not in caplog.text


def test_on_error_must_be_a_policy(tmp_path: Path) -> None:
    from streamio.errors import ConfigError

    with pytest.raises(ConfigError, match="on_error='skip' is not 'bypass' or 'raise'"):
        CacheConfig(tmp_path, max_bytes=1 << 20, on_error="skip")  # type: ignore[arg-type]
