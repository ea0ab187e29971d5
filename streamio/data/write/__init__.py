"""Making datasets and checking them: what ``streamio shard``, ``streamio index`` and ``streamio verify`` run.

``writer`` packs samples into shards and an index (:func:`~streamio.data.write.writer.write_dataset`)
and ``publish`` replaces a dataset only once the new one is complete; ``sources`` says where the
samples of ``streamio shard SRC`` come from (a directory tree read as ``localfiles`` decides, a
JSONL file, shards, gzip'd ones through ``gzipstream``); ``shardbuf`` is the shard being filled;
``indexer`` scans shards that exist into an index (:func:`~streamio.data.write.indexer.build_index`)
and ``verify`` checks a dataset against its index. None of it is on the training path: streaming
reads only :mod:`streamio.data.format`. See docs/design.md "Dataset format"; the import-linter
contract "Writing and checking datasets" in pyproject.toml keeps the order of its layers.
"""
