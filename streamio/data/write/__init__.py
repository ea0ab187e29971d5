"""Making datasets and checking them: what ``streamio shard``, ``streamio index`` and ``streamio verify`` run.

Samples packed into shards and an index, a dataset replaced only once the new one is complete,
shards that exist scanned into an index, a dataset checked against its index. None of it is on
the training path: streaming reads only :mod:`streamio.data.format`. See docs/design.md "Dataset
format"; the map of its modules and the order of their layers (the import-linter contract "Writing
and checking datasets" in pyproject.toml): docs/design.md "Layout and the direction of dependencies".
"""
