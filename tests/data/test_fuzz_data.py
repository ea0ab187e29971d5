"""Property-based fuzzing of every parser of dataset bytes (issue 12): the tar / pax / GNU reader,
zstd shards, ``index.json`` and layout sidecars.

Valid inputs (written by streamio, by ``tarfile`` in its three dialects) are mutated: bit flips,
truncation, overwritten bytes, rewritten header fields (negative, huge, garbage and base-256
sizes; other type flags), inserted pax headers with lying records, zstd frames with lying
headers and blocks, JSON fields replaced by hostile numbers, paths and nesting. Whatever comes
out, each parser must either parse it or raise a streamio error, within a time budget and a
memory budget (tracemalloc): never loop, never allocate what a header claims, never a bare
``ValueError`` / ``MemoryError`` / ``RecursionError``.
"""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checksum import crc32c, format_checksum
from streamio.data.format.index import decode_layout, encode_layout, load_index, parse_index
from streamio.data.format.index_schema import MAX_INT
from streamio.data.format.layout import SampleLayout
from streamio.data.format.samples import iter_samples
from streamio.data.format.tar import iter_members
from streamio.data.format.tarfields import member_size, octal, pax_records
from streamio.data.write.indexer import scan_chunks
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import IndexFormatError, StreamioError
from streamio.storage import Store
from support import hostile_corpus as hc

LIMIT = 1 << 20  # max_sample_bytes while fuzzing: inputs are tens of KB
TIME_BUDGET = 3.0
MEMORY_BUDGET = 24 << 20
pytestmark = pytest.mark.timeout(120)


def bounded(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None when it raised a streamio error; anything else, too slow or too big fails."""
    result, error = hc.within(fn, seconds=TIME_BUDGET, max_bytes=MEMORY_BUDGET)
    if error is not None and not isinstance(error, StreamioError):
        raise error
    return result


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


# --------------------------------------------------------------------------- valid inputs
def _tarfile(fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in [("d" * 90 + "/" + "e" * 30 + "/k1.jpg", b"a" * 700), ("d/k1.cls", b"1"), ("k2.txt", b""),
                           ("ünï/kö.txt", b"unicode" * 50)]:
            if fmt == tarfile.USTAR_FORMAT and not name.isascii():
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _streamio(compression: str | None) -> tuple[bytes, SampleLayout]:
    store = Store(f"memory://fuzz-{uuid.uuid4().hex}")
    samples = [{"__key__": f"k{i}", "txt": f"sample {i}", "bin": bytes([i]) * (300 * i), "n" * 120: b"long name"}
               for i in range(4)]
    index = write_dataset(samples, store, spec=ShardSpec(compression=compression))
    return store.read(index.shards[0].path), index.layout(0, store)


TAR_BASES = [_tarfile(f) for f in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)] + [_streamio(None)[0]]
ZSTD_BASE, ZSTD_LAYOUT = _streamio("zstd")


def header_offsets(data: bytes) -> list[int]:
    """Offsets of the headers of a valid tar."""
    out, pos = [], 0
    while pos + 512 <= len(data) and data[pos : pos + 512] != bytes(512):
        out.append(pos)
        pos += 512 + -(-(octal(data[pos + 124 : pos + 136]) or 0) // 512) * 512
    return out


def fix_checksum(data: bytearray, at: int) -> None:
    block = data[at : at + 512]
    block[148:156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(block)


# --------------------------------------------------------------------------- mutations
SIZE_FIELDS = st.one_of(
    st.integers(-(8**11), 8**11).map(lambda n: (b"%o" % n if n >= 0 else b"-%o" % -n).rjust(11, b"0") + b"\0"),
    st.integers(1, 12).map(lambda k: b"-%o\0" % (512 * k)),  # back onto an earlier header: a loop
    st.sampled_from([b"-1\0", b"+0000000005\0", b"0000_000005\0", b"0000000x000\0", b"00000000089\0", b"   -10  \0",
                     b"\xff" * 12, b"\x80" + b"\xff" * 11, b"\x80" + bytes(10) + b"\x05", b"\x81" + bytes(11), b""]),
    st.binary(min_size=12, max_size=12),
)
PAX_NUMBERS = st.one_of(
    st.integers(-(10**20), 10**20).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"abc", b"0x10", b" 5", b"+5", b"5_0", b"9" * 5000, b"\xd9\xa1"]),
)


@st.composite
def pax_data(draw: st.DrawFn) -> bytes:
    """Pax header data: well-formed records with hostile values, or records whose length lies."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([b"size", b"path", b"comment", b"mtime"]))
        value = draw(PAX_NUMBERS) if key in (b"size", b"mtime") else draw(st.sampled_from(
            [b"a.txt", b"../../x.txt", b"/abs.txt", b"n" * 300, b"x\0y.txt", b"k1.jpg"]))
        rec = hc.record(key, value)
        length = draw(st.sampled_from(["right", "zero", "negative", "short", "long", "garbage"]))
        body = rec.split(b" ", 1)[1]
        n = len(rec)
        rec = {"right": rec, "zero": b"0 " + body, "negative": b"-%d %s" % (n, body), "short": b"2 " + body,
               "long": b"%d %s" % (n + 1000, body), "garbage": b"1x " + body}[length]
        out += rec
    return out


@st.composite
def mutated_tar(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(TAR_BASES)))
    heads = header_offsets(bytes(data))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "truncate", "size", "typeflag", "pax", "overwrite"]))
        h = draw(st.sampled_from(heads)) if heads else 0
        if op == "flip" and data:
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif op == "size" and h + 512 <= len(data):
            data[h + 124 : h + 136] = draw(SIZE_FIELDS).ljust(12, b"\0")[:12]
            fix_checksum(data, h)  # a bad checksum would stop the parser before the field is read
        elif op == "typeflag" and h + 512 <= len(data):
            data[h + 156] = draw(st.sampled_from(b"0125xgLK7SV\0"))
            fix_checksum(data, h)
        elif op == "pax" and h <= len(data):
            data[h:h] = hc.pax(draw(pax_data()), typeflag=draw(st.sampled_from([b"x", b"g"])))
        elif op == "overwrite" and data:
            pos = draw(st.integers(0, len(data) - 1))
            data[pos : pos + 16] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


def at_most(items: Iterable[Any], data: bytes) -> list[Any]:
    """The first items, up to one more than a tar of ``data``'s size can hold (a 512-byte header each)."""
    return list(islice(items, len(data) // 512 + 1))


def _check_samples(got: list[dict[str, Any]] | None, tar_bytes: int) -> None:
    """Parsed samples are plain and no more than a tar of ``tar_bytes`` can hold (a reader that went back repeats)."""
    assert got is None or len(got) <= tar_bytes // 512, "more samples than the bytes can hold: the reader went back"
    for sample in got or []:
        assert isinstance(sample["__key__"], str)
        assert all(isinstance(v, bytes) for k, v in sample.items() if k != "__key__")


@settings(max_examples=300, deadline=None)
@given(data=mutated_tar(), chunk=st.integers(1, 5000))
def test_fuzz_tar_reader(data: bytes, chunk: int) -> None:
    url = "mem://fuzz/data-000000.tar"
    members = bounded(lambda: at_most(iter_members(pieces(data, chunk), url=url, max_sample_bytes=LIMIT), data))
    if members is not None:
        offsets = [m[0] for m in members]
        assert offsets == sorted(set(offsets)) and all(0 <= o < len(data) for o in offsets), offsets
    got = bounded(lambda: at_most(iter_samples(pieces(data, chunk), url=url, max_sample_bytes=LIMIT), data))
    _check_samples(got, len(data))
    scanned = bounded(lambda: scan_chunks(pieces(data, chunk), url=url, path="data-000000.tar", max_sample_bytes=LIMIT))
    if scanned is not None:
        info, layout, _, _ = scanned
        assert info.bytes == len(data) and layout.offsets[-1] <= len(data)
        assert all(b > a for a, b in zip(layout.offsets, layout.offsets[1:], strict=False))
    if data:  # everything as one sample, with a checksum that matches: the verified path parses it
        whole = SampleLayout((0, len(data)), (crc32c(data),))
        got = bounded(lambda: at_most(iter_samples(pieces(data, chunk), url=url, layout=whole), data))
        _check_samples(got, len(data))


@settings(max_examples=300, deadline=None)
@given(field=st.one_of(SIZE_FIELDS, st.binary(min_size=12, max_size=12)))
def test_fuzz_size_field(field: bytes) -> None:
    """A size is a non-negative number or an error, never a step backwards; plain octal reads as tarfile reads it."""
    block = hc.header(b"a.txt", size_field=field)
    size = bounded(lambda: member_size(block, url="mem://s.tar", at=0))
    assert size is None or size >= 0
    text = field.ljust(12, b"\0")[:12].split(b"\0", 1)[0].strip(b" ")
    if field[:1] < b"\x80" and text and all(48 <= c <= 55 for c in text):
        assert size == int(text, 8)


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(pax_data(), st.binary(max_size=200), st.lists(st.tuples(
    st.binary(min_size=1, max_size=8).filter(lambda k: b"=" not in k), st.binary(max_size=20)), max_size=4).map(
    lambda recs: b"".join(hc.record(k, v) for k, v in recs))))
def test_fuzz_pax_records(data: bytes) -> None:
    """Records parse exactly (each one found verbatim in the data) or not at all."""
    records = bounded(lambda: pax_records(data, url="mem://s.tar", at=0))
    for key, value in (records or {}).items():
        raw = b" %s=%s\n" % (key.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
        assert raw in data, (key, value)


# --------------------------------------------------------------------------- zstd
@st.composite
def hostile_frame(draw: st.DrawFn) -> bytes:
    """A zstd frame built from raw / RLE block headers, with a content size that may lie."""
    head = draw(st.sampled_from([
        hc.ZSTD_MAGIC + bytes([0x00, 0x58]),  # no content size, 8 MiB window
        hc.ZSTD_MAGIC + bytes([0xE0]),  # single segment, 8-byte content size follows
        hc.ZSTD_MAGIC + bytes([0x04, 0x58]),  # with a checksum
        hc.ZSTD_MAGIC + bytes([0x08, 0x58]),  # a reserved bit
        b"\x50\x2a\x4d\x18",  # a skippable frame
    ]))
    if head[-1] == 0xE0:
        head += draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little")
    if head == b"\x50\x2a\x4d\x18":
        return head + draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little") + draw(st.binary(max_size=64))
    out = head
    blocks = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, (1 << 21) - 1)), min_size=1, max_size=40))
    for i, (kind, size) in enumerate(blocks):
        last = i == len(blocks) - 1 or draw(st.booleans()) and i > 30
        out += (int(last) | kind << 1 | size << 3).to_bytes(3, "little")
        out += b"\0" if kind == 1 else draw(st.binary(min_size=0, max_size=min(size, 64)))
    return out


@st.composite
def mutated_zstd(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["mutate", "wrap", "frames"]))
    if kind == "wrap":  # a hostile tar inside well-formed frames
        return hc.zstd(draw(mutated_tar()))
    if kind == "frames":
        return b"".join(draw(st.lists(hostile_frame(), min_size=1, max_size=3))) + hc.zstd(hc.END)
    data = bytearray(ZSTD_BASE)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "truncate", "overwrite", "insert"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "overwrite":
            data[pos : pos + 8] = draw(st.binary(min_size=1, max_size=8))
        elif op == "insert":
            data[pos:pos] = draw(hostile_frame())
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(data=mutated_zstd(), chunk=st.integers(1, 5000))
def test_fuzz_zstd_reader(data: bytes, chunk: int) -> None:
    url = "mem://fuzz/data-000000.tar.zst"
    raw = bounded(lambda: list(iter_samples(pieces(data, chunk), url=url, compression="zstd", max_sample_bytes=LIMIT)))
    _check_samples(raw, LIMIT * 64)  # compressed: the tar may be larger than the bytes
    bounded(lambda: scan_chunks(pieces(data, chunk), url=url, path="data-000000.tar.zst", max_sample_bytes=LIMIT))
    if data:
        whole = SampleLayout((0, len(data)), (crc32c(data),), 64 << 10)  # the index declares 64 KiB
        got = bounded(lambda: list(iter_samples(pieces(data, chunk), url=url, layout=whole, compression="zstd")))
        _check_samples(got, 64 << 10)
    if len(data) == len(ZSTD_BASE):  # same length: the real layout, checksums recomputed over the mutated bytes
        offs = ZSTD_LAYOUT.offsets
        crcs = tuple(crc32c(data[a:b]) for a, b in zip(offs, offs[1:], strict=False))
        layout = SampleLayout(offs, crcs, ZSTD_LAYOUT.max_sample_bytes)
        got = bounded(lambda: list(iter_samples(pieces(data, chunk), url=url, layout=layout, compression="zstd")))
        _check_samples(got, len(offs) * 512)


# --------------------------------------------------------------------------- index.json and sidecars
def _base_index() -> dict[str, Any]:
    store = Store(f"memory://fuzz-ix-{uuid.uuid4().hex}")
    samples = [{"__key__": f"k{i}", "txt": f"t{i}"} for i in range(6)]
    write_dataset(samples, store, spec=ShardSpec(max_count=3, compression="zstd"))
    return json.loads(store.read("index.json"))


BASE_INDEX = _base_index()
HOSTILE_VALUES = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([-1, 0, 2**63, 2**63 - 1, 2**64]), st.floats(allow_nan=True),
    st.booleans(), st.none(), st.text(max_size=20),
    st.sampled_from(["../x.tar", "/etc/hostname", "file:///etc/hostname", "s3://b/x", "a::b", "C:\\x", "a//b.tar",
                     "./x.tar", "", "x\0.tar", "\x01.tar", "a" * 2000, "crc32c:zzzzzzzz", "streamio.dataset/2"]),
    st.lists(st.integers(-5, 5000), max_size=8), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(1, 300).map(lambda n: json.loads("[" * n + "]" * n)),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:4]):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_index(draw: st.DrawFn) -> bytes:
    doc = json.loads(json.dumps(BASE_INDEX))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)[1:]))
        node = doc
        for step in path[:-1]:
            node = node[step]
        if draw(st.booleans()) and isinstance(node, dict):
            node.pop(path[-1], None)
        else:
            node[path[-1]] = draw(HOSTILE_VALUES)
    text = bytearray(json.dumps(doc).encode())
    if draw(st.integers(0, 4)) == 0 and text:  # and sometimes the bytes themselves
        pos = draw(st.integers(0, len(text) - 1))
        if draw(st.booleans()):
            text[pos] ^= 1 << draw(st.integers(0, 7))
        else:
            del text[pos:]
    return bytes(text)


def confined(path: str) -> bool:
    """A path that stays below its root on every backend (an independent statement of the rule)."""
    segments = path.split("/")
    return (
        0 < len(path) <= 1024 and not path.startswith("/") and "\\" not in path and ":" not in segments[0]
        and "::" not in path and all(s not in ("", ".", "..") for s in segments)
        and all(c >= " " and c != "\x7f" for c in path)
    )


@settings(max_examples=400, deadline=None)
@given(data=mutated_index())
def test_fuzz_index_loader(data: bytes) -> None:
    url = "memory://fuzz/ds/index.json"
    index = bounded(lambda: parse_index(data, url=url))
    if index is None:
        return
    assert sum(s.samples for s in index.shards) == index.samples
    assert len({s.path for s in index.shards}) == len(index.shards)
    store = Store(f"memory://fuzz-none-{uuid.uuid4().hex}")
    for i, shard in enumerate(index.shards):
        assert confined(shard.path), shard.path
        assert 0 <= shard.samples <= shard.bytes <= MAX_INT
        layout = bounded(lambda i=i: index.layout(i, store))
        if layout is not None:
            offs = layout.offsets
            assert len(offs) == shard.samples + 1
            assert all(0 <= a < b <= shard.bytes for a, b in zip(offs, offs[1:], strict=False))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fuzz_layout_sidecar(data: st.DataObject) -> None:
    offsets = data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6))
    blob = bytearray(encode_layout(SampleLayout(tuple(offsets), tuple(range(len(offsets) - 1)))))
    for _ in range(data.draw(st.integers(0, 3))):
        pos = data.draw(st.integers(0, len(blob)))
        op = data.draw(st.sampled_from(["flip", "truncate", "count"]))
        if op == "flip" and pos < len(blob):
            blob[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "truncate":
            del blob[pos:]
        else:
            blob[8:16] = data.draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little")
    bounded(lambda: decode_layout(bytes(blob), url="memory://fuzz/_layout/x.bin"))
    # through the index: the sidecar's checksum matches, its content lies
    samples = data.draw(st.integers(0, 5))
    shard_bytes = data.draw(st.integers(samples, 10**6))
    store = Store(f"memory://fuzz-sc-{uuid.uuid4().hex}")
    store.put("_layout/x.bin", bytes(blob))
    doc = {"format": "streamio.dataset/1", "samples": samples, "keys": [], "compression": None, "shards": [
        {"path": "x.tar", "bytes": shard_bytes, "samples": samples, "checksum": "crc32c:00000000",
         "layout": "_layout/x.bin", "layout_checksum": format_checksum(crc32c(bytes(blob)))}]}
    store.put("index.json", json.dumps(doc).encode())

    def load() -> Any:
        index = load_index(store)
        return index.layout(0, store)

    layout = bounded(load)
    if layout is not None:
        assert len(layout.offsets) == samples + 1 and (not samples or layout.offsets[-1] <= shard_bytes)


def test_index_errors_are_index_format_errors() -> None:
    """The loader's errors for bad documents are IndexFormatError (not some other streamio error)."""
    for bad in (b"", b"[]", b"{", b"[" * 10_000, json.dumps({**BASE_INDEX, "samples": -1}).encode()):
        with pytest.raises(IndexFormatError):
            parse_index(bad, url="memory://x/index.json")
