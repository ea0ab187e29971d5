"""Public names that moved keep working until 0.3.0, each use with a DeprecationWarning naming the new home.

``from streamio.state import RNGState`` (streamio 0.1's spelling) and
``streamio.checkpoint.sharded.ShardedModelState`` / ``StreamioWriter`` / ``StreamioReader``
(documented in 0.2.0) give the same objects as ``streamio.checkpoint``'s names; the warning names
the new spelling, the release that removes the old one, and points at the caller's line.
"""

from __future__ import annotations

import importlib

import pytest

import streamio
import streamio.checkpoint


def test_rng_state_from_its_0_1_home_warns_and_is_the_same_class() -> None:
    with pytest.warns(DeprecationWarning, match=r"streamio\.state\.RNGState is deprecated and will be removed in "
                                                r"0\.3\.0: import streamio\.RNGState \(or "
                                                r"streamio\.checkpoint\.RNGState\)") as caught:
        from streamio.state import RNGState
    assert caught[0].filename == __file__  # points at the caller's line
    assert RNGState is streamio.RNGState is streamio.checkpoint.RNGState


def test_every_use_of_the_old_name_warns_not_only_the_first() -> None:
    state = importlib.import_module("streamio.state")
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="streamio.state.STATE_VERSION"):
            assert state.STATE_VERSION == importlib.import_module("streamio.checkpoint.rng").STATE_VERSION


@pytest.mark.parametrize("name", ["ShardedModelState", "StreamioWriter", "StreamioReader"])
def test_the_sharded_names_of_0_2_0_warn_and_are_the_checkpoint_packages_own(name: str) -> None:
    sharded = importlib.import_module("streamio.checkpoint.sharded")
    with pytest.warns(DeprecationWarning, match=rf"streamio\.checkpoint\.sharded\.{name} is deprecated and will be "
                                                rf"removed in 0\.3\.0: import streamio\.checkpoint\.{name}") as caught:
        value = getattr(sharded, name)
    assert caught[0].filename == __file__
    assert value is getattr(streamio.checkpoint, name)
    assert name in streamio.checkpoint.__all__


@pytest.mark.parametrize("module", ["streamio.state", "streamio.checkpoint.sharded"])
def test_a_name_that_never_was_there_is_an_attribute_error(module: str) -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        getattr(importlib.import_module(module), "NoSuchName")  # noqa: B009 - the name is the point
