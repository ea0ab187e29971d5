"""The dataset side of streamio: a dataset's bytes, making it, and streaming it into training.

Packages by concept, bottom-up: ``format`` (what a dataset is in bytes), ``write`` (making and
checking datasets), ``plan`` (PURE: which samples each rank and worker reads), ``cache`` (the
node-local shard cache), ``read`` (a worker's read path) and ``dataloader`` (streamio inside
torch's DataLoader machinery); then the modules that use them: ``locate``, ``mixing``, ``decode``,
``select``, ``position``, ``dataset`` (:class:`~streamio.data.dataset.StreamingDataset`) and
``loader`` (:class:`~streamio.data.loader.StreamingDataLoader`). docs/design.md "Layout and the
direction of dependencies" is the map, and the import-linter contracts in pyproject.toml keep it.
"""
