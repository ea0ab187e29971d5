"""``streamio ckpt ls ROOT --local DIR``: which saves are local, durable or both (issue 25)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions
from streamio.testing import S3Endpoint


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "streamio.cli.main", "ckpt", "ls", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "file":
        return str(tmp_path / "root"), {}
    s3: S3Endpoint = request.getfixturevalue("s3")
    return s3.url("root"), s3.storage_options()


def _saves(url: str, options: dict[str, Any], local: Path) -> None:
    """Steps 1..5, every second durable, the local tier keeping 2: the root has 2 and 4, local 4 and 5."""
    mgr = CheckpointManager(url, storage_options=options, local=LocalTier(str(local), keep=2),
                            options=SaveOptions(durable_every=2), async_save=False)
    for step in range(1, 6):
        mgr.save(step, {"model": torch.nn.Linear(4, 4)})
    mgr.wait()
    mgr.close()


def _options(options: dict[str, Any]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={json.dumps(v)}")]


def test_ls_local_says_which_saves_are_local_durable_or_both(
    root: tuple[str, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, options = root
    _saves(url, options, tmp_path / "local")
    done = _cli(url, "--local", str(tmp_path / "local"), "--json", *_options(options))
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["step"], r["tier"], r["latest"], r["local_latest"]) for r in rows] == [
        (2, "durable", False, False), (4, "both", True, False), (5, "local", False, True)]
    assert rows[2]["place"] == "local" and rows[2]["local_ranks"] == [0] and rows[1]["local_ranks"] == [0]
    assert all(r["bytes"] > 0 and r["world_size"] == 1 for r in rows)

    text = _cli(url, "--local", str(tmp_path / "local"), *_options(options)).stdout.splitlines()
    assert text[0].split()[:3] == ["STEP", "TIER", "SIZE"]
    rows_text = [line.split()[:3] for line in text[1:]]
    assert rows_text == [["2", "durable", "128"], ["*", "4", "both"], ["5", "local+", "128"]]
    plain = _cli(url, "--json", *_options(options))  # without --local: the root alone, as before
    assert [(r["step"], "tier" in r) for r in json.loads(plain.stdout)] == [(2, False), (4, False)]


def test_ls_local_of_a_directory_without_local_copies_is_a_usage_error(tmp_path: Path) -> None:
    _saves(str(tmp_path / "root"), {}, tmp_path / "local")
    missing = _cli(str(tmp_path / "root"), "--local", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert f"the local tier '{tmp_path / 'nope'}' cannot be listed: No such file or directory" in missing.stderr
    wrong = _cli(str(tmp_path / "root"), "--local", str(tmp_path / "root"))  # the durable root, not the tier
    assert wrong.returncode == 2
    assert "holds no local checkpoint copies (rank-NNNNN directories written by LocalTier)" in wrong.stderr
    assert "Traceback" not in missing.stderr + wrong.stderr
