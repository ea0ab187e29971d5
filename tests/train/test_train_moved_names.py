"""The names ``streamio.train`` re-exported in 0.1 still work, with a warning naming their module."""

from __future__ import annotations

import importlib

import pytest

import streamio.train

MOVED = ["Distributed", "EarlyStopping", "Summary", "TrainConfig", "Trainer", "parse_args",
         "setup_distributed", "teardown_distributed"]


@pytest.mark.parametrize("name", MOVED)
def test_a_name_the_package_re_exported_warns_and_is_the_module_s(name: str) -> None:
    words = rf"streamio\.train\.{name} is deprecated .* import streamio\.train\.\w+\.{name}"
    with pytest.warns(DeprecationWarning, match=words):
        value = getattr(streamio.train, name)
    module = streamio.train._MOVED[name]
    assert value is getattr(importlib.import_module(module), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Trainr'"):
        streamio.train.Trainr  # noqa: B018
