"""The distribution a user installs: ``pip wheel --no-deps .`` builds a wheel that holds every
package of ``streamio/`` and ``cli/`` and the ``streamio`` command, and that wheel installs into a
fresh virtual environment and runs there (from its own files, not this checkout).

The fresh environment gets the wheel alone; its dependencies (torch, numpy, fsspec, ...) are seen
through a ``.pth`` line naming this environment's site-packages (a plain path entry: the editable
install's import hook there is not activated, so ``import streamio`` can only find the wheel's copy).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.slow


def run(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def packages_in_checkout() -> set[str]:
    """Every package of this checkout under the name it is installed as (``cli/`` is ``streamio.cli``)."""
    found = set()
    for top, installed in (("streamio", ("streamio",)), ("cli", ("streamio", "cli"))):
        for init in ROOT.glob(f"{top}/**/__init__.py"):
            found.add(".".join((*installed, *init.parent.relative_to(ROOT / top).parts)))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", out, ROOT)
    [built] = out.glob("*.whl")
    return built


def test_the_wheel_is_streamio_torch_and_holds_every_package_and_the_command(wheel: Path) -> None:
    assert wheel.name.startswith("streamio_torch-"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        [entry] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        metadata = Parser().parsestr(zf.read(meta).decode())
        entry_points = zf.read(entry).decode()
    assert metadata["Name"] == "streamio-torch"
    packaged = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages_in_checkout() <= packaged, sorted(packages_in_checkout() - packaged)
    assert "streamio/py.typed" in names and "streamio/cli/main.py" in names
    assert "streamio = streamio.cli.main:main" in entry_points


def test_the_wheel_installs_and_runs_in_a_fresh_environment(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel)
    target = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (target / "deps-from-the-test-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = run(python, "-c", "import streamio; print(streamio.__file__)", env=env, cwd=tmp_path)
    assert where.startswith(str(target)), where  # the wheel's copy, not this checkout
    assert run(env_dir / "bin" / "streamio", "--version", env=env).strip().endswith(run(
        python, "-c", "import streamio; print(streamio.__version__)", env=env, cwd=tmp_path).strip())
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(10):
        (raw / f"{i:03d}.json").write_text(json.dumps({"x": i}))
    run(env_dir / "bin" / "streamio", "shard", raw, tmp_path / "ds", "--max-count", "4", env=env, cwd=tmp_path)
    summary = json.loads(run(env_dir / "bin" / "streamio", "inspect", tmp_path / "ds", "--json", env=env, cwd=tmp_path))
    assert summary["samples"] == 10 and summary["shards"] == 3, summary
