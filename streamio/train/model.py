"""The demo model: a small MLP with dropout (so exact resume must restore the dropout RNG too)."""

from __future__ import annotations

from torch import nn

from streamio.train.data import DIM, NUM_CLASSES


def make_model(*, hidden: int = 128, dropout: float = 0.1, in_dim: int = DIM, classes: int = NUM_CLASSES) -> nn.Module:
    """``in_dim -> hidden -> hidden -> classes`` with GELU and dropout after each hidden layer."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, classes),
    )
