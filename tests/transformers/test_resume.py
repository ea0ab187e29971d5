"""``resume_from_checkpoint`` values against a StreamioTrainer's root (pure: no Trainer, no storage)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.errors import ArgumentError
from streamio.transformers.resume import Resume, parse_resume

ROOT = "s3://bucket/run/ckpt"


@given(st.integers(min_value=0, max_value=10**12))
def test_every_spelling_of_a_step_names_that_step(step: int) -> None:
    for value in (step, str(step), f"step-{step:09d}", f"checkpoint-{step}", f"{ROOT}/step-{step:09d}",
                  f"{ROOT}/checkpoint-{step}/"):
        assert parse_resume(value, ROOT) == Resume(step, required=True), value


def test_true_may_start_fresh_the_root_itself_may_not_and_none_or_false_start_fresh() -> None:
    assert parse_resume(True, ROOT) == Resume(None, required=False)
    assert parse_resume(ROOT + "/", ROOT) == Resume(None, required=True)
    assert parse_resume(None, ROOT) is None
    assert parse_resume(False, ROOT) is None


@pytest.mark.parametrize("value, says", [
    ("s3://bucket/other-run/ckpt", "is not a checkpoint of this trainer's checkpoint_root 's3://bucket/run/ckpt'"),
    ("out/checkpoint-500", "resumes only from its own root"),  # a stock Trainer folder
    (f"{ROOT}-old", "is not a checkpoint of this trainer's checkpoint_root"),  # a sibling prefix, not the root
    ("step--3", "is not a checkpoint"),
    ("9" * 19, "is not a checkpoint"),  # beyond any step
    (-1, "a step is an int >= 0"),
    (2.0, "(float): pass True, a step, or the checkpoint root"),
])
def test_anything_else_is_refused_naming_the_value_and_the_root(value: object, says: str) -> None:
    with pytest.raises(ArgumentError) as info:
        parse_resume(value, ROOT)
    assert says in str(info.value)
    assert repr(value) in str(info.value) or str(value) in str(info.value)
