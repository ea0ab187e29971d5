"""`streamio` verbs that write datasets: ``shard`` and ``index`` (``ls``, ``inspect``, ``verify``: browse.py).

Thin by design: argument parsing, progress (:mod:`streamio.cli.progress`) and output formatting;
everything else is in :mod:`streamio.data` (``write``: writer, sources, indexer; ``format.index``;
``locate``). The library is imported inside each verb, so ``streamio --help`` and every other
verb start without it. Storage options come from the environment the way s3fs/gcsfs read it
(``AWS_ENDPOINT_URL_S3``, credentials, ...) plus ``--storage-option key=value`` (values parsed
as JSON when they parse). Errors follow the contract of :mod:`streamio.cli.exits` (one line; 1 bad
data, 2 usage, 3 could not check); option values are validated by click types, so a bad one is a
usage error (2) before any I/O. ``--json`` prints the verb's one JSON document
(:mod:`streamio.cli.schemas`) on stdout. URLs are printed without their userinfo.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from .common import MAX_CONCURRENCY, MAX_COUNT, MAX_OBJECT_BYTES, MAX_SEED, MAX_WORKERS, Size, bounded, storage_option
from .exits import exit_codes_short
from .progress import Progress, human_bytes, plural
from .schemas import echo_json, json_help, json_option, summary

if TYPE_CHECKING:  # the library is imported inside each verb: `streamio --help` does not load it
    from streamio.data.write.sources import Samples

def _plain_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from streamio.data.format.layout import unsafe_reason

    reason = unsafe_reason(value) or ("it contains '/'" if "/" in value else None)
    if reason:
        raise click.BadParameter(f"{value!r} cannot start a shard file name: {reason}")
    return value


def workers_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--workers N``: processes on this machine (default: its CPU count)."""
    return click.option(
        "--workers", type=bounded(1, MAX_WORKERS), default=None, metavar="N",
        help=f"{what}. Default: the CPU count.",
    )


def _workers(given: int | None) -> int:
    return given if given is not None else max(1, os.cpu_count() or 1)


def counts(doc: dict[str, Any]) -> str:
    """``3 shards, 7 samples, 28.1 KB`` of a :func:`~.schemas.summary` (singular when one)."""
    return f"{plural(doc['shards'], 'shard')}, {plural(doc['samples'], 'sample')}, {human_bytes(doc['bytes'])}"


def _sources(
    src: str, options: dict[str, Any], seed: int | None, file_fields: tuple[str, ...], split_fields: bool,
    follow_symlinks: bool,
) -> Samples:
    from streamio.data.format.patterns import split_pattern
    from streamio.data.write.sources import samples_from_directory, samples_from_jsonl, samples_from_shards
    from streamio.storage import Store

    if os.path.isdir(src):
        return samples_from_directory(src, shuffle_seed=seed, follow_symlinks=follow_symlinks, stream_files=True)
    if src.endswith((".jsonl", ".ndjson")):
        if not os.path.isfile(src):
            raise click.BadParameter(f"{src!r} is not a file", param_hint="SRC")
        if "json" in file_fields and not split_fields:
            raise click.BadParameter(
                "'json' is the member holding each line; name the file field otherwise, or pass --split-fields",
                param_hint="'--file-field'",
            )
        return samples_from_jsonl(
            src, split_fields=split_fields, file_fields=file_fields or None, shuffle_seed=seed, stream_files=True
        )
    root, pattern = split_pattern(src)
    if pattern is not None:
        if seed is not None:
            raise click.UsageError("--shuffle needs a directory or JSONL source (tar shards are read in order)")
        return samples_from_shards(Store(root, options), pattern)
    raise click.UsageError(f"SRC {src!r} is not a directory, a .jsonl file or a .tar glob")


_SHARD_SOURCES = """\b
SRC is one of:
  DIR          files grouped into samples by name: a/0001.jpg + a/0001.cls ->
               sample a/0001 with members jpg and cls.
  FILE.jsonl   one sample per line: the line, byte for byte, is the sample's
               one member 'json' (key: the line's "__key__", else its number);
               readers get the object back with every type kept. Each
               --file-field EXT adds the bytes of the file that field names as
               member EXT. With --split-fields, each top-level field is its own
               member instead (the older mapping): strings naming
               a file are read as bytes (only the --file-field ones if given),
               other strings stored as UTF-8, other values as JSON text (the
               number 0 becomes the bytes "0").
  'GLOB.tar'   existing shards (brace / glob pattern), resharded in order;
               gzip'd ones too ('GLOB.tar.gz', '.tgz'): the way to convert them
               (a dataset is .tar or .tar.zst: gzip has no random access).

Only regular files are read: a FIFO, socket or device in SRC is refused (exit
2, every one named) and never opened; so is a symbolic link whose target lies
outside SRC (unless --follow-symlinks), a link to a directory, a dangling link,
and a sample whose files hold more than 1 GiB (checked by size before reading).
Links to regular files inside SRC are read (the target's bytes, the link's
name). Files are streamed into the shards: memory is the shards being written,
not the files.
"""


@click.command("shard", epilog=f"{_SHARD_SOURCES}\n{json_help('shard')}\n\n{exit_codes_short()}")
@click.argument("src")
@click.argument("dest")
@click.option("--max-size", type=Size("a shard size limit", MAX_OBJECT_BYTES),
              default="256MB", show_default=True, help="Shard size limit (1GiB, ...).")
@click.option("--max-count", type=bounded(1, MAX_COUNT), default=None, help="Samples per shard limit.")
@click.option("--compress", type=click.Choice(["zstd"]), default=None, help="One zstd frame per sample (.tar.zst).")
@click.option("--shuffle", is_flag=True, help="Shuffle the sample order (directory / JSONL sources).")
@click.option("--seed", type=bounded(0, MAX_SEED), default=0, show_default=True, help="Seed of --shuffle.")
@click.option("--prefix", default="data", show_default=True, callback=_plain_prefix, help="Names: PREFIX-000000.tar.")
@click.option(
    "--file-field", "file_fields", multiple=True, metavar="EXT",
    help="JSONL field naming a file whose bytes become member EXT (repeatable; with --split-fields the default "
    "is any string naming an existing file).",
)
@click.option("--split-fields", is_flag=True, help="JSONL: each top-level field its own member (see below).")
@click.option("--follow-symlinks", is_flag=True, help="Directory: also read links whose target lies outside SRC.")
@click.option(
    "--overwrite", is_flag=True,
    help="Replace a dataset already at DEST (it stays readable until the new one is complete), or the leftovers of "
    "a write there that did not finish.",
)
@workers_option("Processes that read samples and write shards (the shards are the same for every N)")
@json_option
@storage_option
def shard_cmd(  # noqa: PLR0913 - one parameter per option
    src: str, dest: str, max_size: int, max_count: int | None, compress: str | None, shuffle: bool, seed: int,
    prefix: str, file_fields: tuple[str, ...], split_fields: bool, follow_symlinks: bool, overwrite: bool,
    workers: int | None, as_json: bool, storage_options: dict[str, Any],
) -> None:
    """Pack SRC (directory tree, JSONL file or .tar glob) into shards + index.json at DEST."""
    from streamio.data.format.layout import INDEX_NAME
    from streamio.data.write.fanout import BATCH, pack_in_processes
    from streamio.data.write.publish import occupied
    from streamio.data.write.writer import DatasetWriter, ShardSpec
    from streamio.storage import Store

    samples = _sources(src, storage_options, seed if shuffle else None, file_fields, split_fields, follow_symlinks)
    target = Store(dest, storage_options)
    reason = None if overwrite else occupied(target)
    if reason is not None:
        raise click.UsageError(
            f"{reason}. Pass --overwrite to write DEST anew (a dataset there stays readable until the new one is "
            f"complete; leftovers are removed)"
        )
    spec = ShardSpec(max_bytes=max_size, max_count=max_count, compression=compress, prefix=prefix)
    workers = _workers(workers)
    with Progress("shard", unit="sample", total=samples.total) as progress, \
            DatasetWriter(target, spec=spec, overwrite=overwrite) as writer:
        if workers > 1 and (samples.total is None or samples.total > BATCH):  # (a source of one shard, too)
            pack_in_processes(writer, samples, workers=workers, storage_options=storage_options,
                              progress=progress.update)
        else:
            for sample in samples:
                before = writer.bytes_written
                writer.write(sample)
                progress.update(1, writer.bytes_written - before)
    doc = summary(target, writer.close(), target.url(INDEX_NAME))
    if as_json:
        echo_json(doc)
    else:
        click.echo(f"{doc['url']}: {counts(doc)}")
    if src.endswith((".jsonl", ".ndjson")) and compress is None:
        _framing_note(os.path.getsize(src), doc)


def _framing_note(input_bytes: int, doc: dict[str, Any]) -> None:
    """Say so on stderr when tar's framing made the shards much larger than a JSONL input."""
    ratio = doc["bytes"] / max(1, input_bytes)
    if ratio > 1.5:
        click.echo(
            f"note: the shards are {ratio:.1f}x the input ({human_bytes(input_bytes / max(1, doc['samples']))} a "
            f"line on average; tar adds a 512-byte header to each sample and pads it to 512 bytes): "
            f"--compress zstd squeezes that out",
            err=True,
        )


@click.command("index", epilog=f"{json_help('index')}\n\n{exit_codes_short()}")
@click.argument("url")
@click.option(
    "--index-url", metavar="URL", default=None,
    help="Write the index here (a prefix, or a URL ending in .json) instead of beside the shards, e.g. for shards "
    "in a bucket you can read but not write. The index records where the shards are: give this URL to "
    "StreamingDataset and the other verbs.",
)
@click.option(
    "--concurrency", type=bounded(1, MAX_CONCURRENCY), default=8, show_default=True, help="Shards scanned at once."
)
@click.option("--overwrite", is_flag=True, help="Replace an index already at the target.")
@workers_option("Processes that scan shards, --concurrency shards at once in all (the index is the same for every N)")
@json_option
@storage_option
def index_cmd(  # noqa: PLR0913 - one parameter per option
    url: str, index_url: str | None, concurrency: int, overwrite: bool, workers: int | None, as_json: bool,
    storage_options: dict[str, Any],
) -> None:
    """Index existing WebDataset shards: URL is a prefix or a pattern (shard-{000000..000099}.tar).

    The index is written beside the shards (URL's directory), or at --index-url. An index already
    there is replaced only with --overwrite: every reader of that URL would see the new one.
    """
    from streamio.data.format.index import write_index
    from streamio.data.format.layout import INDEX_NAME
    from streamio.data.format.patterns import split_pattern
    from streamio.data.locate import absolute_url, same_location, split_index_url
    from streamio.data.write.fanout import scan_in_processes
    from streamio.data.write.indexer import build_index
    from streamio.errors import ConfigError, StoragePermissionError, WriteConflictError
    from streamio.storage import Store

    root, pattern = split_pattern(url)
    store = Store(root, storage_options)
    try:
        directory, name = split_index_url(index_url) if index_url is not None else (root, INDEX_NAME)
        apart = not same_location(directory, root)
        shards_url = absolute_url(root) if apart else None
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    target = Store(directory, storage_options) if index_url is not None else store
    if not overwrite and target.exists(name):
        raise click.UsageError(_index_exists(target.url(name)))
    workers = _workers(workers)
    scan = partial(scan_in_processes, storage_options=storage_options, workers=workers) if workers > 1 else None
    with Progress("index", unit="shard") as progress:
        index = build_index(store, pattern, concurrency=concurrency, progress=progress.report, scan=scan)
    index = replace(index, shards_url=shards_url) if shards_url is not None else index
    try:
        write_index(target, index, path=name, mode="overwrite" if overwrite else "create")
    except WriteConflictError as exc:  # another indexer created it meanwhile
        raise click.UsageError(_index_exists(target.url(name))) from exc
    except StoragePermissionError as exc:
        if index_url is not None:
            raise
        raise StoragePermissionError(
            f"{exc}. For shards you cannot write beside, write the index elsewhere with --index-url URL"
        ) from exc
    doc = summary(store, index, target.url(name))
    if as_json:
        echo_json(doc)
    else:
        click.echo(f"{doc['index_url']}: {counts(doc)}, keys {', '.join(index.keys) or '-'}")
        if apart:
            click.echo(f"  shards at {doc['url']}: open the dataset with {doc['index_url']}")


def _index_exists(url: str) -> str:
    return (
        f"{url} exists: replacing it changes the dataset every reader of that URL sees (a pattern naming fewer "
        f"shards would drop the others). Write this index elsewhere with --index-url URL.json, or pass --overwrite "
        f"to replace it"
    )


def register(group: click.Group) -> None:
    """Add this module's commands to the top-level group."""
    for command in (shard_cmd, index_cmd):
        group.add_command(command)
