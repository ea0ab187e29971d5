"""What streamio does inside torch's DataLoader machinery, below the dataset and the loader.

``allocator`` tunes glibc ``malloc`` in DataLoader worker processes (freed sample memory reused);
``transport`` carries a batch's bytes from the workers to the main process through shared-memory
rings instead of the pickle pipe; ``stateful_loader`` hooks torchdata's ``StatefulDataLoader`` so
that restoring it restores the main process's dataset at once. They import no other data module:
:class:`~streamio.data.dataset.StreamingDataset` and
:class:`~streamio.data.loader.StreamingDataLoader` (which counts batches for exact resume, and
therefore sits above the dataset, outside this package) use them. See docs/design.md
"StreamingDataset and exact resume"; the import-linter contract "DataLoader plumbing" in
pyproject.toml keeps them independent.
"""
