"""The import-linter layers contracts match the folders: a new module must take a place in its package's layers.

``make lint`` checks that imports respect the layers that are named; these tests check that every
module is named, so a module added to a package, or to the top of ``streamio.data``, cannot escape
the contracts by being left out of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the contracts are the same on 3.10

ROOT = Path(__file__).parents[2]
#: beside the stack, checked by the purity contract instead (docs/design.md "Layout and the direction of dependencies")
BESIDE = {"streamio.data.plan"}


def contracts() -> list[dict[str, Any]]:
    config = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def members(package: str) -> set[str]:
    """The modules and subpackages directly in ``package``, by their last name."""
    folder = ROOT.joinpath(*package.split("."))
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in folder.iterdir() if p.joinpath("__init__.py").is_file()
    }


def named(layers: list[str]) -> set[str]:
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def test_every_module_of_a_data_package_is_in_one_of_the_layers_of_its_contract() -> None:
    layered = [
        (c["name"], p, c["layers"])
        for c in contracts()
        if c["type"] == "layers"
        for p in c.get("containers", [])
        if p.startswith("streamio.data.")
    ]
    packages = {f"streamio.data.{p}" for p in members("streamio.data") if ROOT.joinpath("streamio", "data", p).is_dir()}
    assert {p for _, p, _ in layered} == packages  # every data package has a layers contract of its own
    for name, package, layers in layered:
        assert members(package) == named(layers), f"{name!r}: {sorted(members(package) ^ named(layers))}"


def test_every_module_and_package_of_streamio_data_is_in_the_layers_that_point_one_way() -> None:
    [contract] = [c for c in contracts() if c["name"] == "Layers point one way"]
    data = {n.removeprefix("streamio.data.") for n in named(contract["layers"]) if n.startswith("streamio.data.")}
    expected = members("streamio.data") - {b.removeprefix("streamio.data.") for b in BESIDE}
    assert data == expected, sorted(data ^ expected)
