"""`streamio` verbs of the dataset group: ``shard``, ``index``, ``ls``, ``inspect``, ``verify``.

Thin by design: argument parsing, progress bars (tqdm, samples/s and MB/s on stderr) and output
formatting; everything else is in :mod:`streamio.data` (``writer``, ``sources``, ``indexer``,
``verify``, ``index``). Storage options come from the environment the way s3fs/gcsfs read it
(``AWS_ENDPOINT_URL_S3``, credentials, ...) plus ``--storage-option key=value`` (values parsed as
JSON when they parse).
Errors follow the contract of :mod:`streamio.cli.exits` (one line; 1 bad data, 2 usage, 3 could
not check): ``verify`` exits 1 only when it read a shard and found it bad, 3 when it could not
read. Option values are validated by click types, so a bad one is a usage error (2) before any
I/O. ``--json`` prints machine-readable output on the read-only verbs.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import click
from tqdm import tqdm

from streamio.data.format import INDEX_NAME, ShardInfo, unsafe_reason
from streamio.data.index import DatasetIndex, load_index, write_index
from streamio.data.indexer import build_index
from streamio.data.patterns import split_pattern
from streamio.data.sources import samples_from_directory, samples_from_jsonl, samples_from_shards
from streamio.data.verify import validate
from streamio.data.writer import DatasetWriter, ShardSpec
from streamio.storage import Store

from .common import storage_option
from .exits import ExitCode, exit_codes_help, exit_codes_short

_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 1 << 30, ``"4096"`` -> 4096; at least one byte."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise click.BadParameter(f"{text!r} is not a size such as 256MB, 1GiB or 4096")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size < 1:
        raise click.BadParameter(f"{text!r} is {size} bytes; a shard size limit must be at least 1 byte (e.g. 256MB)")
    return size


class _Size(click.ParamType):
    """A byte size with a unit (``256MB``, ``1GiB``, ``4096``), parsed while the options are."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def _plain_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    reason = unsafe_reason(value) or ("it contains '/'" if "/" in value else None)
    if reason:
        raise click.BadParameter(f"{value!r} cannot start a shard file name: {reason}")
    return value


_storage_option = storage_option
_json = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


class _Progress:
    """A tqdm bar counting samples, with MB/s in its postfix (refreshed at most twice a second)."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "sample") -> None:
        self.bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=None)
        self.start = time.monotonic()
        self.bytes = 0
        self._shown = 0.0

    def update(self, n: int, nbytes: int) -> None:
        self.bytes += nbytes
        self.bar.update(n)
        now = time.monotonic()
        if now - self._shown > 0.5:
            self._shown = now
            self.bar.set_postfix_str(f"{self.bytes / max(now - self.start, 1e-9) / 1e6:.1f} MB/s", refresh=False)

    def close(self) -> None:
        self.bar.close()


def _sources(
    src: str, options: dict[str, Any], seed: int | None, file_fields: tuple[str, ...]
) -> Iterator[dict[str, Any]]:
    if os.path.isdir(src):
        return samples_from_directory(src, shuffle_seed=seed)
    if src.endswith((".jsonl", ".ndjson")):
        if not os.path.isfile(src):
            raise click.BadParameter(f"{src!r} is not a file", param_hint="SRC")
        return samples_from_jsonl(src, file_fields=file_fields or None, shuffle_seed=seed)
    root, pattern = split_pattern(src)
    if pattern is not None:
        if seed is not None:
            raise click.UsageError("--shuffle needs a directory or JSONL source (tar shards are read in order)")
        return samples_from_shards(Store(root, options), pattern)
    raise click.UsageError(f"SRC {src!r} is not a directory, a .jsonl file or a .tar glob")


@click.command("shard", epilog=exit_codes_short())
@click.argument("src")
@click.argument("dest")
@click.option("--max-size", type=_Size(), default="256MB", show_default=True, help="Shard size limit (1GiB, ...).")
@click.option("--max-count", type=click.IntRange(min=1), default=None, help="Samples per shard limit.")
@click.option("--compress", type=click.Choice(["zstd"]), default=None, help="One zstd frame per sample (.tar.zst).")
@click.option("--shuffle", is_flag=True, help="Shuffle the sample order (directory / JSONL sources).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of --shuffle.")
@click.option("--prefix", default="data", show_default=True, callback=_plain_prefix, help="Names: PREFIX-000000.tar.")
@click.option(
    "--file-field", "file_fields", multiple=True, metavar="EXT",
    help="JSONL field naming a file to read (repeatable; default: any string naming an existing file).",
)
@click.option("--overwrite", is_flag=True, help="Replace a dataset already at DEST.")
@_storage_option
def shard_cmd(
    src: str, dest: str, max_size: int, max_count: int | None, compress: str | None, shuffle: bool, seed: int,
    prefix: str, file_fields: tuple[str, ...], overwrite: bool, storage_options: dict[str, Any],
) -> None:
    """Pack SRC (directory tree, JSONL file or .tar glob) into shards + index.json at DEST."""
    samples = _sources(src, storage_options, seed if shuffle else None, file_fields)
    target = Store(dest, storage_options)
    if not overwrite and target.exists(INDEX_NAME):
        raise click.UsageError(
            f"{target.url(INDEX_NAME)} exists: DEST already holds a dataset; pass --overwrite to replace it"
        )
    progress = _Progress("shard")
    spec = ShardSpec(max_bytes=max_size, max_count=max_count, compression=compress, prefix=prefix)
    with DatasetWriter(target, spec=spec, overwrite=overwrite) as writer:
        for sample in samples:
            before = writer.bytes_written
            writer.write(sample)
            progress.update(1, writer.bytes_written - before)
    progress.close()
    index = writer.close()
    click.echo(f"{dest}: {len(index.shards)} shards, {index.samples} samples, {_total(index) / 1e6:.1f} MB")


@click.command("index", epilog=exit_codes_short())
@click.argument("url")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Shards scanned at once.")
@_json
@_storage_option
def index_cmd(url: str, concurrency: int, as_json: bool, storage_options: dict[str, Any]) -> None:
    """Index existing WebDataset shards: URL is a prefix or a pattern (shard-{000000..000099}.tar)."""
    root, pattern = split_pattern(url)
    store = Store(root, storage_options)
    progress = _Progress("index", unit="shard")
    index = build_index(store, pattern, concurrency=concurrency, progress=lambda s: progress.update(1, s.bytes))
    progress.close()
    write_index(store, index)
    if as_json:
        click.echo(json.dumps(_summary(store, index)))
    else:
        click.echo(
            f"{store.url(INDEX_NAME)}: {len(index.shards)} shards, {index.samples} samples, "
            f"keys {', '.join(index.keys)}"
        )


@click.command("ls", epilog=exit_codes_short())
@click.argument("url")
@_json
@_storage_option
def ls_cmd(url: str, as_json: bool, storage_options: dict[str, Any]) -> None:
    """List the shards of the dataset at URL (path, samples, bytes)."""
    index = load_index(Store(url, storage_options))
    if as_json:
        click.echo(json.dumps([_shard_json(s) for s in index.shards]))
        return
    width = max(len(s.path) for s in index.shards) if index.shards else 4
    for s in index.shards:
        click.echo(f"{s.path:<{width}}  {s.samples:>9} samples  {s.bytes:>14,} bytes  {s.checksum}")


@click.command("inspect", epilog=exit_codes_short())
@click.argument("url")
@_json
@_storage_option
def inspect_cmd(url: str, as_json: bool, storage_options: dict[str, Any]) -> None:
    """Summarise the dataset at URL: shards, samples, bytes, keys, compression, fingerprint."""
    store = Store(url, storage_options)
    summary = _summary(store, load_index(store))
    if as_json:
        click.echo(json.dumps(summary))
        return
    for key, value in summary.items():
        click.echo(f"{key:<12} {', '.join(value) if isinstance(value, list) else value}")


@click.command("verify", epilog=exit_codes_help())
@click.argument("url")
@click.option("--quick", is_flag=True, help="Only check that every shard exists with its recorded size.")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Shards read at once.")
@_json
@_storage_option
def verify_cmd(url: str, quick: bool, concurrency: int, as_json: bool, storage_options: dict[str, Any]) -> None:
    """Re-read every shard of URL and check sizes, checksums and sample counts.

    Exits 1 when it read the dataset and found a bad shard (each is named), 3 when it could not
    check (no index.json at URL, storage unreachable, access denied).
    """
    store = Store(url, storage_options)
    report = validate(store, load_index(store), deep=not quick, concurrency=concurrency)
    if as_json:
        click.echo(json.dumps({"url": url, "checked": report.checked, "deep": report.deep, "ok": report.ok,
                               "bad": [{"path": b.path, "reason": b.reason} for b in report.bad]}))
    elif report.ok:
        checked = "sizes, checksums, sample counts" if report.deep else "sizes"
        click.echo(f"{url}: all {report.checked} shards OK ({checked})")
    else:
        click.echo(f"{url}: {len(report.bad)} of {report.checked} shards are bad:", err=True)
        for b in report.bad:
            click.echo(f"  {b.path}: {b.reason}", err=True)
    if not report.ok:
        raise click.exceptions.Exit(ExitCode.BAD)


def _total(index: DatasetIndex) -> int:
    return sum(s.bytes for s in index.shards)


def _shard_json(s: ShardInfo) -> dict[str, Any]:
    return {
        "path": s.path, "samples": s.samples, "bytes": s.bytes, "checksum": s.checksum, "compression": s.compression,
    }


def _summary(store: Store, index: DatasetIndex) -> dict[str, Any]:
    return {
        "url": store.root_url,
        "shards": len(index.shards),
        "samples": index.samples,
        "bytes": _total(index),
        "keys": list(index.keys),
        "compression": index.compression,
        "fingerprint": index.fingerprint,
    }


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    for command in (shard_cmd, index_cmd, ls_cmd, inspect_cmd, verify_cmd):
        group.add_command(command)
