"""A generator of hostile shards and indexes: every way the bytes of a dataset were found to hang,
exhaust memory or crash streamio (issue 12), each with its neighbours.

Each :class:`Case` is the bytes of one shard and the streamio error a reader must raise for it.
:func:`write_case` stores a case as a dataset whose ``index.json`` describes the hostile bytes as
one correctly checksummed sample, so that verified reads (``StreamingDataset``, ``streamio
verify``) reach the parser too; :func:`index_cases` are hostile ``index.json`` documents.

Everything is built by hand from the formats (512-byte tar headers with a valid checksum, zstd
frames from raw / RLE block headers), so a 20 KB case can declare or inflate to gigabytes while
costing nothing to generate. :func:`within` runs a parser under a time and a memory budget (a
parser that loops is interrupted, not waited for).
"""

from __future__ import annotations

import json
import signal
import struct
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zstandard

from streamio.checksum import crc32c, format_checksum
from streamio.errors import CorruptDataError, IndexFormatError, ShardFormatError, StreamioError
from streamio.storage import Store

BLOCK = 512
END = bytes(2 * BLOCK)
GiB = 1 << 30


# ----------------------------------------------------------------------------- budgets
class Overtime(BaseException):
    """Raised into a parser that outran its time budget (a BaseException: no ``except Exception`` eats it)."""


def within(fn: Callable[[], Any], *, seconds: float, max_bytes: int) -> tuple[Any, Exception | None]:
    """``(fn(), None)`` or ``(None, the exception)``; fails if ``fn`` outruns ``seconds`` or allocates ``max_bytes``.

    Time is enforced with SIGALRM (the main thread: where pytest runs tests), so a parser stuck in a
    loop is interrupted after ``seconds`` instead of hanging the suite; memory is tracemalloc's peak.
    """
    def on_alarm(signum: int, frame: Any) -> None:
        raise Overtime(f"still running after {seconds} s: the parser does not finish")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    pending, _ = signal.setitimer(signal.ITIMER_REAL, seconds)  # pytest-timeout's alarm, if any, is put back
    tracemalloc.start()
    start = time.perf_counter()
    result, error = None, None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - returned to the caller, who checks its class
        error = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if pending:
            signal.setitimer(signal.ITIMER_REAL, max(pending - elapsed, 0.001))
    assert elapsed < seconds, f"took {elapsed:.1f} s"
    assert peak < max_bytes, f"allocated {peak / 2**20:.0f} MiB at peak, over {max_bytes / 2**20:.0f} MiB"
    return result, error


# ----------------------------------------------------------------------------- tar pieces
def header(name: bytes = b"a.txt", size: int = 0, *, typeflag: bytes = b"0", size_field: bytes | None = None) -> bytes:
    """One ustar header block with a valid checksum; ``size_field`` writes the 12 size bytes verbatim."""
    h = bytearray(BLOCK)
    h[0 : len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = (size_field if size_field is not None else b"%011o\0" % size).ljust(12, b"\0")[:12]
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: bytes, data: bytes, *, typeflag: bytes = b"0", size_field: bytes | None = None) -> bytes:
    """Header + data + padding (the size field says ``len(data)`` unless ``size_field`` is given)."""
    return header(name, len(data), typeflag=typeflag, size_field=size_field) + pad(data)


def pax(records: bytes, *, typeflag: bytes = b"x") -> bytes:
    """A pax extended header member holding ``records`` verbatim."""
    return member(b"././@PaxHeader", records, typeflag=typeflag)


def record(key: bytes, value: bytes) -> bytes:
    """One well-formed pax record ``"<len> key=value\\n"``."""
    body = b" %s=%s\n" % (key, value)
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return b"%d%s" % (n, body)


GOOD = member(b"s0.txt", b"hello")
AFTER = member(b"s1.txt", b"world")


def tar(*pieces: bytes) -> bytes:
    """A good sample, the hostile pieces, another good sample, the end-of-archive blocks."""
    return GOOD + b"".join(pieces) + AFTER + END


# ----------------------------------------------------------------------------- zstd pieces
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_BLOCK = 128 * 1024


def _block(kind: int, size: int, last: bool) -> bytes:
    return (int(last) | kind << 1 | size << 3).to_bytes(3, "little")


def zstd_frame(raw: bytes = b"", *, rle_zeros: int = 0, content_size: int | None = None) -> bytes:
    """A zstd frame: ``raw`` in raw blocks, then ``rle_zeros`` zero bytes in RLE blocks (4 bytes per 128 KiB).

    ``content_size`` writes an 8-byte Frame_Content_Size (single segment) that may lie.
    """
    if content_size is None:
        head = ZSTD_MAGIC + bytes([0x00, 0x58])  # no content size, 8 MiB window
    else:
        head = ZSTD_MAGIC + bytes([0xE0]) + struct.pack("<Q", content_size)  # single segment, FCS 8 bytes
    blocks = []
    for i in range(0, len(raw), MAX_BLOCK):
        piece = raw[i : i + MAX_BLOCK]
        blocks.append((0, piece))
    left = rle_zeros
    while left:
        n = min(left, MAX_BLOCK)
        blocks.append((1, n))
        left -= n
    if not blocks:
        blocks.append((0, b""))
    out = [head]
    for j, (kind, body) in enumerate(blocks):
        last = j == len(blocks) - 1
        if kind == 0:
            out.append(_block(0, len(body), last) + body)  # type: ignore[arg-type]
        else:
            out.append(_block(1, body, last) + b"\0")  # type: ignore[arg-type]
    return b"".join(out)


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)


# ----------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One hostile shard: its bytes, its file suffix and the error a reader must raise.

    Attributes:
        sample: the bytes the hand-made index describes as the shard's one sample (the tar records
            of ``.tar``, the zstd frame(s) of ``.tar.zst``); the shard is ``sample + trailer``.
        max_sample_bytes: what the hand-made index declares as the largest decompressed sample.
    """

    name: str
    sample: bytes
    suffix: str = ".tar"
    error: type[StreamioError] = ShardFormatError
    trailer: bytes = END
    max_sample_bytes: int | None = None
    raw_ok: bool = False  # read or scanned without an index, a clean parse is right too (bounded all the same)

    @property
    def shard(self) -> bytes:
        return self.sample + self.trailer

    @property
    def path(self) -> str:
        return f"data-000000{self.suffix}"


def _t(name: str, *pieces: bytes) -> Case:
    return Case(name, GOOD + b"".join(pieces) + AFTER)


def tar_cases() -> list[Case]:
    """Headers, sizes and pax records that lie (classes 1-3 of issue 12 and their neighbours)."""
    big = b"x" * 3000
    return [
        # class 1: sizes that run backwards, or do not parse
        _t("size_negative_octal", header(b"a.bin", size_field=b"-0000003000\0"), big),  # back to s0.txt: a loop
        _t("size_negative_octal_one_block", header(b"a.bin", size_field=b"-0000001000\0"), big),
        _t("size_minus_one", header(b"a.bin", size_field=b"-1\0")),
        _t("size_negative_spaces", header(b"a.bin", size_field=b"    -0000010\0")),
        _t("size_plus_sign", header(b"a.bin", size_field=b"+0000000005\0"), pad(b"abcde")),
        _t("size_underscore", header(b"a.bin", size_field=b"0000_000005\0"), pad(b"abcde")),
        _t("size_garbage_octal", header(b"a.bin", size_field=b"0000000x000\0")),
        _t("size_eight_digit", header(b"a.bin", size_field=b"00000000089\0")),
        _t("size_base256_negative", header(b"a.bin", size_field=b"\xff" * 12)),
        _t("size_base256_huge", header(b"a.bin", size_field=b"\x80" + b"\xff" * 11)),
        _t("size_base256_bad_marker", header(b"a.bin", size_field=b"\x81" + bytes(10) + b"\x05")),
        _t("size_octal_past_the_end", header(b"a.bin", size_field=b"77777777777\0")),
        # class 1 through pax
        _t("pax_size_negative", pax(record(b"size", b"-5")), header(b"a.bin", 0)),
        _t("pax_size_minus_one", pax(record(b"size", b"-1")), header(b"a.bin", 0)),
        _t("pax_size_garbage", pax(record(b"size", b"abc")), header(b"a.bin", 0)),
        _t("pax_size_hex", pax(record(b"size", b"0x10")), header(b"a.bin", 0)),
        _t("pax_size_spaces", pax(record(b"size", b" 5")), header(b"a.bin", 0)),
        _t("pax_size_5000_digits", pax(record(b"size", b"9" * 5000)), header(b"a.bin", 0)),
        _t("pax_size_past_the_end", pax(record(b"size", b"99999999999999")), header(b"a.bin", 0)),
        # class 2: pax records that do not advance, or run past their data
        _t("pax_length_zero", pax(b"0 path=a.txt\n")),
        _t("pax_length_negative", pax(b"-20 path=a.txt\n")),
        _t("pax_length_shorter_than_its_header", pax(b"2 path=a.txt\n")),
        _t("pax_length_past_its_data", pax(b"99 path=a.txt\n"), header(b"b.txt", 0)),
        _t("pax_length_garbage", pax(b"1x path=a.txt\n")),
        _t("pax_length_plus_sign", pax(b"+14 path=a.txt\n"), header(b"b.txt", 0)),
        _t("pax_length_5000_digits", pax(b"9" * 5000 + b" path=a.txt\n")),
        _t("pax_no_space", pax(b"path=a.txt\n")),
        _t("pax_no_equals", pax(b"13 pathatxtx\n"), header(b"b.txt", 0)),
        _t("pax_no_newline", pax(b"14 path=a.txtx"), header(b"b.txt", 0)),
        _t("pax_header_negative_size", header(b"././@PaxHeader", typeflag=b"x", size_field=b"-0000000100\0")),
        _t("pax_header_over_limit", pax(record(b"comment", b"c" * (2 << 20))), header(b"b.txt", 0)),
        _t("pax_global_over_limit", pax(record(b"comment", b"c" * (2 << 20)), typeflag=b"g")),
        _t("pax_chain_over_limit", *[pax(record(b"c%d" % i, b"v" * 300_000)) for i in range(5)], header(b"b.txt", 0)),
        _t("pax_path_traversal", pax(record(b"path", b"../../etc/passwd.txt")), header(b"b.txt", 0)),
        # GNU long names
        _t("gnu_longname_over_limit", member(b"././@LongLink", b"n" * (2 << 20) + b".txt", typeflag=b"L"),
           header(b"b.txt", 0)),
        _t("gnu_longname_negative_size", header(b"././@LongLink", typeflag=b"L", size_field=b"-1\0")),
        _t("gnu_longlink_over_limit", member(b"././@LongLink", b"n" * (2 << 20), typeflag=b"K"), header(b"b.txt", 0)),
        # neighbours: headers that are not headers
        _t("checksum_garbage", header(b"a.txt")[:148] + b"zzzzzzz\0" + header(b"a.txt")[156:]),
        _t("not_a_tar", b"\x01" * BLOCK),
    ]


def zstd_cases() -> list[Case]:
    """Compressed shards that inflate past any bound or declare sizes they do not have (class 4)."""
    sample = header(b"s0.txt", 5) + pad(b"hello")
    bomb_member = zstd_frame(header(b"bomb.bin", 2 * GiB), rle_zeros=2 * GiB)
    many = b"".join(header(b"bomb.f%05d" % i, 1 << 20) + bytes(1 << 20) for i in range(24))
    return [
        # a ~64 KB frame holding a tar member that declares (and inflates to) 2 GiB
        Case("zstd_bomb_member", bomb_member, ".tar.zst", trailer=zstd(END), max_sample_bytes=4096),
        # a ~40 KB frame of 1.2 GB of zeros: no member at all, only inflation
        Case("zstd_bomb_zeros", zstd_frame(b"", rle_zeros=1200 << 20), ".tar.zst", trailer=zstd(END),
             max_sample_bytes=4096,
             raw_ok=True),  # an empty archive to a reader without an index: it must stop at the first zero block
        # one sample of 24 members of 1 MiB each: within any member limit, over the sample limit
        Case("zstd_bomb_sample", zstd(many), ".tar.zst", trailer=zstd(END), max_sample_bytes=4096),
        # a 21-byte frame declaring 64 GiB of content
        Case("zstd_declares_64gib", zstd_frame(b"", content_size=64 * GiB), ".tar.zst", trailer=zstd(END),
             max_sample_bytes=4096),
        Case("zstd_declares_64gib_with_data", zstd_frame(sample, content_size=64 * GiB), ".tar.zst", trailer=zstd(END),
             max_sample_bytes=4096),
        # neighbours
        Case("zstd_not_zstd", b"\x01" * 64, ".tar.zst", trailer=zstd(END), max_sample_bytes=4096),
        Case("zstd_truncated", zstd(sample)[:-3], ".tar.zst", trailer=b"", max_sample_bytes=4096),
        Case("zstd_reserved_block", ZSTD_MAGIC + bytes([0x00, 0x58]) + _block(3, 10, True) + bytes(10), ".tar.zst",
             trailer=zstd(END), max_sample_bytes=4096),
        Case("zstd_block_over_128k",
             ZSTD_MAGIC + bytes([0x00, 0x58]) + _block(0, MAX_BLOCK + 1, True) + bytes(MAX_BLOCK + 1),
             ".tar.zst", trailer=zstd(END), max_sample_bytes=MAX_BLOCK + 1),
        Case("zstd_hostile_tar_inside", zstd(GOOD + header(b"a.bin", size_field=b"-0000001000\0") + bytes(3000)),
             ".tar.zst", trailer=zstd(END), max_sample_bytes=8192),
    ]


def all_cases() -> list[Case]:
    return tar_cases() + zstd_cases()


def index_doc(case: Case) -> dict[str, Any]:
    """An ``index.json`` that describes ``case``'s shard as one sample with the right checksums."""
    entry: dict[str, Any] = {
        "path": case.path,
        "bytes": len(case.shard),
        "samples": 1,
        "checksum": format_checksum(crc32c(case.shard)),
        "offsets": [0, len(case.sample)],
        "crc32c": [crc32c(case.sample)],
    }
    if case.max_sample_bytes is not None:
        entry["max_sample_bytes"] = case.max_sample_bytes
    return {
        "format": "streamio.dataset/1",
        "samples": 1,
        "keys": ["txt"],
        "compression": "zstd" if case.suffix == ".tar.zst" else None,
        "shards": [entry],
    }


def write_case(store: Store, case: Case) -> None:
    """Store ``case``'s shard and an index describing it (so verified reads parse the hostile bytes)."""
    store.put(case.path, case.shard)
    store.put("index.json", json.dumps(index_doc(case)).encode())


# ----------------------------------------------------------------------------- index.json
@dataclass(frozen=True)
class IndexCase:
    """A hostile ``index.json`` (and sidecars) over one good shard; ``words`` must be in the error."""

    name: str
    doc: bytes
    words: str
    sidecars: dict[str, bytes] = field(default_factory=dict)
    error: type[StreamioError] = IndexFormatError


def good_index(shard: bytes, sample_end: int, path: str = "data-000000.tar") -> dict[str, Any]:
    """A valid index of a one-sample ``.tar`` shard whose sample ends at ``sample_end``."""
    return {
        "format": "streamio.dataset/1",
        "samples": 1,
        "keys": ["txt"],
        "compression": None,
        "shards": [{
            "path": path, "bytes": len(shard), "samples": 1, "checksum": format_checksum(crc32c(shard)),
            "offsets": [0, sample_end], "crc32c": [crc32c(shard[:sample_end])],
        }],
    }


GOOD_SHARD = GOOD + END


def _with(change: Any) -> bytes:
    doc = good_index(GOOD_SHARD, len(GOOD))
    change(doc)
    return json.dumps(doc).encode()


def _set(key: str, value: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        doc["shards"][0][key] = value
    return change


def index_cases() -> list[IndexCase]:
    """``index.json`` documents with hostile numbers, paths, nesting and sizes (classes 3-5)."""
    def sidecar(key: str, value: Any) -> Any:
        def change(doc: dict[str, Any]) -> None:
            entry = doc["shards"][0]
            del entry["offsets"], entry["crc32c"]
            entry["layout"], entry["layout_checksum"] = "_layout/x.bin", "crc32c:00000000"
            entry[key] = value
        return change

    cases = [
        IndexCase("bytes_negative", _with(_set("bytes", -1)), "'bytes'"),
        IndexCase("bytes_huge", _with(_set("bytes", 1 << 70)), "'bytes'"),
        IndexCase("bytes_float", _with(_set("bytes", 1e3)), "'bytes'"),
        IndexCase("bytes_bool", _with(_set("bytes", True)), "'bytes'"),
        IndexCase("samples_negative", _with(_set("samples", -3)), "'samples'"),
        IndexCase("samples_huge", _with(_set("samples", 1 << 64)), "'samples'"),
        IndexCase("offsets_negative", _with(_set("offsets", [-5, len(GOOD)])), "offsets"),
        IndexCase("offsets_decreasing", _with(_set("offsets", [len(GOOD), 0])), "offsets"),
        IndexCase("offsets_past_shard", _with(_set("offsets", [0, 1 << 40])), "offsets"),
        IndexCase("offsets_huge", _with(_set("offsets", [0, 1 << 80])), "offsets"),
        IndexCase("offsets_strings", _with(_set("offsets", ["0", "512"])), "offsets"),
        IndexCase("crc_negative", _with(_set("crc32c", [-1])), "crc32c"),
        IndexCase("max_sample_bytes_negative", _with(_set("max_sample_bytes", -1)), "max_sample_bytes"),
        IndexCase("max_sample_bytes_huge", _with(_set("max_sample_bytes", 1 << 66)), "max_sample_bytes"),
        IndexCase("total_samples_negative", _with(lambda d: d.update(samples=-1)), "'samples'"),
        IndexCase("not_json", b"{not json", "not valid JSON"),
        IndexCase("not_utf8", b'{"format": "\xff\xfe"}', "not valid JSON"),
        IndexCase("deeply_nested", b"[" * 100_000 + b"]" * 100_000, "nested"),
        IndexCase("nested_in_keys", _with(lambda d: d.update(keys=json.loads("[" * 500 + "]" * 500))), "nested"),
        IndexCase("int_5000_digits", b'{"format": "streamio.dataset/1", "samples": ' + b"9" * 5000 + b"}",
                  "not valid JSON"),
        IndexCase("duplicate_shard", _with(lambda d: d["shards"].append(dict(d["shards"][0])) or d.update(samples=2)),
                  "more than once"),
    ]
    for name, path in [
        ("path_dotdot", "../outside.tar"),
        ("path_dotdot_inner", "a/../../outside.tar"),
        ("path_absolute", "/etc/hostname"),
        ("path_scheme", "file:///etc/hostname"),
        ("path_scheme_s3", "s3://other-bucket/x.tar"),
        ("path_chained_url", "simplecache::s3://b/x.tar"),
        ("path_drive", "C:/x.tar"),
        ("path_backslash", "..\\..\\x.tar"),
        ("path_empty_segment", "a//x.tar"),
        ("path_dot_segment", "./x.tar"),
        ("path_empty", ""),
        ("path_nul", "x\0.tar"),
        ("path_not_a_string", 7),
        ("path_very_long", "a" * 5000 + ".tar"),
    ]:
        cases.append(IndexCase(name, _with(_set("path", path)), "path"))
    for name, key, value in [
        ("layout_dotdot", "layout", "../../etc/hostname"),
        ("layout_absolute", "layout", "/etc/hostname"),
        ("layout_scheme", "layout", "file:///etc/hostname"),
        ("layout_backslash", "layout", "_layout\\..\\x.bin"),
    ]:
        cases.append(IndexCase(name, _with(sidecar(key, value)), "layout"))
    return cases


def sidecar_cases() -> list[IndexCase]:
    """Indexes whose sidecar lies (read through ``DatasetIndex.layout``)."""
    def doc_for(blob: bytes) -> bytes:
        doc = good_index(GOOD_SHARD, len(GOOD))
        entry = doc["shards"][0]
        del entry["offsets"], entry["crc32c"]
        entry["layout"], entry["layout_checksum"] = "_layout/x.bin", format_checksum(crc32c(blob))
        return json.dumps(doc).encode()

    def blob(n: int, offsets: list[int], crcs: list[int]) -> bytes:
        head = b"STIOLAY1" + struct.pack("<Q", n)
        return head + struct.pack(f"<{len(offsets)}Q", *offsets) + struct.pack(f"<{len(crcs)}I", *crcs)

    cases = []
    for name, data, words, error in [
        ("sidecar_count_huge", blob(1 << 62, [0, len(GOOD)], [1]), "sidecar", IndexFormatError),
        ("sidecar_offsets_past_shard", blob(1, [0, 1 << 63], [1]), "offsets", IndexFormatError),
        ("sidecar_offsets_decreasing", blob(1, [len(GOOD), 0], [1]), "offsets", IndexFormatError),
        ("sidecar_garbage", b"\x00" * 36, "sidecar", IndexFormatError),  # the size one sample needs
        # only the bytes the index's sample count needs are read: the rest fails the recorded checksum
        ("sidecar_oversized", blob(1, [0, len(GOOD)], [1]) + bytes(4 << 20), "does not match its checksum",
         CorruptDataError),
        ("sidecar_truncated", blob(1, [0, len(GOOD)], [1])[:-5], "shorter than the caller", CorruptDataError),
    ]:
        cases.append(IndexCase(name, doc_for(data), words, sidecars={"_layout/x.bin": data}, error=error))
    return cases
