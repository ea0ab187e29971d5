"""Fail when a module of ``streamio/`` or ``cli/`` grows past 400 lines or a class past 250.

One concept per module: a module that outgrows a screenful of concepts is split along its seams
rather than allowed to grow (``make lint`` runs this beside ruff and import-linter).

Usage: ``python scripts/check_sizes.py [DIR ...]`` (defaults to ``streamio cli``); exit 1 lists
every offender with its size.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250


def offenders(path: Path) -> list[str]:
    """The size violations of one Python file, as printable lines."""
    text = path.read_text(encoding="utf-8")
    found = []
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if lines > MAX_MODULE_LINES:
        found.append(f"{path}: {lines} lines (module limit {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.ClassDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            size = (node.end_lineno or node.lineno) - start + 1
            if size > MAX_CLASS_LINES:
                found.append(f"{path}:{node.lineno}: class {node.name} is {size} lines (class limit {MAX_CLASS_LINES})")
    return found


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path("streamio"), Path("cli")]
    found = [line for root in roots for path in sorted(root.rglob("*.py")) for line in offenders(path)]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
