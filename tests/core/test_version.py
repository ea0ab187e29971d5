"""One version: ``streamio.__version__``, pyproject.toml and the newest release in CHANGELOG.md agree."""

from __future__ import annotations

import re
from pathlib import Path

import streamio

ROOT = Path(__file__).parents[2]


def test_the_version_is_the_same_everywhere() -> None:
    project = ROOT.joinpath("pyproject.toml").read_text(encoding="utf-8")
    [declared] = re.findall(r'(?m)^version = "([^"]+)"$', project)
    changelog = ROOT.joinpath("CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog)
    assert streamio.__version__ == declared == releases[0], (streamio.__version__, declared, releases[:1])


def test_the_changelog_keeps_an_unreleased_section_on_top() -> None:
    changelog = ROOT.joinpath("CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"(?m)^## \[([^\]]+)\]", changelog)
    assert sections[0] == "Unreleased" and sections[1] == streamio.__version__
