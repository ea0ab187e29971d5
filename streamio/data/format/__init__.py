"""What a dataset is in bytes: shards, their records and samples, the index, and the names of it all.

Everything that reads or writes a dataset agrees on these modules, and they know nothing of
writing, streaming or training: ``layout`` (the values and naming rules every other module
shares), ``tarfields`` / ``tar`` (tar records), ``zstdframes`` (zstd frames), ``samples`` (records
-> verified samples), ``index_schema`` / ``index`` (``index.json`` and its sidecars), ``marker``
(the write marker) and ``patterns`` (which shards a pattern names). See docs/design.md "Dataset
format" and "Reading shards"; the import-linter contract "Dataset format" in pyproject.toml keeps
the order of its layers.
"""
