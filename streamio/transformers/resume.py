"""What ``train(resume_from_checkpoint=...)`` asks of a :class:`~.trainer.StreamioTrainer`'s root.

The stock ``Trainer`` takes ``True`` (the newest ``checkpoint-N`` folder of ``output_dir``, a
``ValueError`` when there is none) or a local folder path. A ``StreamioTrainer`` has one
checkpoint root, so each value names a save in it, or nothing:

* ``None`` / ``False``: start fresh (the trainer refuses this on a root that already holds
  checkpoints: they are another run's, or this run's to continue);
* ``True``: the root's newest checkpoint that verifies, or a fresh start when the root holds none
  (what a job that is restarted after a crash, or started for the first time, wants);
* the root's URL itself: its newest checkpoint, which must exist;
* a step (``200``, ``"200"``, ``"step-000000200"``, ``"checkpoint-200"``, or the step's folder under
  the root): exactly that step, no walking back.

Anything else (another root, a stock ``checkpoint-N`` folder elsewhere) is refused: a
``StreamioTrainer`` resumes only from its own root, so a save of another run is never continued
by mistake. Pure: the value and the root in, a :class:`Resume` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamio.errors import ArgumentError

__all__ = ["Resume", "parse_resume"]

_STEP = re.compile(r"^(?:(?:step|checkpoint)-)?(\d{1,18})$")


@dataclass(frozen=True)
class Resume:
    """A resume request: ``step`` (``None``: the newest) and whether an empty root is an error."""

    step: int | None
    required: bool


def parse_resume(value: object, root_url: str) -> Resume | None:
    """What ``resume_from_checkpoint=value`` asks of the root ``root_url`` (``None``: start fresh).

    Raises:
        ArgumentError: ``value`` names no step of ``root_url`` (another root, a local folder, a
            negative step, another type).
    """
    root = root_url.rstrip("/")
    if value is None or value is False:
        return None
    if value is True:
        return Resume(None, required=False)
    if isinstance(value, int):
        if value < 0:
            raise ArgumentError(f"resume_from_checkpoint={value}: a step is an int >= 0")
        return Resume(value, required=True)
    if not isinstance(value, str):
        raise ArgumentError(
            f"resume_from_checkpoint={value!r} ({type(value).__name__}): pass True, a step, or the checkpoint root "
            f"{root!r}"
        )
    text = value.strip().rstrip("/")
    if text == root:
        return Resume(None, required=True)
    name = text[len(root) + 1:] if text.startswith(root + "/") else text
    match = _STEP.match(name)
    if match is None:
        raise ArgumentError(
            f"resume_from_checkpoint={value!r} is not a checkpoint of this trainer's checkpoint_root {root!r}: "
            f"a StreamioTrainer resumes only from its own root; pass True (its newest checkpoint), {root!r}, or a "
            f"step such as 'step-200' (to start from the weights of another checkpoint, load them into the model "
            f"and start fresh)"
        )
    return Resume(int(match.group(1)), required=True)
