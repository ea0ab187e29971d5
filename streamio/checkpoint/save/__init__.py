"""Saving a checkpoint: the snapshot ``save`` blocks on, then the commit protocol and what follows it.

The snapshot (``snapshot``: the state encoded and this rank's share copied to host memory), the
commit (``commit``: parts, done markers, barrier, create-only manifest, compare-and-swap pointer),
what is deleted after it (``pruning``: abandoned and bad saves, the retention policy), what a
failed save removes (``abandon``) and the saves still in flight at interpreter exit (``inflight``).
The map of these modules: docs/design.md "Layout and the direction of dependencies"; the protocol:
docs/design.md "Commit protocol".
"""
