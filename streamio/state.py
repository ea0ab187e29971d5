"""Where :class:`RNGState` lived before it moved next to the checkpoint it is saved with.

``RNGState`` is :mod:`streamio.checkpoint.rng` now (also ``streamio.RNGState``); this module
re-exports it so that ``from streamio.state import RNGState`` keeps working.
"""

from __future__ import annotations

from streamio.checkpoint.rng import STATE_VERSION, RNGState

__all__ = ["RNGState", "STATE_VERSION"]
