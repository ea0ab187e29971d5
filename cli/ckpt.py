"""`streamio ckpt` verbs: ``ls``, ``inspect``, ``verify``, ``gc`` over a checkpoint root.

Thin by design: argument parsing and output; the logic lives in :mod:`streamio.checkpoint`.
Storage options come from the environment the way s3fs/gcsfs read it (``AWS_ENDPOINT_URL_S3``,
credentials, ...) plus ``--storage-option key=value`` (dotted keys nest, values parsed as JSON when
they parse). Errors follow the contract of :mod:`streamio.cli.exits`: ``verify`` exits 1 naming
each bad object it found, 3 when it could not check (no checkpoint at ROOT, no such step, storage
unreachable or refusing access).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from streamio.checkpoint import manifest as mf
from streamio.checkpoint.admin import (
    check_pointer,
    collect_garbage,
    committed_steps,
    read_manifest,
    verify_checkpoint,
)
from streamio.errors import CheckpointNotFoundError, StreamioError
from streamio.storage import Store

from .common import storage_option
from .exits import ExitCode, exit_codes_help, exit_codes_short

F = TypeVar("F", bound=Callable[..., Any])


def _root_args(fn: F) -> F:
    fn = storage_option(fn)
    fn = click.argument("root")(fn)

    @functools.wraps(fn)
    def wrapper(root: str, storage_options: dict[str, Any], **kwargs: Any) -> Any:
        return fn(store=Store(root, storage_options), **kwargs)

    return wrapper  # type: ignore[return-value]


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _default_step(store: Store, step: int | None) -> int:
    if step is not None:
        return step
    pointed, problems = check_pointer(store)
    if pointed is not None:
        return pointed
    steps = committed_steps(store)
    if not steps:
        raise CheckpointNotFoundError(f"no checkpoint under {store.root_url} ({'; '.join(problems)})")
    return steps[-1]


@click.group("ckpt")
def ckpt() -> None:
    """Inspect, verify and clean checkpoint roots written by streamio.CheckpointManager."""


@ckpt.command("ls", epilog=exit_codes_short())
@_root_args
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ls_cmd(store: Store, as_json: bool) -> None:
    """List the committed checkpoints under ROOT (* = the one latest.json names)."""
    pointed, _ = check_pointer(store)
    rows = []
    for step in committed_steps(store):
        try:
            m = read_manifest(store, step)
            rows.append({"step": step, "latest": step == pointed, "bytes": m.total_bytes, "files": len(m.files),
                         "world_size": m.world_size, "created": m.created, "metrics": dict(m.metrics)})
        except StreamioError as exc:
            rows.append({"step": step, "latest": step == pointed, "error": str(exc)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no checkpoints under {store.root_url}")
    for r in rows:
        mark = "*" if r["latest"] else " "
        if "error" in r:
            click.echo(f"{mark} {r['step']:>10}  UNREADABLE: {r['error']}")
            continue
        metrics = " ".join(f"{k}={v}" for k, v in r["metrics"].items())
        click.echo(f"{mark} {r['step']:>10}  {_size(r['bytes']):>10}  {r['files']:>4} files  world {r['world_size']}  {r['created']}  {metrics}")


@ckpt.command("inspect", epilog=exit_codes_short())
@_root_args
@click.argument("step", type=click.IntRange(min=0), required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect_cmd(store: Store, step: int | None, as_json: bool) -> None:
    """Show a checkpoint's tensors, sizes, metrics, world size and software (default: latest)."""
    m = read_manifest(store, _default_step(store, step))
    tensors = [("replicated", k, e) for k, e in m.replicated.tensors.items()]
    for r, section in enumerate(m.per_rank):
        tensors += [(f"rank {r}", k, e) for k, e in section.tensors.items()]
    if as_json:
        click.echo(json.dumps({
            "step": m.step, "world_size": m.world_size, "created": m.created, "metrics": dict(m.metrics),
            "software": dict(m.software), "bytes": m.total_bytes, "files": len(m.files),
            "tensors": [{"section": s, "key": k, "dtype": e.dtype, "shape": list(e.shape), "nbytes": e.nbytes,
                         "rank": e.rank} for s, k, e in tensors],
        }, indent=2))
        return
    click.echo(f"step {m.step} at {store.url(mf.step_dir(m.step))}")
    click.echo(f"  created {m.created}, world size {m.world_size}, {len(m.files)} files, {_size(m.total_bytes)}")
    click.echo(f"  metrics  {json.dumps(dict(m.metrics))}")
    click.echo(f"  software {json.dumps(dict(m.software))}")
    click.echo(f"  {len(tensors)} tensors:")
    for section, key, e in tensors:
        click.echo(f"    {section:<10} {key:<60} {e.dtype:<9} {list(e.shape)!s:<18} {_size(e.nbytes):>10}  (rank {e.rank})")


@ckpt.command("verify", epilog=exit_codes_help())
@_root_args
@click.argument("step", type=click.IntRange(min=0), required=False)
@click.option("--all", "all_steps", is_flag=True, help="Verify every committed checkpoint.")
def verify_cmd(store: Store, step: int | None, all_steps: bool) -> None:
    """Check sizes and CRC32C of every object of a checkpoint (default: latest.json and its step).

    Exits 1 naming each bad object, 3 when there is nothing to check (no checkpoint under ROOT,
    no such STEP) or storage could not be read.
    """
    problems: list[str] = []
    if step is not None and not all_steps:
        _require_step(store, step)
        steps = [step]
    else:
        pointed, problems = check_pointer(store)
        committed = committed_steps(store) if all_steps or pointed is None else []
        if pointed is None and not committed and not store.exists(mf.LATEST):
            raise CheckpointNotFoundError(f"no checkpoint under {store.root_url}: {'; '.join(problems)}")
        steps = committed if all_steps else [pointed] if pointed is not None and not problems else []
    for s in steps:
        found = verify_checkpoint(store, s)
        click.echo(f"step {s}: {'OK' if not found else f'{len(found)} problem(s)'}")
        problems += found
    for p in problems:
        click.echo(f"BAD {p}", err=True)
    if problems:
        raise click.exceptions.Exit(ExitCode.BAD)


def _require_step(store: Store, step: int) -> None:
    """Raise CheckpointNotFoundError when ``step`` has no manifest: then there is nothing to check."""
    path = mf.manifest_path(step)
    if not store.exists(path):
        raise CheckpointNotFoundError(
            f"{store.url(path)} does not exist: step {step} was never committed under {store.root_url} or was "
            f"deleted; `streamio ckpt ls {store.root_url}` lists the committed steps"
        )


@ckpt.command("gc", epilog=exit_codes_short())
@_root_args
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--min-age", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              help="Abort multipart uploads only when older than this many seconds.")
def gc_cmd(store: Store, dry_run: bool, min_age: float) -> None:
    """Delete orphans: abandoned step prefixes, losing saves' parts, stale multipart uploads."""
    report = collect_garbage(store, dry_run=dry_run, min_age_s=min_age)
    verb = "would delete" if dry_run else "deleted"
    for path in report.objects:
        click.echo(f"{verb} {store.url(path)}")
    for upload in report.multipart_uploads:
        click.echo(f"{'would abort' if dry_run else 'aborted'} multipart upload {upload}")
    click.echo(f"{verb} {len(report.objects)} objects ({_size(report.bytes)}), {len(report.multipart_uploads)} multipart uploads")


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    group.add_command(ckpt)
