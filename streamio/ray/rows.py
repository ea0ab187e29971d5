"""Ray rows -> streamio samples: one member per column, values as ``write_dataset`` takes them.

A Ray Data row is a mapping of column to value as Arrow or pandas hands it out. Bytes, str, int
and JSON values pass as they are (``write_dataset`` encodes them); a numpy array becomes the bytes
of a ``.npy`` file (``numpy.save``, never pickled), a numpy scalar its Python value; a null
(a missing value in a nullable column) is no member at all. A row without ``__key__`` gets
``p{partition:06d}-{n:09d}``, unique across the dataset.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["sample_of"]


def _value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if isinstance(value, np.generic):
        return value.item()
    return value


def sample_of(row: Mapping[str, Any], part: int, number: int) -> dict[str, Any]:
    """The sample a row makes (see the module docstring)."""
    sample = {k: _value(v) for k, v in row.items() if v is not None}
    sample.setdefault("__key__", f"p{part:06d}-{number:09d}")
    return sample


def rows_of(blocks: Iterator[Any], part: int, accessor: Any) -> Iterator[dict[str, Any]]:
    """Every row of ``blocks`` as a sample, in order (``accessor``: ``ray.data.block.BlockAccessor``)."""
    number = 0
    for block in blocks:
        for row in accessor.for_block(block).iter_rows(public_row_format=True):
            yield sample_of(row, part, number)
            number += 1
