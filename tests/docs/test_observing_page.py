"""docs/observing.md describes every instrument of the catalogue, and names nothing that is not one."""

from __future__ import annotations

import re
from pathlib import Path

from streamio.metrics import ALL

PAGE = Path(__file__).resolve().parents[2] / "docs" / "observing.md"


def test_the_page_describes_every_instrument_with_its_labels() -> None:
    text = PAGE.read_text()
    rows = re.findall(r"^\| `(streamio_\w+)` \| (\w+) \|([^|]*)\|", text, re.M)
    assert {name: (kind, labels.strip()) for name, kind, labels in rows} == {
        i.name: (i.kind, ", ".join(f"`{label}`" for label in i.labels)) for i in ALL
    }
    assert len(rows) == len(ALL)  # each described once
    named = set(re.findall(r"\bstreamio_[a-z_]+[a-z]", text))
    assert named - {i.name for i in ALL} - {"streamio_loader_wait_seconds_sum"} == set()
