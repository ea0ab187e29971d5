"""samples.py: the tar / tar.zst reader — round trips, foreign tar dialects, every bad input."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.data.format.index import load_index
from streamio.data.format.layout import SampleLayout, split_name
from streamio.data.format.samples import SampleSpan, iter_samples
from streamio.data.format.tar import encode_sample, iter_members
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import CorruptDataError, ShardFormatError
from streamio.storage import Store

URL = "mem://shard.tar"

# --------------------------------------------------------------------------- strategies
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/.\0")
_name_part = st.text(_chars, min_size=1, max_size=10)
_dir_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0")
_dir_part = st.text(_dir_chars, min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
keys = st.builds(lambda d, b: f"{d}/{b}" if d else b, st.one_of(st.none(), _dir_part), _name_part)
exts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1, max_size=12).filter(
    lambda e: not e.startswith("__")
)
values = st.one_of(
    st.binary(max_size=600),
    st.just(b""),
    st.integers(0, 300_000).map(lambda n: bytes([n % 251]) * n),  # large members, cheap to generate
)
samples_st = st.lists(
    st.builds(lambda k, fields: {"__key__": k, **fields}, keys, st.dictionaries(exts, values, min_size=1, max_size=6)),
    min_size=1,
    max_size=12,
    unique_by=lambda s: s["__key__"],
)


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def read_shards(store: Store, *, chunk: int, verified: bool) -> list[dict]:
    index = load_index(store)
    out: list[dict] = []
    for i, shard in enumerate(index.shards):
        data = store.read(shard.path)
        out += iter_samples(
            chunked(data, chunk),
            url=store.url(shard.path),
            layout=index.layout(i, store) if verified else None,
            compression=shard.compression,
        )
    return out


# --------------------------------------------------------------------------- round trips
@settings(max_examples=60)
@given(
    samples=samples_st,
    compression=st.sampled_from([None, "zstd"]),
    max_count=st.integers(1, 5),
    chunk=st.integers(1, 70_000),
)
def test_round_trip_property(samples: list[dict], compression: str | None, max_count: int, chunk: int) -> None:
    store = Store(f"memory://rt-{uuid.uuid4().hex}")
    index = write_dataset(samples, store, spec=ShardSpec(max_count=max_count, compression=compression))
    assert index.samples == len(samples)
    assert read_shards(store, chunk=chunk, verified=True) == samples
    assert read_shards(store, chunk=chunk, verified=False) == samples


@settings(max_examples=25)
@given(samples=samples_st, compression=st.sampled_from([None, "zstd"]), data=st.data())
def test_start_at_any_sample_reads_the_rest(samples: list[dict], compression: str | None, data: st.DataObject) -> None:
    store = Store(f"memory://k-{uuid.uuid4().hex}")
    write_dataset(samples, store, spec=ShardSpec(compression=compression))
    index = load_index(store)
    layout = index.layout(0, store)
    shard = index.shards[0]
    k = data.draw(st.integers(0, shard.samples))
    raw = store.read(shard.path, layout.offsets[k], shard.bytes)
    got = list(
        iter_samples(
            [raw], url=URL, span=SampleSpan(layout.offsets[k], k), layout=layout, compression=compression
        )
    )
    assert got == samples[k:]
    n = data.draw(st.integers(0, shard.samples - k))
    part = store.read(shard.path, *layout.byte_range(k, k + n))
    got = list(iter_samples([part], url=URL, span=SampleSpan(layout.offsets[k], k, n), layout=layout,
                            compression=compression))
    assert got == samples[k : k + n]


def test_zstd_shard_is_one_valid_zstd_stream_of_one_valid_tar(tmp_path) -> None:
    samples = [{"__key__": f"s{i}", "txt": f"sample {i}", "bin": bytes(i * 100)} for i in range(5)]
    write_dataset(samples, str(tmp_path), spec=ShardSpec(compression="zstd"))
    raw = (tmp_path / "data-000000.tar.zst").read_bytes()
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True)
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        names = [m.name for m in tar]
    assert names == [f"s{i}.{e}" for i in range(5) for e in ("bin", "txt")]
    if shutil.which("zstd") and shutil.which("tar"):
        out = subprocess.run(
            f"zstd -dc {tmp_path / 'data-000000.tar.zst'} | tar tf -",
            shell=True,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == names
        assert out.stderr == ""


def test_plain_tar_is_read_by_tarfile_with_fixed_headers(tmp_path) -> None:
    write_dataset([{"__key__": "ü/é", "jpg": b"x" * 1000, "n" * 120: b"long"}], str(tmp_path))
    with tarfile.open(tmp_path / "data-000000.tar") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["ü/é.jpg", "ü/é." + "n" * 120]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
        assert tar.extractfile(members[0]).read() == b"x" * 1000  # type: ignore[union-attr]


# --------------------------------------------------------------------------- foreign dialects
def _tarfile_bytes(members: list[tuple[str, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_reads_tarfile_dialects_long_and_unicode_names(fmt: int) -> None:
    long_dir = "d" * 90 + "/" + "e" * 60  # > 100 bytes: ustar prefix, GNU longname or pax path
    members = [(f"{long_dir}/k1.jpg", b"a" * 700), (f"{long_dir}/k1.cls", b"1"), ("k2.txt", b"")]
    if fmt != tarfile.USTAR_FORMAT:
        members.append(("ünï/kö.tëxt", b"unicode"))
    got = list(iter_samples(chunked(_tarfile_bytes(members, fmt), 333), url=URL))
    assert got[0] == {"__key__": f"{long_dir}/k1", "jpg": b"a" * 700, "cls": b"1"}
    assert got[1] == {"__key__": "k2", "txt": b""}
    if fmt != tarfile.USTAR_FORMAT:
        assert got[2] == {"__key__": "ünï/kö", "tëxt": b"unicode"}


def test_directories_and_dot_slash_prefixes_are_handled() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        d = tarfile.TarInfo("./a")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        info = tarfile.TarInfo("./a/x.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    assert list(iter_samples([buf.getvalue()], url=URL)) == [{"__key__": "a/x", "txt": b"hi"}]


def test_split_name_matches_webdataset() -> None:
    from webdataset.tariterators import base_plus_ext

    for name in ["a.b", "d.x/k.seg.png", "k", "dir/.hidden", "a.", "x/y", "ü.é.è"]:
        ours = split_name(name)
        theirs = base_plus_ext(name)
        assert (ours or (None, None)) == theirs or (theirs[1] == "" and ours is None), name


# --------------------------------------------------------------------------- bad input
def _one_member_tar(name: str, data: bytes = b"x", typeflag: bytes = tarfile.REGTYPE) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.type = typeflag
        if typeflag in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        elif typeflag in (tarfile.CHRTYPE, tarfile.FIFOTYPE):
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        ok = tarfile.TarInfo("ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "typeflag", "words"),
    [
        ("../x.txt", tarfile.REGTYPE, "'..' component"),
        ("a/../../x.txt", tarfile.REGTYPE, "'..' component"),
        ("/etc/x.txt", tarfile.REGTYPE, "absolute path"),
        ("link.txt", tarfile.SYMTYPE, "symbolic link"),
        ("hard.txt", tarfile.LNKTYPE, "hard link"),
        ("dev.txt", tarfile.CHRTYPE, "character device"),
        ("fifo.txt", tarfile.FIFOTYPE, "FIFO"),
    ],
)
def test_unsafe_members_are_refused_unless_a_handler_skips_them(name: str, typeflag: bytes, words: str) -> None:
    data = _one_member_tar(name, typeflag=typeflag)
    with pytest.raises(ShardFormatError) as err:
        list(iter_samples([data], url=URL))
    msg = str(err.value)
    assert URL in msg and repr(name) in msg and words in msg and "at byte 0" in msg
    seen: list[Exception] = []
    got = list(iter_samples([data], url=URL, handler=lambda e: seen.append(e) or True))
    assert got == [{"__key__": "ok", "txt": b"ok"}]
    assert len(seen) == 1 and isinstance(seen[0], ShardFormatError)


def test_member_without_extension_is_an_error_not_a_silent_drop() -> None:
    data = _one_member_tar("README")
    with pytest.raises(ShardFormatError, match="'README' at byte 0 has no extension"):
        list(iter_samples([data], url=URL))
    assert list(iter_samples([data], url=URL, handler=lambda e: True)) == [{"__key__": "ok", "txt": b"ok"}]


def _shard() -> tuple[bytes, SampleLayout]:
    store = Store(f"memory://t-{uuid.uuid4().hex}")
    write_dataset([{"__key__": f"k{i}", "bin": bytes([i]) * 1500, "txt": b"t"} for i in range(4)], store)
    index = load_index(store)
    return store.read(index.shards[0].path), index.layout(0, store)


def test_truncated_at_a_header_boundary_is_caught() -> None:
    data, layout = _shard()
    cut = data[: layout.offsets[2]]  # tarfile stops silently here; we must not
    assert len(cut) % 512 == 0
    with pytest.raises(
        ShardFormatError, match=r"ends at byte 6144 after member 'k1.txt', without the end-of-archive block"
    ):
        list(iter_samples(chunked(cut, 1000), url=URL))
    with pytest.raises(ShardFormatError, match=r"ends at byte 6144, inside sample 2"):
        list(iter_samples([cut], url=URL, layout=layout))


@pytest.mark.parametrize("cut", [100, 700, 3000])
def test_truncated_inside_a_header_or_member_names_offset_and_member(cut: int) -> None:
    data, _ = _shard()
    with pytest.raises(ShardFormatError) as err:
        list(iter_samples([data[:cut]], url=URL))
    msg = str(err.value)
    assert f"ends at byte {cut}" in msg and URL in msg and "truncated" in msg
    if cut == 700:
        assert "inside member 'k0.bin'" in msg


def test_non_tar_bytes_are_refused() -> None:
    with pytest.raises(ShardFormatError, match=r"offset 0 are not a valid tar header .* not a tar file"):
        list(iter_samples([b"%PDF-1.7 " + bytes(1000)], url=URL))
    with pytest.raises(ShardFormatError, match="bytes at byte 0 are not a zstd frame"):
        list(iter_samples([b"not zstd at all" * 10], url=URL, compression="zstd"))


def test_a_structural_error_ends_the_shard_when_the_handler_says_continue() -> None:
    data, layout = _shard()
    seen: list[Exception] = []
    got = list(iter_samples([data[: layout.offsets[2] + 100]], url=URL, handler=lambda e: seen.append(e) or True))
    # k1's members were all read, but nothing proves k1 was complete: it is dropped, not yielded partial
    assert [s["__key__"] for s in got] == ["k0"] and len(seen) == 1


def test_flipped_byte_fails_the_sample_crc_before_anything_is_yielded() -> None:
    data, layout = _shard()
    bad = bytearray(data)
    bad[layout.offsets[1] + 600] ^= 0x01  # inside sample 1's data: the tar structure is intact
    got: list[dict] = []
    with pytest.raises(CorruptDataError) as err:
        for sample in iter_samples([bytes(bad)], url=URL, layout=layout):
            got.append(sample)
    assert [s["__key__"] for s in got] == ["k0"]
    assert f"sample 1 (bytes {layout.offsets[1]}..{layout.offsets[2]})" in str(err.value) and URL in str(err.value)
    skipped = list(iter_samples([bytes(bad)], url=URL, layout=layout, handler=lambda e: True))
    assert [s["__key__"] for s in skipped] == ["k0", "k2", "k3"]


def test_start_offset_must_match_the_layout() -> None:
    data, layout = _shard()
    with pytest.raises(ValueError, match="sample 1 starts at byte"):
        list(iter_samples([data], url=URL, span=SampleSpan(0, 1), layout=layout))


def test_iter_members_reports_the_header_offset_of_pax_members() -> None:
    pieces = encode_sample([("é" * 80 + ".txt", b"abc"), ("k.bin", b"")])
    data = b"".join(pieces) + bytes(1024)
    got = list(iter_members([data], url=URL))
    assert [(off, name) for off, name, _ in got] == [(0, "é" * 80 + ".txt"), (2048, "k.bin")]


def test_memoryview_and_reused_bytearray_chunks() -> None:
    import mmap
    import tempfile

    data, layout = _shard()
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            got = list(iter_samples([view[:5000], view[5000:]], url=URL, layout=layout))
            del view
    assert [s["__key__"] for s in got] == ["k0", "k1", "k2", "k3"] and all(type(s["bin"]) is bytes for s in got)

    def refilled() -> Iterator[bytearray]:  # a producer that reuses one buffer (readinto style)
        buf = bytearray(1000)
        for i in range(0, len(data), 1000):
            piece = data[i : i + 1000]
            buf[: len(piece)] = piece
            yield buf if len(piece) == 1000 else bytearray(piece)

    assert list(iter_samples(refilled(), url=URL, layout=layout)) == got
