"""The planner's resume state: its keys, fingerprint, parsing and checks (see :mod:`streamio.data.plan`).

A state is a small JSON-safe dict: a version, a fingerprint of everything the plan is a function of
(samples per shard, index fingerprint, seed, sampling), the epoch, and one record per stage (its
topology and the batches each rank's consumer took). This module builds and reads those dicts; the
replay of the stages is :func:`streamio.data.plan.plan_epoch`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from streamio.data.plan.config import (
    MAX_BATCH_SIZE,
    MAX_STREAMS,
    MAX_WORKERS,
    MAX_WORLD_SIZE,
    Sampling,
    Topology,
    check_int,
)
from streamio.data.plan.mixture import PlanSource
from streamio.errors import PlanError, StateMismatchError
from streamio.state_version import VERSION_KEY, check_version

__all__ = [
    "STATE_VERSION",
    "StageRecord",
    "check_stage_fits",
    "check_state",
    "fingerprint",
    "make_state",
    "parse_stages",
    "per_rank_counts",
    "stage_record",
]

STATE_VERSION = 1
"""Version of the resume-state dict; a state of another version is rejected."""

# State keys (constants so the dataset and tests never spell them differently).
K_VERSION, K_FINGERPRINT, K_EPOCH, K_STAGES = VERSION_KEY, "fingerprint", "epoch", "stages"
K_WORLD, K_WORKERS, K_BATCH, K_BATCHES = "world_size", "num_workers", "batch_size", "batches"
K_SOURCES, K_CONTRIBUTION = "sources", "contribution"

_FROM_STATE_DICT = "pass a dict made by EpochPlan.state_dict()"
_NOT_OURS = " No job makes such a state: resume from another checkpoint or start the epoch fresh."

MAX_STAGES = 256
"""Most topology changes one epoch's resume state may record (each is replayed when it is loaded)."""
SMALL_WORLD = 4096
"""Ranks a stage of a state may have beyond its samples (under ``"pad"`` each extra rank only repeats one)."""


class StageRecord(NamedTuple):
    """One parsed stage of a state: its topology (as streams), per-rank batches, and the raw dict."""

    topology: Topology
    batches: list[int]
    raw: dict[str, Any]


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def per_rank_counts(batches: Any, world: int, what: str) -> list[int]:
    """``batches`` (one int, or one int per rank) as one count per rank, each >= 0.

    Raises:
        PlanError: not an int or a list of ints, a list of the wrong length, or a negative count;
            the message starts with ``what``.
    """
    if _is_int(batches):
        per = [int(batches)] * world
    elif isinstance(batches, Sequence) and not isinstance(batches, str) and all(_is_int(x) for x in batches):
        per = [int(x) for x in batches]
        if len(per) != world:
            raise PlanError(f"{what}: {len(per)} per-rank counts for world_size={world}; give one per rank or one int.")
    else:
        raise PlanError(f"{what}: batches={_short(batches)}; expected an int or a list of ints, one per rank.")
    if any(c < 0 for c in per):
        raise PlanError(f"{what}: batches={_short(batches)}; consumed counts must be >= 0.")
    return per


def _digest(counts: np.ndarray) -> str:
    return "sha256:" + hashlib.sha256(counts.astype("<i8").tobytes()).hexdigest()[:32]


def fingerprint(sources: Sequence[PlanSource], shares: Sequence[int], seed: int, sampling: Sampling) -> dict[str, Any]:
    """What a plan is a function of, besides epoch and topology; a state must match it to resume.

    One data set read whole is recorded as before mixtures existed (``samples``, ``index``), so its
    states stay valid; a mixture records each source's samples, index and contribution.
    """
    only = sources[0]
    if len(sources) == 1 and only.weight is None and only.samples is None and shares[0] == only.size:
        return {"samples": _digest(only.counts), "index": only.fingerprint, "seed": seed, **sampling.as_json()}
    mix = [
        {"samples": _digest(s.counts), "index": s.fingerprint, K_CONTRIBUTION: int(c)}
        for s, c in zip(sources, shares, strict=True)
    ]
    return {K_SOURCES: mix, "seed": seed, **sampling.as_json()}


def _differences(theirs: Mapping[str, Any], fp: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """One line per fingerprint entry that differs; a mixture's sources are compared one by one."""
    diffs = [
        f"{k}: state has {_short(theirs.get(k))}, this plan has {fp[k]!r}"
        for k in fp
        if k != K_SOURCES and theirs.get(k) != fp[k]
    ]
    if (K_SOURCES in fp) != (K_SOURCES in theirs):
        n = len(fp.get(K_SOURCES, [None]))
        m = len(theirs[K_SOURCES]) if isinstance(theirs.get(K_SOURCES), list) else 1
        return [f"sources: the state is of {m} source(s) read as {'a mixture' if m > 1 else 'one data set'}, "
                f"this plan has {n}"]
    mine, old = fp.get(K_SOURCES, []), theirs.get(K_SOURCES, [])
    if not isinstance(old, list) or len(old) != len(mine):
        got = len(old) if isinstance(old, list) else _short(old)
        return [f"sources: the state has {got} sources, this plan has {len(mine)}"]
    for i, (a, b) in enumerate(zip(old, mine, strict=True)):
        for k in b:
            if not isinstance(a, Mapping) or a.get(k) != b[k]:
                what = "samples per epoch (its weight, samples= or epoch_samples)" if k == K_CONTRIBUTION else k
                got = a.get(k) if isinstance(a, Mapping) else a
                who = names[i] if i < len(names) else f"source {i}"
                diffs.append(f"{who} {what}: state has {_short(got)}, this plan has {b[k]!r}")
    return diffs


def stage_record(topology: Topology, batches: list[int]) -> dict[str, Any]:
    """A stage's entry in the state: its topology and the batches each rank's consumer took."""
    taken: int | list[int] = batches[0] if len(set(batches)) == 1 else batches
    return {K_WORLD: topology.world_size, K_WORKERS: topology.workers, K_BATCH: topology.batch_size, K_BATCHES: taken}


def make_state(fp: Mapping[str, Any], epoch: int, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The resume state of ``epoch`` after ``stages`` (the last one still being read)."""
    return {K_VERSION: STATE_VERSION, K_FINGERPRINT: dict(fp), K_EPOCH: epoch, K_STAGES: stages}


def parse_stages(state: Mapping[str, Any]) -> list[StageRecord]:
    """The stages of a state, validated (topologies, counts); not yet checked against the data.

    Raises:
        PlanError: no stage list, or a malformed stage.
    """
    stages = state.get(K_STAGES)
    if not isinstance(stages, list):
        raise PlanError(f"resume state has no {K_STAGES!r} list; {_FROM_STATE_DICT}.")
    if len(stages) > MAX_STAGES:
        raise PlanError(
            f"resume state has {len(stages)} stages (topology changes in one epoch), above the limit of "
            f"{MAX_STAGES}; {_FROM_STATE_DICT}."
        )
    out = []
    for i, st in enumerate(stages):
        if not isinstance(st, Mapping) or not all(k in st for k in (K_WORLD, K_WORKERS, K_BATCH, K_BATCHES)):
            raise PlanError(f"resume state stage {i} is malformed ({_short(st)}); {_FROM_STATE_DICT}.")
        # every size is bounded before anything is allocated for it: the state may be hostile
        what = f"resume state stage {i}"
        world = check_int(f"{what} world_size", st[K_WORLD], 1, MAX_WORLD_SIZE, fix=_NOT_OURS)
        workers = check_int(f"{what} num_workers", st[K_WORKERS], 1, MAX_WORKERS, fix=_NOT_OURS)
        batch = check_int(f"{what} batch_size", st[K_BATCH], 1, MAX_BATCH_SIZE, fix=_NOT_OURS)
        if world * workers > MAX_STREAMS:
            raise PlanError(
                f"{what}: world_size={world} x num_workers={workers} worker streams is above the limit of "
                f"{MAX_STREAMS}; {_FROM_STATE_DICT}."
            )
        topo = Topology(world, workers, batch)
        per = per_rank_counts(st[K_BATCHES], world, what)
        out.append(StageRecord(topo, per, dict(st)))
    return out


def check_stage_fits(index: int, topology: Topology, samples: int) -> None:
    """Refuse a stage of a loaded state with more ranks than its ``samples`` could need.

    Checked against the data before the stage is replayed: a stage's rest carries its padding into
    the next stage, so a state claiming a million ranks over 24 samples would plan a million.

    Raises:
        PlanError: ``topology.world_size`` exceeds both ``samples`` and :data:`SMALL_WORLD`.
    """
    if topology.world_size > max(samples, SMALL_WORLD):
        raise PlanError(
            f"resume state stage {index}: world_size={topology.world_size} is more ranks than the {samples} "
            f"samples that stage reads (and above {SMALL_WORLD}); the state was not made for this data set. "
            f"{_FROM_STATE_DICT[0].upper()}{_FROM_STATE_DICT[1:]}."
        )


def _short(value: object) -> str:
    """``repr(value)`` cut to a length a message can hold (a hostile state may be huge)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def check_state(state: object, fp: Mapping[str, Any], epoch: int, names: Sequence[str] = ()) -> Mapping[str, Any]:
    """``state`` when its version, fingerprint and epoch are this plan's.

    Raises:
        PlanError: another state version, or no fingerprint.
        StateMismatchError: the state belongs to another data set, seed, sampling or epoch; the
            message names each difference.
    """
    state = check_version(state, STATE_VERSION, what="resume state", error=PlanError)
    theirs = state.get(K_FINGERPRINT)
    if not isinstance(theirs, Mapping):
        raise PlanError(f"resume state has no fingerprint; {_FROM_STATE_DICT}.")
    diffs = _differences(theirs, fp, names)
    if state.get(K_EPOCH) != epoch:
        diffs.append(f"epoch: state has {_short(state.get(K_EPOCH))}, this plan has {epoch!r}")
    if diffs:
        raise StateMismatchError(
            f"resume state does not belong to this plan ({'; '.join(diffs)}); resume with the data set (or "
            "mixture), seed, policy, shuffle and epoch it was taken with, or start fresh."
        )
    return state
