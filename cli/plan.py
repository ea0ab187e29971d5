"""``streamio plan``: show how an epoch of a dataset is split over ranks and workers, and check it.

Thin by design: it loads the index (:func:`streamio.data.index.load_index`), calls the pure planner
(:func:`streamio.data.plan.plan_epoch`) and prints, per rank, the samples, batches and shard runs,
the padding or dropping the tail policy states, and the result of :meth:`EpochPlan.check`
(invariants 1 "exactly once" and 2 "equal work" for this topology). Exit status 1 when a check
fails; other errors follow :mod:`streamio.cli.exits` (a split this dataset cannot give, such as
more ranks than samples with ``--policy drop``, is a usage error: 2). ``--json`` prints the same
as one JSON document.
"""

from __future__ import annotations

import json
from typing import Any

import click

from streamio.data.index import DatasetIndex, load_index
from streamio.data.plan import EpochPlan, Run, Sampling, Shuffle, Topology, plan_epoch
from streamio.storage import Store

from .common import storage_option
from .exits import ExitCode, exit_codes_help


def _run_text(index: DatasetIndex, run: Run) -> str:
    return f"{index.shards[run.shard].path}[{run.first}:{run.end}]"


def _rank_runs(plan: EpochPlan, rank: int) -> list[Run]:
    return [run for s in plan.streams(rank) for run in s.runs]


def _report(
    url: str, index: DatasetIndex, plan: EpochPlan, shuffle: Shuffle, seed: int, problems: list[str]
) -> dict[str, Any]:
    ranks = []
    for rank in range(plan.world_size):
        runs = _rank_runs(plan, rank)
        ranks.append(
            {
                "rank": rank,
                "samples": sum(s.size for s in plan.streams(rank)),
                "batches": sum(s.batches for s in plan.streams(rank)),
                "shards": len({r.shard for r in runs}),
                "runs": [[index.shards[r.shard].path, r.first, r.end] for r in runs],
            }
        )
    return {
        "url": url,
        "fingerprint": index.fingerprint,
        "shards": len(index.shards),
        "samples": plan.total_samples,
        "epoch": plan.epoch,
        "seed": seed,
        "policy": plan.policy,
        "shuffle": {"shards": shuffle.shards, "window": shuffle.window},
        "world_size": plan.world_size,
        "num_workers": plan.num_workers,
        "batch_size": plan.batch_size,
        "samples_per_rank": plan.samples_per_rank,
        "batches_per_rank": plan.batches_per_rank,
        "last_batch": plan.samples_per_rank % plan.batch_size or min(plan.batch_size, plan.samples_per_rank),
        "padding": plan.padding,
        "dropped": plan.dropped,
        "ranks": ranks,
        "checks": {
            "exactly_once": not any(p.startswith("exactly once") for p in problems),
            "equal_work": not any(p.startswith("equal work") for p in problems),
        },
        "problems": problems,
    }


def _print_human(rep: dict[str, Any], index: DatasetIndex, plan: EpochPlan, show_runs: int) -> None:
    echo = click.echo
    echo(
        f"dataset   {rep['url']}: {rep['samples']:,} samples in {rep['shards']:,} shards "
        f"({rep['fingerprint'][:19]}...)"
    )
    echo(
        f"plan      epoch {rep['epoch']}, seed {rep['seed']}, policy {rep['policy']}, world {rep['world_size']} x "
        f"{rep['num_workers']} workers, batch {rep['batch_size']}, "
        f"shuffle shards={rep['shuffle']['shards']} window={rep['shuffle']['window']}"
    )
    echo(
        f"per rank  {rep['samples_per_rank']:,} samples, {rep['batches_per_rank']:,} batches "
        f"(last batch {rep['last_batch']} samples)"
    )
    if rep["padding"]:
        echo(
            f"tail      pad: {rep['padding']:,} sample(s) repeated (the start of this epoch's order) "
            f"so every rank gets {rep['samples_per_rank']:,}"
        )
    elif rep["dropped"]:
        echo(f"tail      drop: {rep['dropped']:,} sample(s) left out this epoch (the end of this epoch's order)")
    else:
        echo("tail      none: the samples divide evenly")
    echo(f"{'rank':>6} {'samples':>9} {'batches':>8} {'runs':>6} {'shards':>6}  runs")
    for r in rep["ranks"]:
        runs = _rank_runs(plan, r["rank"])
        shown = " ".join(_run_text(index, run) for run in runs[:show_runs])
        more = f" ... (+{len(runs) - show_runs} more)" if len(runs) > show_runs else ""
        echo(f"{r['rank']:>6} {r['samples']:>9,} {r['batches']:>8,} {len(runs):>6} {r['shards']:>6}  {shown}{more}")
    once = "OK" if rep["checks"]["exactly_once"] else "FAILED"
    equal = "OK" if rep["checks"]["equal_work"] else "FAILED"
    echo(f"checks    exactly once (+{rep['padding']} padded, -{rep['dropped']} dropped): {once}; equal work: {equal}")
    for p in rep["problems"]:
        echo(f"  problem: {p}", err=True)


@click.command("plan", epilog=exit_codes_help())
@click.argument("url")
@click.option("--world-size", "-R", type=click.IntRange(min=1), required=True, help="Ranks (processes) in the job.")
@click.option(
    "--workers", "-W", type=click.IntRange(min=0), default=0, show_default=True, help="DataLoader workers per rank."
)
@click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--policy", type=click.Choice(["pad", "drop"]), default="pad", show_default=True,
    help="Tail policy when samples do not divide evenly.",
)
@click.option(
    "--batch-size", "-B", type=click.IntRange(min=1), default=1, show_default=True, help="DataLoader batch size."
)
@click.option(
    "--window", type=click.IntRange(min=0), default=0, show_default=True, help="Sample-level shuffle window (0 = none)."
)
@click.option("--no-shard-shuffle", is_flag=True, help="Keep shards in index order (evaluation).")
@click.option(
    "--runs", "show_runs", type=click.IntRange(min=0), default=3, show_default=True, help="Runs listed per rank."
)
@storage_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
def plan_cmd(
    url: str, world_size: int, workers: int, epoch: int, seed: int, policy: str, batch_size: int, window: int,
    no_shard_shuffle: bool, show_runs: int, storage_options: dict[str, Any], as_json: bool,
) -> None:
    """Show and check how an epoch of the dataset at URL is split over ranks and workers.

    Prints per-rank samples and batches, the padding or dropping of the tail policy, each rank's
    shard runs, and checks that every sample is yielded once (+- the stated tail) and that every
    rank does the same work. Exits 1 when a check fails, 2 when this dataset cannot be split this
    way, 3 when the dataset could not be read.
    """
    shuffle = Shuffle(shards=not no_shard_shuffle, window=window)
    index = load_index(Store(url, storage_options))
    plan = plan_epoch(
        index.sample_counts(), seed=seed, epoch=epoch, topology=Topology(world_size, workers, batch_size),
        sampling=Sampling(shuffle, policy),  # type: ignore[arg-type]
        index_fingerprint=index.fingerprint,
    )
    problems = plan.check()
    rep = _report(url, index, plan, shuffle, seed, problems)
    if as_json:
        click.echo(json.dumps(rep))
    else:
        _print_human(rep, index, plan, show_runs)
    if problems:
        raise click.exceptions.Exit(ExitCode.BAD)


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    group.add_command(plan_cmd)
