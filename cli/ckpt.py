"""`streamio ckpt` verbs: ``ls``, ``inspect``, ``verify``, ``gc``, ``rm`` over a checkpoint root; ``plan`` on paper.

Thin by design: argument parsing and output; the logic lives in :mod:`streamio.checkpoint`
(docs/checkpoint-lifecycle.md explains timelines, bad saves, retention and what ``gc`` removes).
Storage options come from the environment the way s3fs/gcsfs read it (``AWS_ENDPOINT_URL_S3``,
credentials, ...) plus ``--storage-option key=value`` (dotted keys nest, values parsed as JSON when
they parse). Errors follow the contract of :mod:`streamio.cli.exits`: ``verify`` exits 1 naming
each bad object it found, 3 when it could not check (no checkpoint at ROOT, no such step, storage
unreachable or refusing access); ``rm`` exits 2 when it refuses (the pointer's step without
``--force``, or no complete checkpoint to move the pointer to), 3 when there is no such step or
a job moved the pointer meanwhile.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .common import MAX_OBJECT_BYTES, Size, bounded, storage_option
from .exits import ExitCode, exit_codes_help, exit_codes_short
from .progress import Progress, human_bytes, plural
from .schemas import json_help, json_option

if TYPE_CHECKING:  # the library is imported inside each verb: `streamio --help` does not load it
    from streamio.storage import Store

F = TypeVar("F", bound=Callable[..., Any])


def _root_args(fn: F) -> F:
    fn = storage_option(fn)
    fn = click.argument("root")(fn)

    @functools.wraps(fn)
    def wrapper(root: str, storage_options: dict[str, Any], **kwargs: Any) -> Any:
        from streamio.storage import Store

        return fn(store=Store(root, storage_options), **kwargs)

    return wrapper  # type: ignore[return-value]


_size = human_bytes


def _epilog(verb: str, exits: str) -> str:
    return f"{json_help(verb)}\n\n{exits}"


@click.group("ckpt")
def ckpt() -> None:
    """Inspect, verify and clean checkpoint roots written by streamio.CheckpointManager; plan one on paper."""


@ckpt.command("ls", epilog=_epilog("ckpt ls", exit_codes_short()))
@_root_args
@click.option("--local", "local_dir", metavar="DIR", default=None,
              help="Also list the local tier at DIR (the LocalTier directory: its rank-NNNNN copies); "
                   "a TIER column says which saves are local, durable or both.")
@json_option
def ls_cmd(store: Store, local_dir: str | None, as_json: bool) -> None:
    """List the committed checkpoints under ROOT (* = the one latest.json names).

    Flags: BAD (a restore rejected it: retention and gc remove it), abandoned (a step past the
    one a restore went back to: the next save retires it), ahead (past the pointer: a save in
    flight, or one whose job died before its pointer swap). With --local, a "+" after the tier
    marks the save a rank's local latest.json names (what a restart on this node finds first).
    """
    from streamio.checkpoint import LocalTier
    from streamio.checkpoint.admin import list_saves, list_tiers

    rows = list_saves(store) if local_dir is None else list_tiers(store, LocalTier(local_dir))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no checkpoints under {store.root_url}")
        return
    tier = local_dir is not None
    columns = f"{'SIZE':>10}  {'FILES':>8}  {'WORLD':>5}  {'CREATED':<25}  METRICS"
    click.echo(f"  {'STEP':>10}  " + (f"{'TIER':<8}  " if tier else "") + columns)
    for r in rows:
        click.echo(_ls_line(r, tier))


def _ls_line(r: dict[str, Any], tier: bool) -> str:
    mark = "*" if r["latest"] else " "
    flags = [f"BAD: {r['bad']}"] if r["bad"] else []
    flags += [r["place"]] if r["place"] in ("abandoned", "ahead") else []
    flag = f"  [{'; '.join(flags)}]" if flags else ""
    where = f"{r['tier'] + ('+' if r['local_latest'] else ''):<8}  " if tier else ""
    if "error" in r:
        return f"{mark} {r['step']:>10}  {where}UNREADABLE: {r['error']}{flag}"
    metrics = " ".join(f"{k}={v}" for k, v in r["metrics"].items())
    return (f"{mark} {r['step']:>10}  {where}{_size(r['bytes']):>10}  {plural(r['files'], 'file'):>8}  "
            f"{r['world_size']:>5}  {r['created']:<25}  {metrics or '-'}{flag}")


@ckpt.command("inspect", epilog=_epilog("ckpt inspect", exit_codes_short()))
@_root_args
@click.argument("step", type=click.IntRange(min=0), required=False)
@json_option
def inspect_cmd(store: Store, step: int | None, as_json: bool) -> None:
    """Show a checkpoint (default: latest): its non-tensor state (epoch, data position, scheduler,
    counters, each rank's own), metrics, timeline, retention, software, and every tensor's
    global shape and dtype (sharded ones with the placements and mesh they were saved with)."""
    from streamio.checkpoint.admin import inspect_save

    d = inspect_save(store, step)
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    tl = d["timeline"]
    click.echo(f"step {d['step']} at {store.url(d['path'])}{'  [BAD: ' + d['bad'] + ']' if d['bad'] else ''}")
    click.echo(f"  created {d['created']}, world size {d['world_size']}, {plural(d['files'], 'file')}, "
               f"{_size(d['bytes'])}")
    click.echo(f"  timeline {tl['id'] or '(none: written before timelines)'} ({tl['place']}), "
               f"follows {tl['parent'] or '-'}, history {json.dumps(tl['history'])}")
    click.echo(f"  metrics   {json.dumps(d['metrics'])}")
    click.echo(f"  retention {json.dumps(d['retention'])} (the root's recorded policy)")
    click.echo(f"  software  {json.dumps(d['software'])}")
    click.echo("  state:")
    for name, value in d["state"].items():
        click.echo(f"    {name}: {json.dumps(value)}")
    for name, value in (d["per_rank"][0] if d["per_rank"] else {}).items():
        others = f"; ranks 1-{d['world_size'] - 1}: --json" if d["world_size"] > 1 else ""
        click.echo(f"    {name} (rank 0{others}): {json.dumps(value)}")
    click.echo(f"  {plural(len(d['tensors']), 'tensor')}:")
    for t in d["tensors"]:
        where = t.get("sharding") or f"rank {t['rank']}"  # a sharded tensor: how it was sharded when saved
        click.echo(f"    {t['section']:<10} {t['key']:<60} {t['dtype']:<9} {t['shape']!s:<18} "
                   f"{_size(t['nbytes']):>10}  ({where})")


@ckpt.command("verify", epilog=_epilog("ckpt verify", exit_codes_help()))
@_root_args
@click.argument("step", type=click.IntRange(min=0), required=False)
@click.option("--all", "all_steps", is_flag=True, help="Verify every committed checkpoint.")
@json_option
def verify_cmd(store: Store, step: int | None, all_steps: bool, as_json: bool) -> None:
    """Check sizes and CRC32C of every object of a checkpoint (default: latest.json and its step).

    Exits 1 naming each bad object, 3 when there is nothing to check (no checkpoint under ROOT,
    no such STEP) or storage could not be read.
    """
    from streamio.checkpoint.admin import verify_checkpoint, verify_targets

    todo, problems = verify_targets(store, step, all_steps=all_steps)
    steps = []
    for t in todo:
        with Progress(f"ckpt verify step {t.step}", unit="file") as progress:
            found = verify_checkpoint(store, t.step, path=t.path, progress=progress.report)
        steps.append({"step": t.step, "path": t.directory, "ok": not found, "problems": found})
        if not as_json:
            where = f" ({t.path})" if t.suffixed else ""
            click.echo(f"step {t.step}{where}: {'OK' if not found else plural(len(found), 'problem')}")
        problems += found
    if as_json:
        click.echo(json.dumps({"root": store.root_url, "ok": not problems, "steps": steps, "problems": problems}))
    else:
        for p in problems:
            click.echo(f"BAD {p}", err=True)
    if problems:
        raise click.exceptions.Exit(ExitCode.BAD)


@ckpt.command("gc", epilog=_epilog("ckpt gc", exit_codes_short()))
@_root_args
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--min-age", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              help="Delete unfinished or abandoned saves and abort multipart uploads only when older than this "
                   "many seconds (longer than a save takes).")
@json_option
def gc_cmd(store: Store, dry_run: bool, min_age: float, as_json: bool) -> None:
    """Delete what no current checkpoint needs: saves a restore rejected, saves of abandoned
    timelines, unfinished saves, losing saves' parts, stale multipart uploads.

    Whatever a live job may still be writing (a save not yet committed, a save of a timeline a
    restore just started) is kept until --min-age old.
    """
    from streamio.checkpoint.admin import collect_garbage

    with Progress("ckpt gc", unit="object") as progress:
        report = collect_garbage(store, dry_run=dry_run, min_age_s=min_age, progress=progress.report)
    if as_json:
        click.echo(json.dumps({
            "root": store.root_url, "dry_run": dry_run, "deleted": [store.url(p) for p in report.objects],
            "bytes": report.bytes, "multipart_uploads": list(report.multipart_uploads), "kept": list(report.kept),
        }))
        return
    verb = "would delete" if dry_run else "deleted"
    for path in report.objects:
        click.echo(f"{verb} {store.url(path)}")
    for note in report.kept:
        click.echo(f"kept {note}")
    for upload in report.multipart_uploads:
        click.echo(f"{'would abort' if dry_run else 'aborted'} multipart upload {upload}")
    click.echo(f"{verb} {plural(len(report.objects), 'object')} ({_size(report.bytes)}), "
               f"{plural(len(report.multipart_uploads), 'multipart upload')}")


@ckpt.command("rm", epilog=_epilog("ckpt rm", exit_codes_short()))
@_root_args
@click.argument("step", type=click.IntRange(min=0))
@click.option("--force", is_flag=True, help="Also the step latest.json names: move the pointer back first.")
@click.option("--dry-run", is_flag=True, help="Only say what would be done.")
@json_option
def rm_cmd(store: Store, step: int, force: bool, dry_run: bool, as_json: bool) -> None:
    """Remove every save of STEP under ROOT (manifests first, then their objects).

    Refuses the step latest.json names unless --force; then the pointer is first moved back to
    the newest complete checkpoint of the current timeline (refused if there is none), so it
    never names a removed checkpoint. Do not force it on a root a job is writing: that job's
    next save stops with a conflict.
    """
    from streamio.checkpoint.admin import plan_removal, pointer_url, remove

    removal = plan_removal(store, step, force=force)
    if removal.refusal:
        raise click.UsageError(removal.refusal)
    if not dry_run:
        remove(store, removal)
    pointer = removal.pointer
    if as_json:
        click.echo(json.dumps({
            "root": store.root_url, "step": step, "dry_run": dry_run,
            "pointer": None if pointer is None else {"step": pointer.step, "url": store.url(pointer.path)},
            "saves": len(removal.dirs), "deleted": [store.url(p) for p in removal.objects],
        }))
        return
    if pointer is not None:
        moved = "would move" if dry_run else "moved"
        click.echo(f"{moved} {pointer_url(store)} to step {pointer.step} ({store.url(pointer.path)})")
    for path in removal.objects:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {store.url(path)}")
    click.echo(f"{'would remove' if dry_run else 'removed'} step {step}: {plural(len(removal.dirs), 'save')}, "
               f"{plural(len(removal.objects), 'object')}")


@ckpt.command("plan", epilog=_epilog("ckpt plan", exit_codes_short()))
@click.option("--state-bytes", "state_bytes", type=Size("a checkpoint", 1 << 60), required=True,
              help="The checkpoint's size (1TB, 400GiB, ...).")
@click.option("--world", type=bounded(1, 1 << 24), required=True, help="Ranks saving and restoring it.")
@click.option("--ranks-per-node", type=bounded(1, 1024), default=8, show_default=True,
              help="Ranks sharing one node's bandwidth.")
@click.option("--part-size", type=Size("a part size", MAX_OBJECT_BYTES), default="64MiB", show_default=True,
              help="SaveOptions.part_size.")
@click.option("--store", type=click.Choice(["s3", "gcs"]), default="s3", show_default=True,
              help="Whose request-rate limits to assume.")
@click.option("--node-gbps", type=click.FloatRange(min=0.1, max=1e5), default=100.0, show_default=True,
              help="Each node's network bandwidth to the store, Gbit/s.")
@click.option("--sharded", is_flag=True, help="FSDP/DTensor state: each rank restores only its share.")
@click.option("--no-fanout", is_flag=True, help="Every rank reads the replicated state itself (restore_fanout=False).")
@click.option("--key-prefixes", type=bounded(1, 256), default=16, show_default=True,
              help="SaveOptions.key_prefixes: the key prefixes a save's objects are spread over.")
@json_option
def plan_cmd(state_bytes: int, world: int, ranks_per_node: int, part_size: int, store: str, node_gbps: float,
             sharded: bool, no_fanout: bool, key_prefixes: int, as_json: bool) -> None:
    """What a save and a restore of a checkpoint cost the store, on paper (no store is contacted).

    Requests, bytes per node and a lower bound of the time (the requests at the store's per-prefix
    rate, or the bytes at the node's bandwidth, whichever is longer), from the rules the code
    follows: docs/design.md "Request rates".
    """
    from dataclasses import asdict

    from streamio.checkpoint import SaveOptions
    from streamio.checkpoint.admin import GCS, S3, plan_requests

    limits = {"s3": S3, "gcs": GCS}[store]
    options = SaveOptions(part_size=part_size, restore_fanout=not no_fanout, key_prefixes=key_prefixes)
    got = plan_requests(state_bytes, world, options=options, sharded=sharded, limits=limits,
                        ranks_per_node=ranks_per_node, node_bytes_per_s=node_gbps * 1e9 / 8)
    if as_json:
        click.echo(json.dumps({**asdict(got), "store": limits.name}, indent=2))
        return
    click.echo(f"{_size(state_bytes)} checkpoint, {world} ranks ({ranks_per_node} per node), {limits.name}")
    click.echo(f"  parts      {plural(got.objects_per_rank, 'part')} of {_size(got.part_bytes)} per rank")
    click.echo(f"  save       {got.save_requests:,} write requests, {_size(got.save_bytes_per_node)} per node: "
               f">= {got.save_s:.1f} s ({got.save_bound})")
    click.echo(f"  restore    {got.restore_requests:,} read requests, {_size(got.restore_store_bytes)} from the store, "
               f"{_size(got.restore_bytes_per_node)} per node: >= {got.restore_s:.1f} s ({got.restore_bound})")
    if got.key_prefixes > 1:
        click.echo(f"  spread     over {got.key_prefixes} key prefixes, once the store serves each at that rate: "
                   f"save >= {got.save_s_spread:.1f} s, restore >= {got.restore_s_spread:.1f} s")


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    group.add_command(ckpt)
