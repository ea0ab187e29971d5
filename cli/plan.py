"""``streamio plan``: show how an epoch of a dataset (or a mixture) is split over ranks and workers, and check it.

Thin by design: it loads the index of each source (:func:`streamio.data.locate.open_dataset`), calls the pure planner
(:func:`streamio.data.plan.plan_epoch`) and prints, per rank, the samples, batches and shard runs,
the padding or dropping the tail policy states, and the result of :meth:`EpochPlan.check`
(invariants 1 "exactly once" and 2 "equal work" for this topology). Exit status 1 when a check
fails; other errors follow :mod:`streamio.cli.exits` (a split this dataset cannot give, such as
more ranks than samples with ``--policy drop``, is a usage error: 2). ``--json`` prints the same
as one JSON document.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from .common import MAX_COUNT, MAX_SEED, bounded, storage_option
from .exits import ExitCode, exit_codes_help
from .progress import plural
from .schemas import json_help

if TYPE_CHECKING:  # the library is imported inside the verb: `streamio --help` does not load it
    from streamio.data.format.index import DatasetIndex
    from streamio.data.plan import EpochPlan, Run, Shuffle

#: The largest job ``plan`` describes: a million ranks.
MAX_WORLD_SIZE = 1 << 20
#: DataLoader workers per rank.
MAX_WORKERS = 1024
#: Shards a worker reads at once: the planner's own limit (``Shuffle.interleave``).
MAX_INTERLEAVE = 4096

#: Readers (ranks x workers) a plan may have beyond one per sample of the epoch: tiny datasets stay plannable.
MIN_READERS = 4096
#: The most times ``--epoch-samples`` may repeat the sources' samples in one epoch.
MAX_REPEATS = 100


def _check_claims(world_size: int, workers: int, epoch_samples: int | None, samples: int) -> None:
    """Refuse a topology whose planning work would grow with a claimed number rather than with the dataset.

    A plan costs time per reader (rank x worker) and per sample of the epoch; both are checked
    against the sources' ``samples`` before anything is planned, so ``-R 1000000000`` on a small
    dataset is a usage error at once, not days of planning.
    """
    if epoch_samples is not None and epoch_samples > MAX_REPEATS * samples:
        raise click.BadParameter(
            f"{epoch_samples:,} samples an epoch would repeat each of the sources' {samples:,} samples more than "
            f"{MAX_REPEATS} times; at most {MAX_REPEATS * samples:,}",
            param_hint="'--epoch-samples'",
        )
    epoch = epoch_samples or samples
    readers, limit = world_size * max(workers, 1), max(epoch, MIN_READERS)
    if readers > limit:
        raise click.UsageError(
            f"--world-size {world_size:,} x --workers {max(workers, 1):,} makes {readers:,} readers for an epoch of "
            f"{epoch:,} samples: most would have nothing to read; at most {limit:,} readers can be planned for it "
            f"(one per sample, and never fewer than {MIN_READERS:,})"
        )


class _Shards:
    """The sources' shards numbered as the plan numbers them (source after source)."""

    def __init__(self, indexes: list[DatasetIndex]) -> None:
        self.indexes = indexes
        self.starts = [0]
        for ix in indexes:
            self.starts.append(self.starts[-1] + len(ix.shards))

    def source(self, shard: int) -> int:
        return max(i for i, start in enumerate(self.starts[:-1]) if start <= shard)

    def path(self, shard: int) -> str:
        i = self.source(shard)
        path = self.indexes[i].shards[shard - self.starts[i]].path
        return path if len(self.indexes) == 1 else f"{i}:{path}"


def _run_text(shards: _Shards, run: Run) -> str:
    return f"{shards.path(run.shard)}[{run.first}:{run.end}]"


def _rank_runs(plan: EpochPlan, rank: int) -> list[Run]:
    return [run for s in plan.streams(rank) for run in s.runs]


def _report(
    sources: list[dict[str, Any]], shards: _Shards, plan: EpochPlan, shuffle: Shuffle, seed: int, problems: list[str]
) -> dict[str, Any]:
    ranks = []
    for rank in range(plan.world_size):
        runs = _rank_runs(plan, rank)
        per_source = [0] * len(sources)
        for r in runs:
            per_source[shards.source(r.shard)] += r.end - r.first
        ranks.append(
            {
                "rank": rank,
                "samples": sum(s.size for s in plan.streams(rank)),
                "batches": sum(s.batches for s in plan.streams(rank)),
                "per_source": per_source,
                "shards": len({r.shard for r in runs}),
                "runs": [[shards.path(r.shard), r.first, r.end] for r in runs],
            }
        )
    for src, c in zip(sources, plan.contributions, strict=True):
        src["samples_per_epoch"] = c
    one = shards.indexes[0]
    return {
        "url": sources[0]["url"] if len(sources) == 1 else None,
        "fingerprint": one.fingerprint if len(sources) == 1 else None,
        "sources": sources,
        "shards": shards.starts[-1],
        "samples": plan.total_samples,
        "epoch": plan.epoch,
        "seed": seed,
        "policy": plan.policy,
        "shuffle": {"shards": shuffle.shards, "window": shuffle.window, "interleave": shuffle.interleave},
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


def _print_human(rep: dict[str, Any], shards: _Shards, plan: EpochPlan, show_runs: int) -> None:
    echo = click.echo
    if rep["url"] is not None:
        echo(
            f"dataset   {rep['url']}: {plural(rep['samples'], 'sample')} in {plural(rep['shards'], 'shard')} "
            f"({rep['fingerprint'][:19]}...)"
        )
    else:
        echo(f"mixture   {plural(len(rep['sources']), 'source')}, {plural(rep['samples'], 'sample')} per epoch")
        for i, src in enumerate(rep["sources"]):
            share = f"weight {src['weight']:g}, " if src["weight"] is not None else ""
            echo(
                f"  {i}: {src['url']}: {share}{plural(src['samples_per_epoch'], 'sample')} per epoch "
                f"of {src['samples']:,} in {plural(src['shards'], 'shard')}"
            )
    echo(
        f"plan      epoch {rep['epoch']}, seed {rep['seed']}, policy {rep['policy']}, world {rep['world_size']} x "
        f"{rep['num_workers']} workers, batch {rep['batch_size']}, "
        f"shuffle shards={rep['shuffle']['shards']} window={rep['shuffle']['window']} "
        f"interleave={rep['shuffle']['interleave']}"
    )
    echo(
        f"per rank  {plural(rep['samples_per_rank'], 'sample')}, {plural(rep['batches_per_rank'], 'batch', 'batches')} "
        f"(last batch {plural(rep['last_batch'], 'sample')})"
    )
    if rep["padding"]:
        echo(
            f"tail      pad: {plural(rep['padding'], 'sample')} repeated (the start of this epoch's order) "
            f"so every rank gets {rep['samples_per_rank']:,}"
        )
    elif rep["dropped"]:
        echo(f"tail      drop: {plural(rep['dropped'], 'sample')} left out this epoch (the end of this epoch's order)")
    else:
        echo("tail      none: the samples divide evenly")
    mix = len(rep["sources"]) > 1
    head = f"{'per source':>16} " if mix else ""
    echo(f"{'rank':>6} {'samples':>9} {'batches':>8} {head}{'runs':>6} {'shards':>6}  runs")
    for r in rep["ranks"]:
        runs = _rank_runs(plan, r["rank"])
        shown = " ".join(_run_text(shards, run) for run in runs[:show_runs])
        more = f" ... (+{len(runs) - show_runs} more)" if len(runs) > show_runs else ""
        split = f"{'/'.join(str(c) for c in r['per_source']):>16} " if mix else ""
        counts = f"{r['rank']:>6} {r['samples']:>9,} {r['batches']:>8,} {split}{len(runs):>6} {r['shards']:>6}"
        echo(f"{counts}  {shown}{more}")
    once = "OK" if rep["checks"]["exactly_once"] else "FAILED"
    equal = "OK" if rep["checks"]["equal_work"] else "FAILED"
    echo(f"checks    exactly once (+{rep['padding']} padded, -{rep['dropped']} dropped): {once}; equal work: {equal}")
    for p in rep["problems"]:
        echo(f"  problem: {p}", err=True)


@click.command("plan", epilog=f"{json_help('plan')}\n\n{exit_codes_help()}")
@click.argument("urls", metavar="URL[:WEIGHT]...", nargs=-1, required=True)
@click.option(
    "--world-size", "-R", type=bounded(1, MAX_WORLD_SIZE), required=True, help="Ranks (processes) in the job."
)
@click.option(
    "--workers", "-W", type=bounded(0, MAX_WORKERS), default=0, show_default=True, help="DataLoader workers per rank."
)
@click.option("--epoch", type=bounded(0, MAX_SEED), default=0, show_default=True)
@click.option("--seed", type=bounded(0, MAX_SEED), default=0, show_default=True)
@click.option(
    "--policy", type=click.Choice(["pad", "drop"]), default="pad", show_default=True,
    help="Tail policy when samples do not divide evenly.",
)
@click.option(
    "--batch-size", "-B", type=bounded(1, MAX_COUNT), default=1, show_default=True, help="DataLoader batch size."
)
@click.option(
    "--window", type=bounded(0, MAX_COUNT), default=256, show_default=True,
    help="Sample-level shuffle window (0 = none); the dataset's default.",
)
@click.option(
    "--interleave", type=bounded(1, MAX_INTERLEAVE), default=32, show_default=True,
    help="Places of its block each worker reads at once (1 = one shard at a time); the dataset's default.",
)
@click.option(
    "--epoch-samples", type=bounded(1, MAX_COUNT), default=None,
    help="Samples per epoch of a mixture (the weighted sources are scaled to fill it).",
)
@click.option("--no-shard-shuffle", is_flag=True, help="Keep shards in index order (evaluation).")
@click.option(
    "--runs", "show_runs", type=bounded(0, MAX_COUNT), default=3, show_default=True, help="Runs listed per rank."
)
@storage_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
def plan_cmd(  # noqa: PLR0913 - one parameter per option
    urls: tuple[str, ...], world_size: int, workers: int, epoch: int, seed: int, policy: str, batch_size: int,
    window: int, interleave: int, epoch_samples: int | None, no_shard_shuffle: bool, show_runs: int,
    storage_options: dict[str, Any], as_json: bool,
) -> None:
    """Show and check how an epoch of the dataset at URL (or a mixture of several) is split over ranks and workers.

    Several URLs, each optionally ``URL:WEIGHT``, plan a mixture as ``StreamingDataset([Stream(url,
    weight=w), ...])`` reads it; a rank's row then shows its samples per source. Prints per-rank
    samples and batches, the padding or dropping of the tail policy, each rank's shard runs, and
    checks that every sample is yielded once (+- the stated tail) and that every rank does the same
    work. Exits 1 when a check fails, 2 when this dataset cannot be split this way, 3 when the
    dataset could not be read.
    """
    from streamio.data.locate import open_dataset
    from streamio.data.mixing import parse_source
    from streamio.data.plan import PlanSource, Sampling, Shuffle, Topology, plan_epoch
    from streamio.errors import ConfigError
    from streamio.storage.secrets import strip_userinfo

    shuffle = Shuffle(shards=not no_shard_shuffle, window=window, interleave=interleave)
    try:
        parsed = [parse_source(u) for u in urls]
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="URL[:WEIGHT]") from None
    indexes = [open_dataset(url, storage_options)[1] for url, _ in parsed]
    _check_claims(world_size, workers, epoch_samples, sum(ix.samples for ix in indexes))
    mixture = len(parsed) > 1 or parsed[0][1] is not None or epoch_samples is not None
    plan = plan_epoch(
        [
            PlanSource(ix.sample_counts(), weight=w, fingerprint=ix.fingerprint, name=f"source {i}")
            for i, ((_, w), ix) in enumerate(zip(parsed, indexes, strict=True))
        ] if mixture else indexes[0].sample_counts(),
        seed=seed, epoch=epoch, topology=Topology(world_size, workers, batch_size),
        sampling=Sampling(shuffle, policy),  # type: ignore[arg-type]
        index_fingerprint=None if mixture else indexes[0].fingerprint, epoch_samples=epoch_samples,
    )
    problems = plan.check()
    sources = [
        {"url": strip_userinfo(url), "weight": w, "shards": len(ix.shards), "samples": ix.samples}
        for (url, w), ix in zip(parsed, indexes, strict=True)
    ]
    shards = _Shards(indexes)
    rep = _report(sources, shards, plan, shuffle, seed, problems)
    if as_json:
        click.echo(json.dumps(rep))
    else:
        _print_human(rep, shards, plan, show_runs)
    if problems:
        raise click.exceptions.Exit(ExitCode.BAD)


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    group.add_command(plan_cmd)
