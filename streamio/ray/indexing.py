"""``streamio.ray.index``: ``streamio index`` with the shards scanned by Ray tasks (see :mod:`streamio.ray`).

The driver expands the patterns and checks the paths exactly as ``streamio index`` does
(:func:`~streamio.data.write.indexer.shard_paths`); the shards are dealt to Ray tasks in
contiguous runs, each task scans its run (:func:`~streamio.data.write.indexer.scan_shards`) and
returns the results (sizes, checksums, offsets: a few bytes per sample); the driver merges them in
path order and writes one ``index.json``, create-only unless ``overwrite=True``. Same scans, same
order, same index and fingerprint as ``streamio index``, whatever the number of tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from streamio.data.format.index import INLINE_LIMIT, DatasetIndex, write_index
from streamio.data.format.layout import INDEX_NAME, MAX_SAMPLE_BYTES
from streamio.data.format.patterns import split_pattern
from streamio.data.locate import absolute_url, same_location, split_index_url
from streamio.data.write.indexer import ShardScan, index_of_scans, scan_shards, shard_paths
from streamio.errors import DatasetError, WriteConflictError
from streamio.ray.requirement import require
from streamio.storage import Store

__all__ = ["index"]

Scan = ShardScan


def _scan_run(
    root: str, storage_options: Mapping[str, Any] | None, paths: Sequence[str], concurrency: int, max_sample_bytes: int
) -> list[Scan]:
    """One Ray task: scan a run of shards (a fresh Store here: stores are not shipped between processes)."""
    store = Store(root, storage_options)
    return scan_shards(store, paths, concurrency=concurrency, max_sample_bytes=max_sample_bytes)


def runs(paths: Sequence[str], tasks: int) -> list[list[str]]:
    """``paths`` cut into at most ``tasks`` contiguous runs of near-equal length, in order."""
    tasks = max(1, min(tasks, len(paths)))
    size, extra = divmod(len(paths), tasks)
    out, start = [], 0
    for i in range(tasks):
        end = start + size + (1 if i < extra else 0)
        out.append(list(paths[start:end]))
        start = end
    return out


def index(
    url_or_pattern: str, storage_options: Mapping[str, Any] | None = None, index_url: str | None = None, *,
    overwrite: bool = False, tasks: int | None = None, concurrency: int = 4,
    max_sample_bytes: int = MAX_SAMPLE_BYTES, inline_limit: int = INLINE_LIMIT,
) -> DatasetIndex:
    """Index existing WebDataset shards on Ray and write one ``index.json``; returns the index.

    Args:
        url_or_pattern: a prefix, or a pattern below one (``s3://b/ds/shard-{000000..000999}.tar``).
        storage_options: fsspec options for the shards and the index; shipped to the tasks as
            arguments (Ray may spill those to local disk under memory pressure: give secrets
            through the workers' environment rather than here), never written by streamio.
        index_url: write the index here (a prefix, or a URL ending in ``.json``) instead of beside
            the shards; it then records where the shards are (as ``streamio index --index-url``).
        overwrite: replace an index already at the target.
        tasks: Ray tasks (default: 4 per CPU of the cluster, at most one per shard).
        concurrency: shards each task scans at once.
        max_sample_bytes: the largest sample accepted (decompressed).
        inline_limit: datasets up to this many samples keep their offsets inside ``index.json``.

    Raises:
        MissingDependencyError: Ray is not installed.
        DatasetError: an index exists at the target and ``overwrite`` is False; and what
            :func:`streamio.build_index` raises for the shards.
    """
    ray = require("ray")
    root, pattern = split_pattern(url_or_pattern)
    store = Store(root, storage_options)
    directory, name = split_index_url(index_url) if index_url is not None else (root, INDEX_NAME)
    shards_url = None if same_location(directory, root) else absolute_url(root)
    target = Store(directory, storage_options) if index_url is not None else store
    if not overwrite and target.exists(name):
        raise DatasetError(_exists(target.url(name)))
    paths = shard_paths(store, pattern)
    if tasks is None:
        tasks = 4 * max(1, int(ray.cluster_resources().get("CPU", 1)))
    scan = ray.remote(_scan_run)
    refs = [scan.remote(root, storage_options, run, concurrency, max_sample_bytes) for run in runs(paths, tasks)]
    built = index_of_scans([s for run in ray.get(refs) for s in run])
    built = replace(built, shards_url=shards_url) if shards_url is not None else built
    try:
        write_index(target, built, path=name, mode="overwrite" if overwrite else "create", inline_limit=inline_limit)
    except WriteConflictError as exc:
        raise DatasetError(_exists(target.url(name))) from exc
    return built


def _exists(url: str) -> str:
    return (
        f"{url} exists: replacing it changes the dataset every reader of that URL sees. Write this index elsewhere "
        f"with index_url=..., or pass overwrite=True to replace it"
    )
