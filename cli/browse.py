"""`streamio` verbs that read a dataset: ``ls``, ``inspect``, ``verify``.

Every URL is resolved by :func:`streamio.data.locate.open_dataset`, as ``StreamingDataset``
resolves it: a prefix holding ``index.json``, an index URL (``....json``, e.g. one written with
``streamio index SHARDS --index-url URL``), or a WebDataset shard pattern that was indexed
(``s3://b/ds/shard-{000000..000999}.tar``). The library is imported inside each verb. Errors
follow :mod:`streamio.cli.exits`: ``verify`` exits 1 only when it read a shard and found it bad,
3 when it could not check (no index, storage unreachable, access denied).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .common import MAX_CONCURRENCY, bounded, storage_option
from .exits import ExitCode, exit_codes_help, exit_codes_short
from .progress import Progress, plural
from .schemas import echo_json, json_help, json_option, summary

if TYPE_CHECKING:
    from streamio.data.format.index import DatasetIndex
    from streamio.storage import Store

_URL_HELP = (
    "URL: a dataset prefix holding index.json, an index URL (ending in .json), or a shard pattern that was "
    "indexed (s3://b/ds/shard-{000000..000999}.tar)."
)


def _open(url: str, options: dict[str, Any]) -> tuple[Store, DatasetIndex, str]:
    """``(shards' store, index, the index's URL without userinfo)`` of any dataset URL."""
    from streamio.data.locate import index_location, open_dataset
    from streamio.storage.secrets import strip_userinfo

    store, index = open_dataset(url, options)
    directory, name, _ = index_location(url)
    return store, index, strip_userinfo(f"{directory.rstrip('/')}/{name}")


def _epilog(verb: str, exits: str) -> str:
    return f"{_URL_HELP}\n\n{json_help(verb)}\n\n{exits}"


@click.command("ls", epilog=_epilog("ls", exit_codes_short()))
@click.argument("url")
@json_option
@storage_option
def ls_cmd(url: str, as_json: bool, storage_options: dict[str, Any]) -> None:
    """List the shards of the dataset at URL (path, samples, bytes, checksum)."""
    _, index, _ = _open(url, storage_options)
    rows = [
        {"path": s.path, "samples": s.samples, "bytes": s.bytes, "checksum": s.checksum, "compression": s.compression}
        for s in index.shards
    ]
    if as_json:
        echo_json(rows)
        return
    width = max([len("PATH"), *(len(s.path) for s in index.shards)])
    click.echo(f"{'PATH':<{width}}  {'SAMPLES':>9}  {'BYTES':>14}  CHECKSUM")
    for s in index.shards:
        click.echo(f"{s.path:<{width}}  {s.samples:>9,}  {s.bytes:>14,}  {s.checksum}")


@click.command("inspect", epilog=_epilog("inspect", exit_codes_short()))
@click.argument("url")
@json_option
@storage_option
def inspect_cmd(url: str, as_json: bool, storage_options: dict[str, Any]) -> None:
    """Summarise the dataset at URL: shards, samples, bytes, keys, compression, fingerprint."""
    store, index, index_url = _open(url, storage_options)
    doc = summary(store, index, index_url)
    if as_json:
        echo_json(doc)
        return
    for key, value in doc.items():
        click.echo(f"{key:<12} {', '.join(value) if isinstance(value, list) else value}")


@click.command("verify", epilog=_epilog("verify", exit_codes_help()))
@click.argument("url")
@click.option("--quick", is_flag=True, help="Only check that every shard exists with its recorded size.")
@click.option(
    "--concurrency", type=bounded(1, MAX_CONCURRENCY), default=8, show_default=True, help="Shards read at once."
)
@json_option
@storage_option
def verify_cmd(url: str, quick: bool, concurrency: int, as_json: bool, storage_options: dict[str, Any]) -> None:
    """Re-read every shard of URL and check sizes, checksums and sample counts.

    Exits 1 when it read the dataset and found a bad shard (each is named), 3 when it could not
    check (no index at URL, storage unreachable, access denied).
    """
    from streamio.data.write.verify import validate

    store, index, index_url = _open(url, storage_options)
    with Progress("verify", unit="shard") as progress:
        report = validate(store, index, deep=not quick, concurrency=concurrency, progress=progress.report)
    if as_json:
        echo_json({"url": store.root_url, "index_url": index_url, "checked": report.checked, "deep": report.deep,
                   "ok": report.ok, "bad": [{"path": b.path, "reason": b.reason} for b in report.bad]})
    elif report.ok:
        checked = "sizes, checksums, sample counts" if report.deep else "sizes"
        every = "all " if report.checked != 1 else ""
        click.echo(f"{store.root_url}: {every}{plural(report.checked, 'shard')} OK ({checked})")
    else:
        verb = "is" if len(report.bad) == 1 else "are"
        click.echo(f"{store.root_url}: {len(report.bad)} of {plural(report.checked, 'shard')} {verb} bad:", err=True)
        for b in report.bad:
            click.echo(f"  {b.path}: {b.reason}", err=True)
    if not report.ok:
        raise click.exceptions.Exit(ExitCode.BAD)


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    for command in (ls_cmd, inspect_cmd, verify_cmd):
        group.add_command(command)
