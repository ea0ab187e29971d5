"""The checkpoint package keeps its house rule: one owner per document.

A root's documents (the pointer ``latest.json``, manifests, done markers, ``bad.json``,
``retention.json``) have their formats in ``streamio/checkpoint/format/`` and are read, written,
listed and deleted by ``streamio/checkpoint/root.py`` alone (docs/design.md "Checkpoints"); a
local tier's ``owner.json`` by ``streamio/checkpoint/owner.py`` alone. These
tests read the source (``ast``, docstrings excluded) so that a module that reaches around them
fails here, not in a review. (The one map of every module: tests/core/test_module_map.py.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "streamio"
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


#: a local tier's owner record: read and written by streamio/checkpoint/owner.py alone
OWNER_MODULE, OWNER_CODECS = "checkpoint/owner.py", {"owner_to_bytes", "owner_from_bytes"}


@pytest.mark.parametrize("codec", sorted(OWNER_CODECS))
def test_only_the_owner_module_encodes_and_decodes_the_owner_record(codec: str) -> None:
    found = [f"streamio/{rel}:{line}" for rel, tree in modules()
             if rel != OWNER_MODULE and not rel.startswith("checkpoint/format/")
             for line, name in names(tree) if name == codec]
    assert not found, f"{codec} is called by streamio.checkpoint.owner only: " + ", ".join(found)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_only_root_encodes_and_decodes_a_document(codec: str) -> None:
    found = [f"streamio/{rel}:{line}" for rel, tree in modules()
             if rel != ROOT_MODULE and not rel.startswith("checkpoint/format/")
             for line, name in names(tree) if name == codec]
    assert not found, f"{codec} is called by streamio.checkpoint.root only: " + ", ".join(found)
