"""Equality of nested checkpoint structures, as a round trip must keep them."""

from __future__ import annotations

from typing import Any

import torch


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` hold equal tensors (same dtype), dicts, lists and tuples (same types), values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b) and type(a) is type(b)
