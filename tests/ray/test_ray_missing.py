"""streamio.ray without Ray: it imports, and using it says what to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamio.errors import MissingDependencyError, StreamioError

BLOCK_RAY = "import sys; sys.modules['ray'] = None; sys.modules['ray.data'] = None\n"


@pytest.mark.parametrize("name", ["DatasetSink", "index"])
def test_streamio_ray_imports_without_ray_and_says_what_to_install(name: str) -> None:
    code = BLOCK_RAY + f"""
import streamio.ray
from streamio.errors import MissingDependencyError
try:
    getattr(streamio.ray, {name!r})("s3://bucket/ds") if {name!r} == "index" else streamio.ray.{name}
except MissingDependencyError as exc:
    print("ERROR", isinstance(exc, ImportError), exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith("ERROR True streamio.ray needs Ray Data (")
    assert out.rstrip().endswith("Install it with pip install 'streamio-torch[ray]'")


def test_the_error_is_in_the_tree() -> None:
    assert issubclass(MissingDependencyError, StreamioError) and issubclass(MissingDependencyError, ImportError)
