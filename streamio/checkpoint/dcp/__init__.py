"""torch DCP over streamio: ``StreamioWriter`` / ``StreamioReader``, a ``StorageWriter`` / ``StorageReader`` pair.

``torch.distributed.checkpoint.save`` / ``load`` keep their planning and use streamio's storage
and commit protocol underneath (``writer``, ``reader``); DCP's metadata is rebuilt from the JSON
manifest, never unpickled (``metadata``). Both are exported by :mod:`streamio.checkpoint`, which
imports them on first use: torch DCP costs a second to import. The map of these modules:
docs/design.md "Layout and the direction of dependencies"; the design: docs/sharded-checkpoints.md.
"""
