"""``DatasetSink``: a Ray Data ``Datasink`` that writes a streamio dataset (see :mod:`streamio.ray`).

Call order as Ray makes it: ``on_write_start`` (driver, once: :meth:`PartitionedWrite.begin`, the
marker), ``write`` (one Ray task each: that task's blocks become partition ``ctx.task_idx``),
``on_write_complete`` (driver: the one commit, ``index.json``) or ``on_write_failed`` (driver: no
index; the shards stay claimed by the marker until a write with ``overwrite=True``).

Retries: Ray Data retries a task that crashed (``max_retries``) and, only when asked
(``ray_remote_args={"retry_exceptions": True}``), one whose code raised. Map operators are fused
with the write, so a retried task re-runs the write of its blocks: the same partition id, shard
names of its own (a lost attempt's shards are removed by the commit, never overwritten by a later
one: :mod:`streamio.data.write.parts`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from streamio.data.format.index import INLINE_LIMIT, DatasetIndex
from streamio.data.write.packer import ShardSpec
from streamio.data.write.parts import PartitionedWrite, PartSummary
from streamio.errors import DatasetError
from streamio.ray.requirement import require
from streamio.ray.rows import rows_of

__all__ = ["DatasetSink"]

log = logging.getLogger(__name__)

_data = require("ray.data")
_BlockAccessor = require("ray.data.block").BlockAccessor


class DatasetSink(_data.Datasink):  # type: ignore[misc,name-defined]
    """Write a Ray Dataset as a streamio dataset at ``url``: ``ds.write_datasink(DatasetSink(url, ...))``.

    Rows carry ``__key__`` and one column per member: bytes, str, int or JSON values (as
    :func:`streamio.write_dataset` takes them), numpy arrays (stored as ``.npy``); nulls are
    skipped (:mod:`streamio.ray.rows`). After ``write_datasink`` returns, :attr:`index` is the
    dataset's index.

    Args:
        url: the dataset root (any fsspec URL the Ray workers can reach).
        spec: how shards are cut, named and compressed (default ``ShardSpec()``).
        storage_options: fsspec options for ``url``; shipped to the tasks with the sink, never
            written by streamio. Ray may spill task arguments to its local object-store spill
            directory under memory pressure: give secrets through the workers' environment
            (``AWS_*``, an instance role) rather than here.
        overwrite: replace a dataset at ``url`` (readable until the commit) or an unfinished write's
            leftovers.
        rows_per_task: hand each write task (one partition) at least this many rows (Ray's
            ``min_rows_per_write``); each partition ends in a shard that is not full, so fewer,
            larger partitions make fewer small shards. None: ``spec.max_count`` when the shards
            are cut by count (at most one part-filled shard per full one), else Ray's blocks as
            they come.
        inline_limit: datasets up to this many samples keep their offsets inside ``index.json``.

    Raises:
        DatasetError: (when the write starts) ``url`` holds a dataset and ``overwrite`` is False;
            (when it ends) the dataset has no row.
    """

    def __init__(
        self, url: str, spec: ShardSpec | None = None, storage_options: Mapping[str, Any] | None = None,
        overwrite: bool = False, *, rows_per_task: int | None = None, inline_limit: int = INLINE_LIMIT,
    ) -> None:
        self.url = url
        self.spec = ShardSpec() if spec is None else spec
        self.storage_options = storage_options
        self.overwrite = overwrite
        self.inline_limit = inline_limit
        self.rows_per_task = rows_per_task
        self.index: DatasetIndex | None = None
        self._write: PartitionedWrite | None = None

    def __repr__(self) -> str:
        return f"DatasetSink({self.url!r}, spec={self.spec!r}, overwrite={self.overwrite})"

    def get_name(self) -> str:
        """The name of the write tasks in Ray's dashboard."""
        return "streamio"

    @property
    def min_rows_per_write(self) -> int | None:
        """Ray's bundling of rows into write tasks (``rows_per_task``, or ``spec.max_count``)."""
        return self.rows_per_task if self.rows_per_task is not None else self.spec.max_count

    def on_write_start(self, schema: Any = None) -> None:
        """Driver, once: put the marker and choose the shard names."""
        self._write = PartitionedWrite.begin(
            self.url, spec=self.spec, storage_options=self.storage_options, overwrite=self.overwrite,
            inline_limit=self.inline_limit,
        )

    def write(self, blocks: Iterable[Any], ctx: Any) -> PartSummary:
        """One task: its blocks' rows become partition ``ctx.task_idx``."""
        if self._write is None:
            raise DatasetError(
                f"DatasetSink({self.url!r}).write ran before on_write_start: use ds.write_datasink(sink)"
            )
        part = int(ctx.task_idx)
        return self._write.write_part(part, rows_of(iter(blocks), part, _BlockAccessor))

    def on_write_complete(self, write_result: Any) -> None:
        """Driver, once: merge the partitions into ``index.json`` (the commit)."""
        if self._write is None:  # no input bundle ever came: Ray never started the write
            raise DatasetError(f"no samples were written to {self.url}: the Ray Dataset is empty")
        parts = [r.part for r in write_result.write_returns if isinstance(r, PartSummary)]
        self.index = self._write.commit(parts)

    def on_write_failed(self, error: Exception) -> None:
        """Driver: no index was written; say what is left and how it goes."""
        if self._write is not None:
            log.warning(
                "writing %s failed (%s): no index was written, so it still holds the dataset it held before, if "
                "any. The shards this write stored (%s) are not part of it: the next write there with overwrite=True "
                "removes them.",
                self.url, type(error).__name__, self._write.generation.pattern,
            )
