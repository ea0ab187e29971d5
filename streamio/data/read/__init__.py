"""A DataLoader worker's read path: its planned windows -> bytes fetched ahead -> verified, decoded samples.

``reader`` (:class:`~streamio.data.read.reader.WindowReader`, the I/O half of ``StreamingDataset``)
turns the planner's windows into byte runs through the index, reads them in the order
``schedule`` gives (long sequential reads, segments where several shards are open at once),
through ``prefetch`` (a bounded, in-order background fetcher that goes through the node cache,
:mod:`streamio.data.cache`, when there is one), and parses and verifies each sample with
:mod:`streamio.data.format.samples`. See docs/design.md "Node cache and prefetch" and
"StreamingDataset and exact resume"; the import-linter contract "A worker's read path" in
pyproject.toml keeps the order of its layers.
"""
