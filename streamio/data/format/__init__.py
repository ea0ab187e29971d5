"""What a dataset is in bytes: shards, their records and samples, the index, and the names of it all.

Everything that reads or writes a dataset agrees on this package, and it knows nothing of
writing, streaming or training. The formats: docs/design.md "Dataset format" and "Reading shards";
the map of its modules and the order of their layers (the import-linter contract "Dataset format"
in pyproject.toml): docs/design.md "Layout and the direction of dependencies".
"""
