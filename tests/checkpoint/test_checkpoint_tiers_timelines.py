"""Timelines across tiers: a restore takes the newest *timeline*, whichever tier holds it (issue 25).

A local tier and the durable root can each hold saves the other has not seen: saves after the last
durable one, or a root that another job (on other nodes) moved on. When one side went back past
the other's saves (``restore(step=...)``, then saves of its own), those saves are abandoned, on
whichever tier they are, even at a higher step: the restore continues the timeline that continued
or abandoned the others, as the root alone does with its pointer (docs/checkpoint-lifecycle.md).
And local retention keeps the newest saves of that timeline only. Real local directories for the
tiers and the roots: one process, no server needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions
from streamio.checkpoint import root as roots
from streamio.checkpoint.format.timeline import Timeline, Tip, branch, contains, newest
from streamio.checkpoint.restore.candidates import Candidate
from streamio.checkpoint.restore.local import current_tip
from streamio.storage import Store

OPTIONS = SaveOptions(part_size=64 << 10, durable_every=2)


def state(value: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(value)
    return {"w": torch.randn(64, 256, generator=g), "progress": {"value": value}}


def restore(root: str, local: str | None, step: int | None = None) -> tuple[int, int]:
    """A new job: (the step restored, which state it was)."""
    got: dict[str, Any] = {"w": torch.zeros(64, 256), "progress": None}
    tier = None if local is None else LocalTier(local)
    with CheckpointManager(root, local=tier, options=OPTIONS) as mgr:
        step = mgr.restore(got, step=step)
    value = got["progress"]["value"]
    assert torch.equal(got["w"], state(value)["w"])
    return step, value


def save(root: str, local: str, steps: list[tuple[int, int]], *, restore_step: int | None = None) -> None:
    """A job that restores ``restore_step`` (if given), then saves ``(step, state value)`` in order."""
    with CheckpointManager(root, local=LocalTier(local), options=OPTIONS) as mgr:
        if restore_step is not None:
            mgr.restore({"w": torch.zeros(64, 256), "progress": None}, step=restore_step)
        for step, value in steps:
            mgr.save(step, state(value))


def local_steps(local: str) -> list[int]:
    return [s.step for s in roots.committed_saves(Store(f"{local}/rank-00000"))]


def test_a_rollback_saved_on_the_local_tier_only_is_what_the_next_start_restores(tmp_path: Path) -> None:
    root, local = str(tmp_path / "root"), str(tmp_path / "local")
    save(root, local, [(s, s) for s in (1, 2, 3, 4)])  # the root: 2 and 4; the local tier: 3 and 4
    assert restore(root, local, step=2) == (2, 2)  # from the root alone
    save(root, local, [(3, 33)], restore_step=2)  # one save after the rollback: local only
    assert roots.pointed_step(Store(root)) == 4
    # the root's 4 is at a higher step, but the rollback went back past it
    assert restore(root, local) == (3, 33)
    assert local_steps(local) == [3]  # the abandoned 3 and 4 are gone; 2 is the root's alone


def test_a_rollback_of_the_same_step_wins_over_the_root_s(tmp_path: Path) -> None:
    root, local = str(tmp_path / "root"), str(tmp_path / "local")
    save(root, local, [(s, s) for s in (1, 2, 3, 4)])
    assert restore(root, local, step=3) == (3, 3)  # on the local tier only
    save(root, local, [(4, 44)], restore_step=3)
    assert local_steps(local) == [3, 4]  # the restored 3 and the new 4; the superseded 4 is gone
    assert restore(root, local) == (4, 44)


def test_a_stale_local_tier_never_undoes_a_rollback_made_elsewhere(tmp_path: Path) -> None:
    """Node A's tier holds steps 4-5 of the first timeline; a job elsewhere went back to step 2 and
    made its own step 4 durable. A job on node A again continues that, not its own old step 5."""
    root, node_a, node_b = str(tmp_path / "root"), str(tmp_path / "a"), str(tmp_path / "b")
    save(root, node_a, [(s, s) for s in (1, 2, 3, 4, 5)])
    save(root, node_b, [(3, 33), (4, 44)], restore_step=2)  # its 4 goes to the root
    assert roots.pointed_step(Store(root)) == 4
    assert restore(root, node_a) == (4, 44)


# ------------------------------------------------------------------ newest(): the pure rule
@st.composite
def job_histories(draw: st.DrawFn) -> list[Tip]:
    """The pointers one root's jobs wrote, in order: each job restores a save of the current
    timeline (the newest, or one further back), then saves a few steps past it (or, ``again``,
    the restored step itself first)."""
    saves: list[Tip] = []
    tips: list[Tip] = []
    for job in range(draw(st.integers(1, 7))):
        back, count, again = draw(st.integers(0, 4)), draw(st.integers(1, 3)), draw(st.booleans())
        if not tips:
            timeline, first = Timeline(f"t{job}"), 1
        else:
            line = sorted((s for s in saves if contains(tips[-1], s.timeline.id, s.step)), key=lambda s: s.step)
            start = line[-1 - min(back, len(line) - 1)]
            first = start.step + (0 if again else 1)
            timeline = branch(start.timeline, start.step, new_id=f"t{job}", first_step=first)
        for step in range(first, first + count):
            saves.append(Tip(timeline, step))
            tips.append(Tip(timeline, step))
    return tips


@given(job_histories(), st.data())
def test_the_restore_stands_on_the_pointer_written_last(tips: list[Tip], data: st.DataObject) -> None:
    """Whichever of a root's pointers the root and the ranks' local tiers still hold, a restore
    stands on the one written last; the timelines alone never name an older one."""
    for i, older in enumerate(tips):
        for later in tips[i + 1:]:
            assert newest([older, later]) in (later, None) and newest([later, older]) in (later, None)
    held = sorted(set(data.draw(st.lists(st.integers(0, len(tips) - 1), min_size=1, max_size=4))))
    candidates = [Candidate(tips[i].step, f"save-{i}", "crc32c:0", line=tips[i].timeline, created=f"{i:04d}")
                  for i in data.draw(st.permutations(held))]
    root, local = candidates[:1], [[c] for c in candidates[1:]]
    assert current_tip(root, local) == tips[held[-1]]


def test_newest_of_unrelated_timelines_is_none() -> None:
    assert newest([Tip(Timeline("a"), 5), Tip(Timeline("b"), 3)]) is None
    assert newest([]) is None
