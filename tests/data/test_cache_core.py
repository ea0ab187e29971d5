"""The cache core without a server: an in-memory ``fetch(start, end)`` and a fake clock/sleep.

What these pin, in one process and in milliseconds: the range-first download and hits that never
fetch; a follower reading behind a download (driven step by step from the fake ``sleep``), taking it
over when the downloader stops, and failing when the download it read from is discarded; LRU
eviction that spares leased objects; corrupted cache files and corrupted or short downloads.
The same protocol over real HTTP and real processes is in test_cache.py and test_cache_multiprocess.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import pytest

from streamio.checksum import checksum_bytes
from streamio.data.cache import CacheConfig
from streamio.data.cache import record as record_module
from streamio.data.cache.core import CacheCore
from streamio.data.cache.record import RECORD_SIZE
from streamio.data.cache.source import Source
from streamio.data.cache.transfer import RESERVE
from streamio.errors import CorruptDataError

SIZE = 10_000
PIECE = 1_000


class Blob:
    """An object in memory whose ``fetch`` logs each call and can be told to misbehave."""

    def __init__(self, seed: int, size: int = SIZE) -> None:
        self.data = bytes((i * 7 + seed * 13 + (i >> 8)) & 0xFF for i in range(size))
        self.calls: list[tuple[int, int]] = []
        self.flip_at: int | None = None  # deliver this byte flipped
        self.short_by = 0  # the object ends this many bytes early

    def fetch(self, start: int, end: int) -> Iterator[bytes]:
        self.calls.append((start, end))
        stop = min(end, len(self.data) - self.short_by)
        for at in range(start, stop, PIECE):
            chunk = bytearray(self.data[at : min(at + PIECE, stop)])
            if self.flip_at is not None and at <= self.flip_at < at + len(chunk):
                chunk[self.flip_at - at] ^= 1
            yield bytes(chunk)

    def source(self, key: str) -> Source:
        return Source(key, f"mem://{key}", len(self.data), checksum_bytes(self.data), self.fetch)


class FakeTime:
    """A clock that moves only when ``sleep`` is called; ``on_sleep`` runs inside each sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.on_sleep: Callable[[], None] = lambda: None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        self.on_sleep()


def _core(directory: object, time: FakeTime | None = None, *, max_bytes: int = 1 << 20) -> CacheCore:
    config = CacheConfig(os.fspath(directory), max_bytes, min_free_bytes=0, chunk_size=PIECE)  # type: ignore[arg-type]
    time = time or FakeTime()
    return CacheCore(config, clock=time.clock, sleep=time.sleep)


def _read(core: CacheCore, src: Source, start: int = 0, end: int | None = None) -> bytes:
    return b"".join(core.open_range(src, start, src.size if end is None else end))


def test_download_is_range_first_and_hits_never_fetch(tmp_path) -> None:
    blob = Blob(1)
    core, src = _core(tmp_path / "c"), blob.source("k1")
    it = core.open_range(src, 4500, 6000)
    first = next(it)
    assert first == blob.data[4500:5500] and blob.calls == [(4500, SIZE)]  # one piece in: handed over
    assert first + b"".join(it) == blob.data[4500:6000]
    assert blob.calls == [(4500, SIZE), (0, 4500)]  # the rest of the object, after the run
    assert core.contains("k1") and core.stats.misses == 1 and core.stats.bytes_from_network == SIZE
    for start, end in [(0, SIZE), (9999, SIZE), (SIZE, SIZE), (123, 4567)]:
        assert _read(core, src, start, end) == blob.data[start:end]
    assert len(blob.calls) == 2 and core.stats.hits == 4


def test_follower_reads_behind_the_download_and_takes_it_over(tmp_path) -> None:
    blob = Blob(2)
    src = blob.source("k2")
    downloader = _core(tmp_path / "c").open_range(src, 0, SIZE)
    head = next(downloader) + next(downloader)  # 2 pieces written, the download lock held
    time = FakeTime()
    moves = iter([lambda: next(downloader), lambda: next(downloader), downloader.close])
    time.on_sleep = lambda: next(moves, lambda: None)()  # each wait of the follower lets the downloader act
    follower = _core(tmp_path / "c", time)
    assert _read(follower, src) == blob.data
    assert head == blob.data[:2000]
    # it followed 4 pieces, then took the stopped download over from byte 4000: never from 0
    assert blob.calls == [(0, SIZE), (4000, SIZE)]
    stats = follower.stats
    assert (stats.follows, stats.resumes, stats.misses, stats.hits) == (1, 1, 1, 0)
    assert stats.bytes_from_cache == 4000 and stats.bytes_from_network == SIZE - 4000
    assert stats.stall_s == pytest.approx(sum(time.slept)) and len(time.slept) >= 3
    assert follower.contains("k2")


def test_follower_fails_when_the_download_it_read_is_discarded(tmp_path) -> None:
    blob = Blob(3)
    blob.flip_at = 7000
    src = blob.source("k3")
    downloader = _core(tmp_path / "c").open_range(src, 0, SIZE)
    next(downloader)
    failures: list[Exception] = []

    def finish_download() -> None:
        try:
            b"".join(downloader)
        except CorruptDataError as exc:  # the downloader's own checksum failure
            failures.append(exc)

    time = FakeTime()
    time.on_sleep = finish_download
    with pytest.raises(CorruptDataError, match=r"mem://k3.*followed failed its checksum.*after 1000 bytes"):
        _read(_core(tmp_path / "c", time), src)
    assert len(failures) == 1 and "arrived with checksum" in str(failures[0])
    blob.flip_at = None
    assert _read(_core(tmp_path / "c"), src) == blob.data  # fetched again, clean


def _age(directory: str, key: str, seconds_ago: float) -> None:
    for suffix in (".data", ".use"):
        path = os.path.join(directory, key + suffix)
        st = os.stat(path)
        when = st.st_mtime - seconds_ago
        os.utime(path, (when, when))


def test_eviction_is_lru_and_spares_leased_objects(tmp_path) -> None:
    d = str(tmp_path / "c")
    room = SIZE + RESERVE
    core = _core(d, max_bytes=2 * room + SIZE // 2)  # two objects fit, a third needs an eviction
    blobs = {k: Blob(i) for i, k in enumerate(["a", "b", "c", "d"])}
    srcs = {k: b.source(k) for k, b in blobs.items()}
    for k in "ab":
        assert _read(core, srcs[k]) == blobs[k].data
    _age(d, "a", 2000)  # a is older than b ...
    _age(d, "b", 1000)
    assert _read(core, srcs["a"], 0, 10) == blobs["a"].data[:10]  # ... until it is read again
    assert _read(core, srcs["c"]) == blobs["c"].data
    assert (core.contains("a"), core.contains("b"), core.contains("c")) == (True, False, True)
    assert core.stats.evictions == 1 and core.usage() <= core.config.max_bytes
    held = [core.open_range(srcs[k], 0, SIZE) for k in "ac"]
    for it in held:
        next(it)  # both leased: neither may be evicted
    assert _read(core, srcs["d"]) == blobs["d"].data
    assert core.stats.bypasses == 1 and not core.contains("d") and core.contains("a") and core.contains("c")
    for it in held:
        it.close()
    assert core.usage() <= core.config.max_bytes and RESERVE == 4 * RECORD_SIZE


def test_corrupted_cache_file_is_discarded_and_fetched_again(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    blob = Blob(4)
    d = tmp_path / "c"
    core, src = _core(d), blob.source("k4")
    assert _read(core, src) == blob.data
    with open(d / "k4.data", "r+b") as f:  # bit rot / a stray writer (the mtime moves: the stamp no longer matches)
        f.seek(1234)
        byte = f.read(1)
        f.seek(1234)
        f.write(bytes([byte[0] ^ 1]))
    with caplog.at_level(logging.WARNING, logger="streamio.data.cache"):
        assert _read(core, src, 1000, 2000) == blob.data[1000:2000]
    assert "k4.data of mem://k4 has checksum" in caplog.text and "discarded" in caplog.text
    assert core.stats.discarded == 1 and blob.calls == [(0, SIZE), (1000, SIZE), (0, 1000)]


def test_a_file_from_another_boot_is_verified_before_it_is_served(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = Blob(5)
    d = tmp_path / "c"
    core, src = _core(d), blob.source("k5")
    assert _read(core, src) == blob.data
    st = os.stat(d / "k5.data")
    with open(d / "k5.data", "r+b") as f:  # corrupted, with its size and mtime put back
        f.write(b"\xff")
    os.utime(d / "k5.data", ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.setattr(record_module, "BOOT", record_module.BOOT + 1)  # a reboot: no stamp holds
    assert _read(core, src) == blob.data
    assert core.stats.discarded == 1 and len(blob.calls) == 2


@pytest.mark.parametrize("start", [0, 4500], ids=["crc-while-streaming", "crc-of-the-file"])
def test_corrupted_download_is_never_committed(tmp_path, start: int) -> None:
    blob = Blob(6)
    blob.flip_at = 8500
    d = tmp_path / "c"
    core, src = _core(d), blob.source("k6")
    with pytest.raises(CorruptDataError, match=r"shard 'mem://k6' arrived with checksum"):
        _read(core, src, start)
    assert sorted(os.listdir(d)) == [".lock", "k6.dl", "k6.use"]  # no .data, no .part
    blob.flip_at = None
    assert _read(core, src) == blob.data and core.contains("k6")


def test_short_object_raises_and_commits_nothing(tmp_path) -> None:
    blob = Blob(7)
    blob.short_by = 100
    core, src = _core(tmp_path / "c"), blob.source("k7")
    with pytest.raises(CorruptDataError, match=r"mem://k7.*ended after 9900 bytes; the index says 10000"):
        _read(core, src)
    assert not core.contains("k7")
    big = _core(tmp_path / "small", max_bytes=SIZE)  # cannot hold it at all: streamed, checked the same
    with pytest.raises(CorruptDataError, match=r"mem://k7.*ended after 9900 bytes"):
        _read(big, src)
    assert big.stats.bypasses == 1


def test_fill_stopped_early_is_resumed_by_the_reader(tmp_path) -> None:
    blob = Blob(8)
    core, src = _core(tmp_path / "c"), blob.source("k8")
    started: list[int] = []
    pieces = iter(range(3))
    assert core.fill(src, 6000, on_started=lambda: started.append(1), cancelled=lambda: next(pieces, 3) >= 2)
    assert started == [1] and not core.contains("k8") and blob.calls == [(6000, SIZE)]
    assert _read(core, src, 6000, 7000) == blob.data[6000:7000]  # resumed: nothing fetched twice
    assert blob.calls == [(6000, SIZE), (9000, SIZE), (0, 6000)]
    assert core.stats.resumes == 1 and core.stats.bytes_from_network == SIZE and core.contains("k8")
    assert core.fill(src, 0, on_started=lambda: started.append(2)) and started == [1, 2]
