"""The README's main job (`make demo`) on its embedded default, as CI must see it run.

Local S3 (moto) + the bundled synthetic dataset: shard, train 2 ranks, crash with --fail-at-step,
resume from latest.json, and a summary proving the resumed run matches the uninterrupted one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_make_demo_crashes_resumes_and_matches_the_uninterrupted_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "streamio.train.demo", "--workdir", str(tmp_path / "demo-out")],
        env=env, capture_output=True, text=True, timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "RESULT: IDENTICAL" in out
    assert "resumed from" in out or "resume" in out
    assert (tmp_path / "demo-out").is_dir()
