"""``flock`` locks that a fork does not keep held.

A ``flock`` belongs to an open file description, and a fork copies the descriptor into the child:
a lock released by closing the descriptor stays held while any child forked meanwhile keeps its
copy. A DataLoader forks its workers at every ``iter(loader)``, often while a checkpoint save runs
in a background thread; a lock that thread held at that moment would stay held by the idle workers
after the thread closed its descriptor, and the next save waiting for it would wait for ever (the
workers wait for the main thread, which waits for that save). :func:`release` unlocks the
description itself (``LOCK_UN``, which releases it for every copy) before closing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os


def release(fd: int) -> None:
    """Unlock ``fd``'s ``flock`` for every descriptor sharing it (forked copies included), then close it."""
    try:
        with contextlib.suppress(OSError):  # a failed unlock must not leave the descriptor open
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
