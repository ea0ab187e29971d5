"""Fixtures of the checkpoint tests that start rank processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.sharded_procs import Zygote


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """A process that forks groups of gloo ranks (tests/support/sharded_procs.py); the kill tests'
    modules define a ``zygote`` of their own, which takes precedence there."""
    z = Zygote()
    yield z
    z.close()
