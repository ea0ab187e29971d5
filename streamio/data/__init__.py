"""The dataset side of streamio: a dataset's bytes, making it, and streaming it into training.

Training uses :class:`~streamio.data.dataset.StreamingDataset` and
:class:`~streamio.data.loader.StreamingDataLoader`; below them, a package per concept (a dataset's
bytes, writing and checking datasets, the PURE planner, the node cache, a worker's read path, the
DataLoader plumbing). The map of its packages and modules, and the one direction they import each
other in (import-linter contracts in pyproject.toml keep it): docs/design.md "Layout and the direction of dependencies".
"""
