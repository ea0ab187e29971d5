"""The CLI starts without the heavy libraries: ``streamio --help`` / ``--version`` must stay well under
0.3 s, and every verb imports what it needs inside itself (benchmarks/bench_cli.py measures the times;
this test keeps the laziness from rotting, which a timed test on a shared machine could not do reliably)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "numpy", "fsspec", "s3fs", "gcsfs", "botocore", "zstandard", "tqdm", "streamio.storage",
         "streamio.data.format.index", "streamio.checkpoint.manager")

PROBE = """
import json, sys
import streamio.cli.main
from streamio.cli.main import cli
from click.testing import CliRunner
for args in (["--help"], ["--version"], ["shard", "--help"], ["ckpt", "verify", "--help"], ["plan", "--help"]):
    assert CliRunner().invoke(cli, args).exit_code == 0, args
print(json.dumps(sorted(m for m in sys.modules if m in HEAVY)))
"""


def test_importing_the_cli_and_asking_for_help_loads_no_heavy_library() -> None:
    code = f"HEAVY = {HEAVY!r}\n{PROBE}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []
