"""Each test gets a fresh Accelerate state: ``AcceleratorState`` and ``GradientState`` are shared by
every ``Accelerator`` of a process (Accelerate's own tests reset them the same way)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import s3fs

pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def _fresh_accelerate() -> Iterator[None]:
    from accelerate.state import AcceleratorState, GradientState

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
