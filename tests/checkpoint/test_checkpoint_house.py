"""The checkpoint package keeps its house rules: one owner per document, one module map.

A root's documents (the pointer ``latest.json``, manifests, done markers, ``bad.json``,
``retention.json``) have their formats in ``streamio/checkpoint/format/`` and are read, written,
listed and deleted by ``streamio/checkpoint/root.py`` alone (docs/design.md "Checkpoints"). These
tests read the source (``ast``, docstrings excluded) so that a module that reaches around them
fails here, not in a review. And docs/design.md "Layout and the direction of dependencies" is the
one map of the package's modules: every module is on it, and nothing on it is gone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "streamio"
#: the packages whose every module the map in docs/design.md names (others summarise their folders)
MAPPED = ("streamio/checkpoint",)
ROOT_MODULE = "checkpoint/root.py"
POINTER_MODULE = "checkpoint/format/pointer.py"

#: what names the pointer in code: its path, its format family, its constant, its codec
POINTER_NAMES = {"LATEST", "MAX_POINTER_BYTES", "POINTER_FORMAT", "pointer_to_bytes", "pointer_from_bytes"}
#: the codecs of the other documents: called by root.py (and within format/) only
CODECS = {"manifest_to_bytes", "manifest_from_bytes", "marker_to_bytes", "marker_from_bytes", "bad_to_bytes",
          "bad_from_bytes", "retention_to_bytes", "retention_from_bytes"}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring constant (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def names(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of every name, attribute and imported name in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, a.name) for a in node.names)


def pointer_strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """String constants (f-string pieces too, docstrings not) that spell the pointer's path or format."""
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if text == "latest.json" or text.endswith("/latest.json") or "streamio.checkpoint.latest/" in text:
                yield node.lineno, text


def test_only_the_pointer_module_and_root_name_the_pointer() -> None:
    found = [
        f"streamio/{rel}:{line}: {what!r}"
        for rel, tree in modules() if rel not in (ROOT_MODULE, POINTER_MODULE)
        for line, what in [*pointer_strings(tree), *((n, x) for n, x in names(tree) if x in POINTER_NAMES)]
    ]
    assert not found, "the pointer is read and written through streamio.checkpoint.root only:\n" + "\n".join(found)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_only_root_encodes_and_decodes_a_document(codec: str) -> None:
    found = [f"streamio/{rel}:{line}" for rel, tree in modules()
             if rel != ROOT_MODULE and not rel.startswith("checkpoint/format/")
             for line, name in names(tree) if name == codec]
    assert not found, f"{codec} is called by streamio.checkpoint.root only: " + ", ".join(found)


def design_map() -> set[str]:
    """Every module path the code block of docs/design.md "Layout and the direction of dependencies"
    names (``streamio/checkpoint/format/layout``; a package by its folder, ``__init__`` as the package)."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout and the direction of dependencies"):]
    block = section[section.index("```\n") + 4:]
    block = block[: block.index("```")]
    stack: list[tuple[int, str]] = []  # (indent, folder) of the entries above
    named = set()
    for line in block.splitlines():
        # an entry: names at the start of its line, then two spaces (or nothing) and what it is for
        m = re.match(r"^( *)([\w./]+(?:, [\w./]+)*)(?: {2,}|$)", line)
        if not m:
            continue  # a description's second line
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


@pytest.mark.parametrize("package", MAPPED)
def test_the_design_map_names_every_module_of_the_package_and_no_other(package: str) -> None:
    modules = {f.relative_to(REPO).with_suffix("").as_posix().removesuffix("/__init__")
               for f in (REPO / package).rglob("*.py")}
    named = {p for p in design_map() if p == package or p.startswith(package + "/")}
    assert not modules - named, f"docs/design.md does not map {sorted(modules - named)}"
    assert not named - modules, f"docs/design.md maps modules that are gone: {sorted(named - modules)}"
