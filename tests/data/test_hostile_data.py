"""Hostile shards and indexes (issue 12): every case of :mod:`hostile_corpus` ends in the right
streamio error, naming the shard and a byte offset, within a time budget and a memory budget,
through every reader: unindexed reading (``streamio shard SRC.tar``), index scanning (``streamio
index``), verified reads (``StreamingDataset``, ``streamio verify``) and the CLI in subprocesses.

On the code before the fix these cases looped for ever (negative sizes, pax records of length 0),
raised bare ``ValueError`` / ``MemoryError``, or were accepted with garbage; see the corpus.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from streamio.data.dataset import StreamingDataset  # imported here: torch's import is not the parser's budget
from streamio.data.format.index import load_index
from streamio.data.format.samples import iter_samples
from streamio.data.write.indexer import build_index, scan_chunks
from streamio.data.write.sources import samples_from_shards
from streamio.data.write.verify import validate
from streamio.errors import DatasetError, IndexFormatError, ObjectNotFoundError, ShardFormatError, StreamioError
from streamio.storage import Store
from support import hostile_corpus as hc

LIMIT = 8 << 20  # max_sample_bytes of the library cases: a bomb must stop here
CAP = 10_000  # more samples than any case holds: a reader that loops backwards is stopped here
TIME_BUDGET = 5.0  # seconds; every case takes milliseconds, a regression loops for ever
MEMORY_BUDGET = 48 << 20  # tracemalloc peak; a regression allocates gigabytes
CASES = {c.name: c for c in hc.all_cases()}
pytestmark = pytest.mark.timeout(60)  # a parser that loops fails here instead of hanging the suite


def bounded(fn: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """``fn`` under the time and memory budgets: ``(result, None)`` or ``(None, the exception it raised)``."""
    return hc.within(fn, seconds=TIME_BUDGET, max_bytes=MEMORY_BUDGET)


def assert_refused(error: BaseException | None, expected: type[StreamioError], url: str) -> None:
    assert error is not None, "the hostile input was accepted"
    assert isinstance(error, expected), f"{type(error).__name__}: {error}"
    message = str(error)
    assert url in message and re.search(r"(byte|offset) \d+", message), message


def chunks(data: bytes, size: int = 4096) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def stored(case: hc.Case) -> tuple[Store, str]:
    store = Store(f"memory://hostile-{uuid.uuid4().hex}")
    hc.write_case(store, case)
    return store, store.url(case.path)


def compression(case: hc.Case) -> str | None:
    return "zstd" if case.suffix == ".tar.zst" else None


# --------------------------------------------------------------------------- library, one test per case
@pytest.mark.parametrize("name", CASES)
def test_unindexed_read_refuses(name: str) -> None:
    """``iter_samples`` without an index (what ``streamio shard SRC.tar`` and foreign readers run)."""
    case = CASES[name]
    url = f"memory://x/{case.path}"
    samples = iter_samples(chunks(case.shard), url=url, compression=compression(case), max_sample_bytes=LIMIT)
    count, error = bounded(lambda: sum(1 for _ in islice(samples, CAP)))
    assert count is None or count < CAP, "endless samples: the reader went backwards"
    if case.raw_ok and error is None:
        return
    assert_refused(error, case.error, url)


@pytest.mark.parametrize("name", CASES)
def test_index_scan_refuses(name: str) -> None:
    """``scan_chunks`` (what ``build_index`` / ``streamio index`` runs on each shard)."""
    case = CASES[name]
    url = f"memory://x/{case.path}"
    result, error = bounded(lambda: scan_chunks(chunks(case.shard), url=url, path=case.path, max_sample_bytes=LIMIT))
    if case.raw_ok and error is None:
        return
    assert_refused(error, case.error, url)


@pytest.mark.parametrize("name", CASES)
def test_verified_read_refuses(name: str) -> None:
    """``iter_samples`` with the layout of an index whose checksums match the hostile bytes (the reader's call)."""
    case = CASES[name]
    store, url = stored(case)
    index = load_index(store)
    layout = index.layout(0, store)
    _, error = bounded(lambda: list(islice(iter_samples(
        chunks(case.shard), url=url, layout=layout, compression=index.shards[0].compression), CAP)))
    assert_refused(error, case.error, url)


@pytest.mark.parametrize("name", CASES)
def test_streaming_dataset_refuses(name: str) -> None:
    case = CASES[name]
    store, url = stored(case)
    _, error = bounded(lambda: list(StreamingDataset(store.root_url)))
    assert_refused(error, case.error, url)


@pytest.mark.parametrize("name", CASES)
def test_deep_validate_reports_the_shard_bad(name: str) -> None:
    """``validate(deep=True)`` (``streamio verify``) reports the shard as bad, with the parser's reason."""
    case = CASES[name]
    store, url = stored(case)
    report, error = bounded(lambda: validate(store, load_index(store), deep=True))
    assert error is None, repr(error)
    assert not report.ok and [b.path for b in report.bad] == [case.path]
    assert url in report.bad[0].reason and re.search(r"(byte|offset) \d+", report.bad[0].reason), report.bad[0].reason


REASONS = {  # what the error says for a few cases: the reason, not only the class
    "size_negative_octal": "size field b'-0000003000\\x00', not an octal number",
    "size_underscore": "not an octal number",
    "size_base256_negative": "a negative base-256 number",
    "size_base256_bad_marker": "not a number",
    "size_base256_huge": "declares 309485009821345068724781055 bytes, more than the 8388608",
    "pax_size_negative": "pax size='-5', not a decimal number",
    "pax_length_zero": "length 0 does not cover the record's own header",
    "pax_length_past_its_data": "length 99 runs past the header's 14 bytes",
    "pax_no_equals": "no 'key=' in the record",
    "pax_no_newline": "does not end with a newline",
    "pax_chain_over_limit": "over the limit of 1048576",
    "gnu_longname_over_limit": "the GNU long name at byte 1024",
    "zstd_block_over_128k": "has a block of 131073 bytes (at most 131072)",
    "zstd_truncated": "truncated",
    "zstd_bomb_member": "member 'bomb.bin' at byte 0 declares 2147483648 bytes",
    "zstd_bomb_sample": "spans more than 8388608 bytes",
}


@pytest.mark.parametrize("name", REASONS)
def test_the_error_says_why(name: str) -> None:
    case = CASES[name]
    url = f"memory://x/{case.path}"
    _, error = bounded(lambda: list(iter_samples(
        chunks(case.shard), url=url, compression=compression(case), max_sample_bytes=LIMIT)))
    assert REASONS[name] in str(error), str(error)


def test_an_npy_member_declaring_more_than_it_holds_is_refused_before_numpy_allocates_it() -> None:
    import numpy as np
    from numpy.lib import format as npy

    from streamio.data.decode import make_decoder

    head = io.BytesIO()
    npy.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    sample = {"__key__": "k", "npy": head.getvalue() + bytes(24), "__url__": "mem://s.tar"}
    _, error = bounded(lambda: make_decoder("auto")(sample))
    assert isinstance(error, DatasetError)
    assert "declares 8000000000 bytes of float64 (1000000000,), it holds 24" in str(error)
    good = io.BytesIO()
    np.save(good, np.arange(6).reshape(2, 3))
    assert make_decoder("auto")({"__key__": "k", "npy": good.getvalue()})["npy"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_an_index_without_max_sample_bytes_still_bounds_decompression() -> None:
    """An index written before ``max_sample_bytes`` existed: the reader's limit applies (here LIMIT)."""
    case = CASES["zstd_bomb_sample"]  # 24 MiB of members in one sample, in a ~1 KB frame
    store, url = stored(hc.Case(case.name, case.sample, case.suffix, trailer=case.trailer))
    layout = load_index(store).layout(0, store)
    assert layout.max_sample_bytes is None
    _, error = bounded(lambda: list(iter_samples(
        [case.shard], url=url, layout=layout, compression="zstd", max_sample_bytes=LIMIT)))
    assert_refused(error, ShardFormatError, url)
    assert f"more than the {LIMIT}" in str(error)


def test_handler_skips_an_over_limit_member_without_keeping_it() -> None:
    shard = hc.GOOD + hc.member(b"big.bin", bytes(4 << 20)) + hc.AFTER + hc.END
    seen: list[Exception] = []
    got, error = bounded(lambda: list(iter_samples(
        chunks(shard, 1 << 16), url="mem://s.tar", max_sample_bytes=1 << 20, handler=lambda e: seen.append(e) or True)))
    assert error is None and [s["__key__"] for s in got] == ["s0", "s1"]
    assert len(seen) == 1
    assert "member 'big.bin' at byte 1024 declares 4194304 bytes, more than the 1048576" in str(seen[0])
    truncated = hc.GOOD + hc.header(b"big.bin", 1 << 32) + hc.AFTER + hc.END  # declares 4 GiB, holds nothing of it
    _, error = bounded(lambda: list(iter_samples([truncated], url="mem://s.tar", max_sample_bytes=LIMIT)))
    assert isinstance(error, ShardFormatError) and "declares 4294967296 bytes" in str(error)


# --------------------------------------------------------------------------- the zstd stream primitives
def test_decompress_stops_one_byte_past_its_limit() -> None:
    from streamio.data.format.zstdframes import decompress

    frame = hc.zstd_frame(b"", rle_zeros=3 << 20)  # ~100 bytes, 3 MiB of zeros, no declared size
    total, error = bounded(lambda: sum(len(p) for p in decompress([frame], url="mem://s", what="it", limit=3 << 20)))
    assert error is None and total == 3 << 20
    _, error = bounded(lambda: sum(len(p) for p in decompress([frame], url="mem://s", what="it", limit=1 << 20)))
    assert isinstance(error, ShardFormatError) and "it decompresses to more than the 1048576 bytes" in str(error)


def test_decompress_refuses_a_stream_cut_inside_a_frame() -> None:
    """zstandard's stream_reader ends silently there; the frame walker does not."""
    from streamio.data.format.zstdframes import decompress

    frame = hc.zstd(bytes(range(256)) * 400)
    for cut in (len(frame) - 3, 10, 3):
        _, error = bounded(lambda cut=cut: list(decompress(chunks(frame[:cut], 7), url="mem://s", what="it")))
        assert isinstance(error, ShardFormatError) and "truncated" in str(error), (cut, error)
    _, error = bounded(lambda: list(decompress([frame + b"trailing garbage"], url="mem://s", what="it")))
    assert isinstance(error, ShardFormatError) and "are not a zstd frame" in str(error)


def test_split_frames_refuses_a_frame_over_its_limit_before_it_ends() -> None:
    from streamio.data.format.zstdframes import split_frames

    frames = hc.zstd(b"a" * 100) + hc.zstd_frame(bytes(range(256)) * 2000) + hc.zstd(b"b")  # 500 KB raw blocks
    seen: list[int] = []
    pieces = chunks(frames, 4096)
    count: Callable[[bytes], None] = lambda c: seen.append(len(c))  # noqa: E731
    _, error = bounded(lambda: list(split_frames(pieces, url="mem://s", limit=64 << 10, on_chunk=count)))
    assert isinstance(error, ShardFormatError) and "larger than 65536 bytes" in str(error)
    assert sum(seen) < (64 << 10) + 2 * 4096 + len(hc.zstd(b"a" * 100))  # stopped as the frame passed the limit
    got, error = bounded(lambda: list(split_frames(pieces, url="mem://s", limit=1 << 20)))
    assert error is None and b"".join(f for _, f in got) == frames and len(got) == 3


# --------------------------------------------------------------------------- index.json and sidecars
INDEX_CASES = {c.name: c for c in hc.index_cases() + hc.sidecar_cases()}


@pytest.mark.parametrize("name", INDEX_CASES)
def test_hostile_index_is_refused_before_any_shard_is_read(name: str, tmp_path: Path) -> None:
    case = INDEX_CASES[name]
    (tmp_path / "data-000000.tar").write_bytes(hc.GOOD_SHARD)
    (tmp_path / "index.json").write_bytes(case.doc)
    for path, data in case.sidecars.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    store = Store(str(tmp_path))

    def load() -> Any:
        index = load_index(store)
        return [index.layout(i, store) for i in range(len(index.shards))]

    _, error = bounded(load)
    assert error is not None, "the hostile index was accepted"
    assert isinstance(error, case.error), repr(error)
    assert case.words in str(error) and ("index.json" in str(error) or "_layout/x.bin" in str(error)), str(error)


def test_an_oversized_index_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """``index.json`` is read with a size limit: a 1 GiB file is refused, never held."""
    with open(tmp_path / "index.json", "wb") as f:
        f.truncate(1 << 30)  # sparse: costs nothing on disk
    _, error = bounded(lambda: load_index(Store(str(tmp_path))))
    assert isinstance(error, IndexFormatError), error
    assert "index.json is 1073741824 bytes" in str(error) and "streamio index" in str(error), error


def test_shard_paths_outside_the_root_are_never_opened(tmp_path: Path) -> None:
    """A ``..`` path naming a real file beside the dataset is refused at load, not read."""
    outside = tmp_path / "outside.tar"
    outside.write_bytes(hc.GOOD_SHARD)
    root = tmp_path / "ds"
    root.mkdir()
    doc = hc.good_index(hc.GOOD_SHARD, len(hc.GOOD), path="../outside.tar")
    (root / "index.json").write_text(json.dumps(doc))
    before = os.stat(outside).st_atime_ns
    with pytest.raises(IndexFormatError, match=r"'\.\./outside\.tar'.*not a plain relative name.*'\.\.' component"):
        load_index(Store(str(root)))
    assert os.stat(outside).st_atime_ns == before


def test_index_of_a_missing_root_names_it() -> None:
    store = Store(f"memory://nothing-{uuid.uuid4().hex}/ds")
    with pytest.raises(ObjectNotFoundError, match=r"no \.tar or \.tar\.zst shards under memory://nothing-.*/ds: it is"):
        build_index(store)
    with pytest.raises(ObjectNotFoundError, match=r"no shards match 'x-\*\.tar' under memory://nothing-"):
        build_index(store, "x-*.tar")
    with pytest.raises(ObjectNotFoundError, match="no shards match"):
        next(samples_from_shards(store, "x-*.tar"))


def test_index_of_a_path_that_cannot_be_named_is_refused() -> None:
    store = Store(f"memory://named-{uuid.uuid4().hex}/ds")
    store.put("a/x.tar", hc.GOOD_SHARD)
    with pytest.raises(DatasetError, match=r"'a/\.\./a/x\.tar'.*not a plain relative name"):
        build_index(store, "a/../a/x.tar")


def test_max_sample_bytes_round_trips_through_the_index() -> None:
    from streamio.data.write.writer import ShardSpec, write_dataset

    store = Store(f"memory://rt-{uuid.uuid4().hex}")
    samples = [{"__key__": f"k{i}", "bin": bytes(1000 * i)} for i in range(5)]
    for inline_limit in (100, 0):  # in index.json, and beside a sidecar
        index = write_dataset(
            samples, store, spec=ShardSpec(compression="zstd"), overwrite=True, inline_limit=inline_limit,
        )
        biggest = 512 + 4096  # the last sample: its header and 4000 bytes padded
        assert index.layout(0, store).max_sample_bytes == biggest
        assert load_index(store).layout(0, store).max_sample_bytes == biggest
        assert json.loads(store.read("index.json"))["shards"][0]["max_sample_bytes"] == biggest
        store.delete("index.json")
        assert build_index(store).layout(0, store).max_sample_bytes == biggest
    plain = write_dataset(samples, Store(f"memory://rt-{uuid.uuid4().hex}"))
    assert plain.layout(0, Store("memory://unused")).max_sample_bytes is None


# --------------------------------------------------------------------------- the CLI, in subprocesses
# one case per defect class (each process pays ~1.5 s of imports, so not the whole corpus again)
CLI_CASES = ["size_negative_octal", "pax_length_zero", "size_garbage_octal", "pax_size_5000_digits", "zstd_bomb_member"]
CLI_VERIFY_ONLY = ["zstd_declares_64gib"]  # the verified read is where a declared 64 GiB was allocated
CLI_INDEX_CASES = ["path_dotdot", "deeply_nested"]
CLI_TIMEOUT = 60.0
CLI_RSS_BUDGET = 640 << 20  # the CLI with torch imported is ~230 MB here
CLI_ADDRESS_LIMIT = 3 << 30  # a regression fails with MemoryError instead of taking the machine


# The CLI under an address-space limit (set in the child itself: no preexec_fn in a threaded parent).
# Its peak RSS is the child's own VmHWM, written at exit: getrusage/wait4's ru_maxrss is inherited
# across fork + exec, so in a long suite every child would report the pytest process's own peak.
_LAUNCH = f"""
import os, resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, ({CLI_ADDRESS_LIMIT}, {CLI_ADDRESS_LIMIT}))
sys.argv[0] = "streamio"
try:
    runpy.run_module("streamio.cli.main", run_name="__main__")
finally:
    with open("/proc/self/status") as status, open(os.environ["STREAMIO_TEST_HWM"], "w") as hwm:
        hwm.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


def run_cli(args: list[str], out: Path) -> dict[str, Any]:
    """``python -m streamio.cli.main ARGS`` with a timeout and an address-space limit; rc, stderr, peak RSS."""
    out.mkdir(parents=True, exist_ok=True)
    hwm = out / "hwm_kib"
    env = {**os.environ, "STREAMIO_TEST_HWM": str(hwm)}
    with open(out / "stdout", "wb") as so, open(out / "stderr", "wb") as se:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, *args], stdout=so, stderr=se, stdin=subprocess.DEVNULL, env=env
        )
        try:
            proc.wait(timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {"rc": None, "stderr": "timed out", "rss": 0}
    stderr = (out / "stderr").read_text(errors="replace")
    rss = int(hwm.read_text()) * 1024 if hwm.exists() else 0
    return {"rc": proc.returncode, "stderr": stderr, "rss": rss}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """Every CLI run of this module, four at a time (each process pays ~1.5 s of imports)."""
    base = tmp_path_factory.mktemp("cli")
    jobs: dict[tuple[str, str], list[str]] = {}
    for name in CLI_CASES + CLI_VERIFY_ONLY:
        case = CASES[name]
        shard_dir, verify_dir = base / name / "shard", base / name / "verify"
        shard_dir.mkdir(parents=True)
        (shard_dir / case.path).write_bytes(case.shard)
        hc.write_case(Store(str(verify_dir)), case)
        jobs[("index", name)] = ["index", str(shard_dir)]
        jobs[("shard", name)] = ["shard", f"{shard_dir}/*{case.suffix}", str(base / name / "dest")]
        jobs[("verify", name)] = ["verify", str(verify_dir)]
    for name in CLI_VERIFY_ONLY:
        del jobs[("index", name)], jobs[("shard", name)]
    for name in CLI_INDEX_CASES:
        root = base / name / "ds"
        root.mkdir(parents=True)
        (root / "data-000000.tar").write_bytes(hc.GOOD_SHARD)
        (root / "index.json").write_bytes(INDEX_CASES[name].doc)
        jobs[("inspect", name)] = ["inspect", str(root)]
    jobs[("verify-index", "path_dotdot")] = ["verify", str(base / "path_dotdot" / "ds")]
    jobs[("index", "nonexistent")] = ["index", str(base / "no" / "such" / "dir")]
    with ThreadPoolExecutor(4) as pool:
        futures = {key: pool.submit(run_cli, args, base / "runs" / "-".join(key)) for key, args in jobs.items()}
        results = {key: f.result() for key, f in futures.items()}
    results[("base", "")] = {"dir": base}
    return results


def _assert_clean_failure(result: dict[str, Any], code: int) -> None:
    assert result["rc"] == code, result
    last = result["stderr"].strip().splitlines()[-1:]
    assert "Traceback" not in result["stderr"] and last and last[0].startswith("Error: "), result["stderr"]
    assert 0 < result["rss"] < CLI_RSS_BUDGET, f"max RSS {result['rss'] / 2**20:.0f} MiB"


@pytest.mark.timeout(900)  # the first one runs every CLI process of the module (cli_results)
@pytest.mark.parametrize(
    ("verb", "name"),
    [(v, n) for n in CLI_CASES for v in ("index", "shard", "verify")] + [("verify", n) for n in CLI_VERIFY_ONLY],
)
def test_cli_refuses_hostile_shards(cli_results: dict[tuple[str, str], dict[str, Any]], verb: str, name: str) -> None:
    result = cli_results[(verb, name)]
    if verb == "verify":  # verify reports bad shards itself: exit 1, one line per bad shard
        assert result["rc"] == 1 and "Traceback" not in result["stderr"], result
        assert "data-000000" in result["stderr"] and re.search(r"(byte|offset) \d+", result["stderr"]), result["stderr"]
        assert 0 < result["rss"] < CLI_RSS_BUDGET
        return
    _assert_clean_failure(result, 1)
    assert re.search(r"(byte|offset) \d+", result["stderr"]), result["stderr"]
    if verb == "shard":  # stopped with an error instead of writing on: no index, next to nothing written
        dest = cli_results[("base", "")]["dir"] / name / "dest"
        written = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) if dest.exists() else 0
        assert not (dest / "index.json").exists() and written < 1 << 20


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("verb", "name"), [("inspect", n) for n in CLI_INDEX_CASES] + [("verify-index", "path_dotdot")]
)
def test_cli_refuses_hostile_indexes(cli_results: dict[tuple[str, str], dict[str, Any]], verb: str, name: str) -> None:
    result = cli_results[(verb, name)]
    _assert_clean_failure(result, 1)
    assert "index.json" in result["stderr"] and INDEX_CASES[name].words in result["stderr"], result["stderr"]


@pytest.mark.timeout(900)
def test_cli_index_of_a_missing_directory_names_it(cli_results: dict[tuple[str, str], dict[str, Any]]) -> None:
    result = cli_results[("index", "nonexistent")]
    assert result["rc"] not in (0, None) and "Traceback" not in result["stderr"], result
    assert "no/such/dir: it is empty or does not exist" in result["stderr"] and "None" not in result["stderr"]
