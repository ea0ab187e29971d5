"""``streamio.state_version.check_version``: the one refusal of a state of another version."""

from __future__ import annotations

import pytest

from streamio.errors import CheckpointFormatError, PlanError
from streamio.state_version import check_version


def test_the_expected_version_passes_the_state_through() -> None:
    state = {"version": 3, "x": 1}
    assert check_version(state, 3, what="thing state", error=PlanError) is state


@pytest.mark.parametrize(("state", "found"), [({"version": 2}, "2"), ({}, "None"), ({"version": "3"}, "'3'")])
def test_another_version_raises_the_given_error_naming_both(state: dict, found: str) -> None:
    expected = rf"^thing state has version {found}, but this streamio reads version 3: it was"
    with pytest.raises(CheckpointFormatError, match=expected):
        check_version(state, 3, what="thing state", error=CheckpointFormatError)
    with pytest.raises(PlanError, match=r"reads version 3: use the old trainer\.$"):
        check_version(state, 3, what="thing state", error=PlanError, fix="use the old trainer")


def test_a_non_mapping_is_refused_by_type() -> None:
    with pytest.raises(PlanError, match="thing state must be a dict made by state_dict\\(\\), not a list"):
        check_version([("version", 3)], 3, what="thing state", error=PlanError)
