"""The documentation site builds with warnings as errors (what `make docs` runs), and a broken
reference does fail that build."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent, capture_output=True, text=True, timeout=120,
    )


def test_docs_build_strict(tmp_path: Path) -> None:
    start = time.monotonic()
    out = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - start < 60, "the docs build is meant to take seconds"
    api = (tmp_path / "site" / "api" / "data" / "index.html").read_text()
    assert 'id="streamio.StreamingDataset"' in api and 'id="streamio.StreamingDataLoader"' in api
    quickstart = (tmp_path / "site" / "quickstart" / "index.html").read_text()
    assert "python -m streamio.testing s3" in quickstart  # the README's quick start, included


def test_a_broken_reference_fails_the_build(tmp_path: Path) -> None:
    site = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", site / "docs")
    shutil.copy(ROOT / "mkdocs.yml", site / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", site / "README.md")
    (site / "streamio").symlink_to(ROOT / "streamio")
    with (site / "docs" / "index.md").open("a") as f:
        f.write("\nSee [the loader][streamio.NoSuchLoader].\n")
    out = mkdocs_build(site / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    assert "streamio.NoSuchLoader" in out.stderr
