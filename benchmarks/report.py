"""The one renderer of RESULTS.md: section specs in, markdown lines out.

A report is a sequence of :class:`SectionSpec` values (:mod:`benchmarks.tables` holds them, one per
section). A section is a heading followed by blocks, each block followed by one blank line:
:class:`Text` (prose computed from the results), :class:`Table` (one row per record, one
:class:`Column` per cell: a header and how to format it), :class:`Plots` (image links) and
:class:`Each` (the same blocks once per labelled part, e.g. per checkpoint target). Every block
reads the section's own results (``results[spec.key]``, or the whole results when ``key`` is
``None``), so a new figure in the report is one entry in a spec, not another string-building loop.
A section whose results are missing, failed or skipped is rendered as one status line instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Data = Any  # a section's results (decoded JSON) or one record of it


# ----------------------------------------------------------------------------- formatting
def fmt(x: Any, nd: int = 2) -> str:
    """A number with thousands separators (``nd`` decimals for floats); ``n/a`` for NaN or a non-number."""
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return f"{x:,.{nd}f}" if isinstance(x, float) else f"{x:,}"
    return "n/a"


def med(s: dict[str, Any], nd: int = 1, pct: bool = False) -> str:
    """A :func:`benchmarks.common.summary` as ``median [min-max]`` (times 100 when ``pct``)."""
    k = 100.0 if pct else 1.0
    return f"{fmt(s['median'] * k, nd)} [{fmt(s['min'] * k, nd)}-{fmt(s['max'] * k, nd)}]"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines: header, separator, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


# ----------------------------------------------------------------------------- spec values
@dataclass(frozen=True)
class Column:
    """One table column: its header and the text of its cell for one row record."""

    header: str
    cell: Callable[[Any], str]


@dataclass(frozen=True)
class Table:
    """A markdown table with one row per record of ``rows(data)``.

    ``columns`` empty: the headers are the keys of the first record and each cell is
    ``str(record.get(key))`` (rows that are already flat JSON objects, like the planner's).
    ``empty``: the line written instead of a table that has no rows (``None``: the header alone).
    """

    columns: tuple[Column, ...]
    rows: Callable[[Data], Iterable[Any]]
    empty: str | None = None


@dataclass(frozen=True)
class Text:
    """Lines of prose computed from the data; ``lines`` returning ``None`` leaves the block out."""

    lines: Callable[[Data], list[str] | None]


@dataclass(frozen=True)
class Plots:
    """Image links to the plots written for this report whose file names start with ``prefix``."""

    prefix: str


@dataclass(frozen=True)
class Each:
    """``blocks`` once per ``(label, part)`` of ``parts(data)``, each time after the label in backticks."""

    parts: Callable[[Data], Iterable[tuple[str, Data]]]
    blocks: tuple[Block, ...]


Block = Text | Table | Plots | Each


@dataclass(frozen=True)
class SectionSpec:
    """One section of the report: heading, the results key it renders, its blocks in order."""

    title: str
    blocks: tuple[Block, ...]
    key: str | None = None  # None: the blocks read the whole results and there is no status line
    level: int = 2


# ----------------------------------------------------------------------------- renderer
def status_lines(name: str, sec: dict[str, Any] | None) -> list[str] | None:
    """The line that replaces a section not run, failed or skipped; ``None`` when it has figures."""
    if sec is None:
        return [f"_Not run yet: `python -m benchmarks.run --only {name}`._", ""]
    if sec.get("status") != "ok":
        return [f"**FAILED** ({sec.get('date')}): `{sec.get('error', '')[:600]}`", ""]
    if "skipped" in sec:
        return [f"_Skipped: {sec['skipped']}_", ""]
    return None


def render(specs: Iterable[SectionSpec], results: dict[str, Any], plots: Sequence[str]) -> list[str]:
    """The report's lines for ``results`` (as saved in results.json) and the plot file names written."""
    lines: list[str] = []
    for spec in specs:
        lines += render_section(spec, results, plots)
    return lines


def render_section(spec: SectionSpec, results: dict[str, Any], plots: Sequence[str]) -> list[str]:
    """One section: its heading, then its status line or its blocks."""
    lines = ["#" * spec.level + " " + spec.title, ""]
    if spec.key is None:
        return lines + _blocks(spec.blocks, results, plots)
    sec = results.get(spec.key)
    status = status_lines(spec.key, sec)
    return lines + (status if status is not None else _blocks(spec.blocks, sec, plots))


def _blocks(blocks: Iterable[Block], data: Data, plots: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Each):
            for label, part in block.parts(data):
                lines += [f"`{label}`", ""] + _blocks(block.blocks, part, plots)
            continue
        out = _block(block, data, plots)
        if out is not None:
            lines += out + [""]
    return lines


def _block(block: Text | Table | Plots, data: Data, plots: Sequence[str]) -> list[str] | None:
    if isinstance(block, Text):
        return block.lines(data)
    if isinstance(block, Plots):
        return [f"![{p}]({p})" for p in plots if p.startswith(block.prefix)]
    return table_lines(block, data)


def table_lines(table: Table, data: Data) -> list[str]:
    """The lines of one table for ``data``."""
    records = list(table.rows(data))
    if not records and table.empty is not None:
        return [table.empty]
    columns = table.columns
    if not columns and records:
        columns = tuple(Column(str(k), lambda r, k=k: str(r.get(k))) for k in records[0])
    return markdown_table([c.header for c in columns], ([c.cell(r) for c in columns] for r in records))
