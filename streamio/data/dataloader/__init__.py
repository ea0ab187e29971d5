"""What streamio does inside torch's DataLoader machinery, below the dataset and the loader.

glibc ``malloc`` tuned in DataLoader worker processes, a batch's bytes carried from the workers to
the main process through shared-memory rings instead of the pickle pipe, torchdata's
``StatefulDataLoader`` hooked so that restoring it restores the main process's dataset at once,
and the thread path that replaces worker processes (batches made on threads, in order).
None of it imports another data module: :class:`~streamio.data.dataset.StreamingDataset` and
:class:`~streamio.data.loader.StreamingDataLoader` (which counts batches for exact resume, and
therefore sits above the dataset, outside this package) use it. See docs/design.md
"StreamingDataset and exact resume"; the map of its modules (independent of each other: the
import-linter contract "DataLoader plumbing" in pyproject.toml): docs/design.md "Layout and the
direction of dependencies".
"""
