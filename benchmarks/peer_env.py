"""Virtual environments for peers that cannot share streamio's (``.venv-peers/NAME``).

``python(name)`` creates ``.venv-peers/NAME`` on first use and installs the exact pins of
``benchmarks/peers/NAME.txt`` (a stamp file remembers which pins are installed, so a changed pin
list reinstalls); later runs reuse it. Returns the environment's interpreter.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "benchmarks" / "peers"


def python(name: str, *, log: object = print) -> Path:
    """The interpreter of peer ``name``'s environment, built from its pins if needed.

    Raises:
        FileNotFoundError: no ``benchmarks/peers/NAME.txt``.
        subprocess.CalledProcessError: the environment could not be built (pip's output went to stderr).
    """
    pins = PEERS / f"{name}.txt"
    if not pins.is_file():
        raise FileNotFoundError(f"no pins for peer {name!r}: expected {pins}")
    venv = REPO / ".venv-peers" / name
    exe = venv / "bin" / "python"
    stamp = venv / ".pins-sha256"
    digest = hashlib.sha256(pins.read_bytes()).hexdigest()
    if exe.exists() and stamp.exists() and stamp.read_text() == digest:
        return exe
    log(f"building {venv} from {pins.relative_to(REPO)} (once; several minutes, a few GB)")  # type: ignore[operator]
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(pins)], check=True)
    stamp.write_text(digest)
    return exe
