"""docs/design.md "Layout and the direction of dependencies" is the one map of streamio's modules.

Every module under ``streamio/`` and ``cli/`` (installed as ``streamio.cli``) is on it, one line
each, indented under its package, and nothing on it is gone: a module added, moved or removed
without the map fails here, so package docstrings can point to the map instead of keeping lists
of their own that drift.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the folders whose every module the map names (others, such as tests/ and benchmarks/, are summarised)
MAPPED = ("streamio", "cli")


def design_map(text: str) -> set[str]:
    """Every module path the first code block of the section names (``streamio/data/format/layout``).

    An entry is a line that starts with names (``retry, failures``), then two spaces or nothing;
    a folder (``format/``) names its package (``__init__``) and prefixes the entries indented
    under it. Lines that continue a description start with a word and one space, and are skipped.
    """
    section = text[text.index("## Layout and the direction of dependencies"):]
    block = section[section.index("```\n") + 4:]
    block = block[: block.index("```")]
    stack: list[tuple[int, str]] = []  # (indent, folder) of the entries above
    named = set()
    for line in block.splitlines():
        m = re.match(r"^( *)([\w./]+(?:, [\w./]+)*)(?: {2,}|$)", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prefix = "/".join(folder for _, folder in stack)
        for name in m.group(2).split(", "):
            path = f"{prefix}/{name.rstrip('/')}" if prefix else name.rstrip("/")
            named.add(path.removesuffix("/__init__"))
        if m.group(2).endswith("/"):
            stack.append((indent, m.group(2).rstrip("/")))
    return named


def modules(root: Path) -> set[str]:
    """Every module of the mapped folders under ``root``, as the map spells it (a package: its folder)."""
    return {
        f.relative_to(root).with_suffix("").as_posix().removesuffix("/__init__")
        for top in MAPPED
        for f in (root / top).rglob("*.py")
    }


def mapped(named: set[str]) -> set[str]:
    return {p for p in named if p.split("/")[0] in MAPPED}


def test_the_design_map_names_every_module_and_no_other() -> None:
    have = modules(REPO)
    named = mapped(design_map((REPO / "docs" / "design.md").read_text(encoding="utf-8")))
    assert not have - named, f"docs/design.md does not map {sorted(have - named)}"
    assert not named - have, f"docs/design.md maps modules that are gone: {sorted(named - have)}"


def test_the_check_fails_on_a_module_missing_from_the_map_and_on_one_that_is_gone(tmp_path: Path) -> None:
    (tmp_path / "streamio" / "train").mkdir(parents=True)
    (tmp_path / "cli").mkdir()
    for name in ("streamio/__init__.py", "streamio/train/__init__.py", "streamio/train/loop.py",
                 "streamio/train/new.py", "cli/__init__.py"):
        (tmp_path / name).write_text("")
    doc = (
        "## Layout and the direction of dependencies\n\n```\nstreamio/\n  __init__           the API\n"
        "  train/             the trainer\n    loop             Trainer: steps, validation\n"
        "                     and a description that goes on\n    gone             a module deleted\n"
        "cli/                 the command\ntests/               by layer\n```\n"
    )
    named = mapped(design_map(doc))
    assert named == {"streamio", "streamio/train", "streamio/train/loop", "streamio/train/gone", "cli"}
    have = modules(tmp_path)
    assert have - named == {"streamio/train/new"}
    assert named - have == {"streamio/train/gone"}
