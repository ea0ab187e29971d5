"""Hostile files planted in the cache directory (issue 12): never followed, never blocking, never a
raw ``OSError``.

The directory itself is checked (private, ours, not a symlink) in test_cache.py; these are the names
inside it: the directory lock ``.lock`` and the per-shard ``KEY.data`` / ``.part`` / ``.dl`` /
``.use``. A symlink or other non-regular file is removed and the read goes on; what cannot be removed
safely (a directory) raises :class:`CacheError` naming it. A FIFO must not block an open: before the
fix a FIFO at ``KEY.data`` hung the reader for ever, hence the timeouts.
"""

from __future__ import annotations

import logging
import os
import stat

import pytest

from streamio.data.cache import ShardCache
from streamio.data.format.index import ShardInfo
from streamio.errors import CacheError
from streamio.storage import Store
from support.cache import cache_for, make_shards


def _setup(tmp_path) -> tuple[Store, ShardInfo, bytes, ShardCache, str]:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path / "ds"))
    (shard, data), = make_shards(store, 1, 5000)
    d = tmp_path / "c"
    cache = cache_for(d)
    cache.usage()  # creates and checks the directory
    return store, shard, data, cache, str(d)


@pytest.mark.timeout(60)
def test_lock_symlink_is_removed_never_followed(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    store, shard, data, cache, d = _setup(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(victim, os.path.join(d, ".lock"))
    with caplog.at_level(logging.WARNING, logger="streamio.data.cache"):
        assert b"".join(cache.open_range(store, shard)) == data
    assert victim.read_bytes() == b"keep"
    st = os.lstat(os.path.join(d, ".lock"))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert any(".lock is a symlink; removed, never followed" in r.getMessage() for r in caplog.records)
    assert cache.contains(store, shard)


@pytest.mark.timeout(60)
def test_dangling_lock_symlink_creates_nothing_at_its_target(tmp_path) -> None:
    store, shard, data, cache, d = _setup(tmp_path)
    target = tmp_path / "elsewhere" / "created-by-the-cache"
    target.parent.mkdir()
    os.symlink(target, os.path.join(d, ".lock"))
    assert b"".join(cache.open_range(store, shard)) == data
    assert not target.exists()


@pytest.mark.timeout(60)
def test_lock_directory_is_a_cache_error_naming_it(tmp_path) -> None:
    store, shard, _, cache, d = _setup(tmp_path)
    os.mkdir(os.path.join(d, ".lock"))
    with pytest.raises(CacheError, match=rf"lock file '{d}/\.lock'.*Is a directory.*remove it"):
        b"".join(cache.open_range(store, shard))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [".lock", "{key}.data", "{key}.part", "{key}.dl", "{key}.use"])
def test_fifo_under_a_cache_name_never_blocks(tmp_path, name: str) -> None:
    store, shard, data, cache, d = _setup(tmp_path)
    path = os.path.join(d, name.format(key=cache._key(store, shard)))
    os.mkfifo(path, 0o600)
    assert b"".join(cache.open_range(store, shard)) == data
    assert cache.contains(store, shard)
    assert not os.path.exists(path) or stat.S_ISREG(os.lstat(path).st_mode)
    assert b"".join(cache.open_range(store, shard)) == data and cache.stats.hits == 1


@pytest.mark.timeout(60)
def test_cache_dir_swapped_for_a_symlink_while_opened(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "c"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    real_lstat = os.lstat

    def lstat_then_swap(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        st = real_lstat(path, *args, **kwargs)
        if os.fspath(path) == str(d):  # the check passed; now an attacker swaps in a symlink
            os.rmdir(d)
            os.symlink(elsewhere, d)
        return st

    monkeypatch.setattr(os, "lstat", lstat_then_swap)
    with pytest.raises(CacheError, match=rf"cache directory '{d}' changed while being opened"):
        cache_for(d).usage()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["{key}.data", "{key}.part", "{key}.dl", "{key}.use"])
def test_directory_under_a_cache_name_is_a_cache_error_naming_it(tmp_path, name: str) -> None:
    """A directory cannot be removed safely: a CacheError naming it, never a raw OSError."""
    store, shard, _, cache, d = _setup(tmp_path)
    path = os.path.join(d, name.format(key=cache._key(store, shard)))
    os.mkdir(path)
    with pytest.raises(CacheError, match=rf"'{path}'.*Is a directory.*remove it"):
        b"".join(cache.open_range(store, shard))
    assert os.path.isdir(path)
