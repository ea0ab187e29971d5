"""Fixtures of the trainer and preemption tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def usr1_restored() -> Iterator[dict[int, Any]]:
    """SIGUSR1 and SIGTERM as they were before the test, whatever it installed."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    yield before
    for s, handler in before.items():
        signal.signal(s, handler)
