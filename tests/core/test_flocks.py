"""A lock released while a forked child holds a copy of its descriptor is released (streamio.flocks).

A DataLoader forks its workers at every ``iter(loader)``, often while a background checkpoint save
holds the local backend's directory lock. Released by closing its descriptor, that lock stayed held
by the idle workers' copies; the next save waited for it for ever while the workers waited for the
main thread (a CI run of tests/data/test_resume_rng.py hung so). Each test forks a child while the
lock is held, releases it in the parent and checks that the parent can take it again at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from streamio.data.cache.directory import CacheDirectory
from streamio.flocks import release
from streamio.storage.backends.local import _dir_lock


@contextlib.contextmanager
def forked_child() -> Iterator[None]:
    """A child forked now that keeps every inherited descriptor open until the block ends."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the parent's word, never run anything else
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        yield
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def free(path: Path) -> bool:
    """Whether an exclusive flock on ``path`` can be taken now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def held_across_fork(path: Path, unlock: Callable[[int], None]) -> bool:
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with forked_child():
        unlock(fd)
        return not free(path)


def test_a_closed_descriptor_leaves_the_lock_with_the_child_and_release_does_not(tmp_path: Path) -> None:
    assert held_across_fork(tmp_path, os.close)  # the premise: why release() exists
    assert not held_across_fork(tmp_path, release)


def test_the_local_backends_directory_lock_is_free_once_its_block_ends(tmp_path: Path) -> None:
    lock = _dir_lock(str(tmp_path))
    lock.__enter__()
    with forked_child():
        lock.__exit__(None, None, None)
        assert free(tmp_path)


def test_the_cache_directory_lock_is_free_once_its_block_ends(tmp_path: Path) -> None:
    cache = CacheDirectory(str(tmp_path / "cache"))
    lock = cache.locked()
    lock.__enter__()
    with forked_child():
        lock.__exit__(None, None, None)
        assert free(tmp_path / "cache" / ".lock")
