"""Ray Data adapters: write a streamio dataset from a Ray Dataset, index existing shards on a Ray cluster.

``streamio.ray`` is importable without Ray; using a name from it without Ray installed raises
:class:`~streamio.errors.MissingDependencyError` saying what to install
(``pip install 'streamio-torch[ray]'``). Both adapters drive the engine-neutral core and add no
format of their own:

* :class:`DatasetSink`, a ``ray.data.Datasink``: each write task packs its blocks' rows into the
  shards of one partition (:meth:`streamio.PartitionedWrite.write_part`, the task index as the
  partition id), and ``on_write_complete`` commits ``index.json`` on the driver::

      ds.write_datasink(streamio.ray.DatasetSink("s3://bucket/ds", spec=streamio.ShardSpec(max_count=1000)))

* :func:`index`: ``streamio index`` with the shards scanned by Ray tasks, each a subset, one commit
  on the driver; the same ``index.json`` (and fingerprint) as ``streamio index`` writes.

docs/design.md "Writing a dataset from many tasks" describes the protocol and its retries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamio.lazy import lazy_exports

__all__ = ["DatasetSink", "index"]

_EXPORTS = {"DatasetSink": "streamio.ray.sink", "index": "streamio.ray.indexing"}

if TYPE_CHECKING:
    from streamio.ray.indexing import index
    from streamio.ray.sink import DatasetSink


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each name imported on first use


def __dir__() -> list[str]:
    return __all__
