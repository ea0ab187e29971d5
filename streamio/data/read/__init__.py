"""A DataLoader worker's read path: its planned windows -> bytes fetched ahead -> verified, decoded samples.

:class:`~streamio.data.read.reader.WindowReader` is the I/O half of ``StreamingDataset``: it turns
the planner's windows into long sequential byte reads through the index, fetched ahead in order
by a bounded background fetcher (through the node cache, :mod:`streamio.data.cache`, when there is
one), and parses and verifies each sample with :mod:`streamio.data.format.samples`. See
docs/design.md "Node cache and prefetch" and "StreamingDataset and exact resume"; the map of its
modules and the order of their layers (the import-linter contract "A worker's read path" in
pyproject.toml): docs/design.md "Layout and the direction of dependencies".
"""
