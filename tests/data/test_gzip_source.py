"""gzip'd tar shards (issue 23): every verb that meets one names gzip and says how to convert; `streamio
shard` converts them (decompressed as they stream, bounded); the dataset is never made of them."""

from __future__ import annotations

import gzip
import io
import json
import struct
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.cli.main import cli
from streamio.data.locate import open_dataset
from streamio.data.write.gzipstream import PIECE, decompress
from streamio.data.write.sources import samples_from_shards
from streamio.errors import IndexNotFoundError, ShardFormatError
from streamio.storage import Store


def run(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == code, (res.exit_code, res.output)
    return res.stdout if code == 0 else res.stderr


def tar_bytes(first: int, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(first, first + n):
            for ext, data in (("txt", f"sample {i}".encode()), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def gz(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a-0.tar.gz").write_bytes(gzip.compress(tar_bytes(0, 3)))
    (tmp_path / "in" / "a-1.tar.gz").write_bytes(gzip.compress(tar_bytes(3, 3)))
    (tmp_path / "in" / "b-0.tgz").write_bytes(gzip.compress(tar_bytes(6, 2)))
    (tmp_path / "misnamed").mkdir()
    (tmp_path / "misnamed" / "x-0.tar").write_bytes(gzip.compress(tar_bytes(0, 2)))
    return tmp_path


def test_every_verb_that_meets_gzip_shards_names_them_and_says_how_to_convert(gz: Path) -> None:
    prefix = f"{gz}/in"
    err = run("index", prefix, code=3)
    assert "no .tar or .tar.zst shards under" in err and "3 gzip'd ones" in err
    assert f"`streamio shard '{prefix}/*.tar.gz' DEST`" in err
    err = run("index", f"{prefix}/*.tar.gz", code=1)
    assert "2 of the 2 shards named are gzip'd" in err and "streamio shard" in err
    for verb in ("inspect", "ls", "verify"):
        err = run(verb, prefix, code=3)
        assert "3 gzip'd shards" in err and f"streamio shard '{prefix}/*.tar.gz'" in err, verb
        assert "streamio index" not in err, verb  # it would fail: not the advice to give
        err = run(verb, f"{prefix}/*.tgz", code=3)
        assert "names gzip'd shards" in err and f"`streamio shard '{prefix}/*.tgz' DEST`" in err, verb
    with pytest.raises(IndexNotFoundError, match="gzip'd shards"):  # what StreamingDataset(url) opens with
        open_dataset(prefix)
    err = run("index", f"{gz}/misnamed", code=1)  # gzip'd bytes under a .tar name
    assert "x-0.tar' is gzip-compressed, not a tar" in err and f"`streamio shard '{gz}/misnamed/x-0.tar' DEST`" in err


def test_shard_converts_gzip_shards_into_a_dataset(gz: Path) -> None:
    out = json.loads(run("shard", f"{gz}/in/*.tar.gz", str(gz / "ds"), "--json"))
    assert out["samples"] == 6 and out["keys"] == ["cls", "txt"]
    assert json.loads(run("shard", f"{gz}/in/b-0.tgz", str(gz / "one"), "--json"))["samples"] == 2
    assert json.loads(run("shard", f"{gz}/misnamed/*.tar", str(gz / "sniffed"), "--json"))["samples"] == 2
    run("verify", str(gz / "ds"))
    from streamio.data.write.sources import samples_from_shards
    from streamio.storage import Store

    back = list(samples_from_shards(Store(str(gz / "ds"))))
    assert [s["txt"] for s in back] == [f"sample {i}".encode() for i in range(6)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=4), st.integers(1, 5000))
def test_decompress_reads_concatenated_members_in_any_chunking(members: list[bytes], cut: int) -> None:
    stream = b"".join(gzip.compress(m) for m in members)
    chunks = [stream[i : i + cut] for i in range(0, len(stream), cut)]
    assert b"".join(decompress(chunks, url="x")) == b"".join(members)
    with pytest.raises(ShardFormatError, match="ends inside a gzip member"):
        list(decompress([stream[:-1]], url="x"))


def test_decompress_is_bounded_and_refuses_what_is_not_gzip() -> None:
    bomb = gzip.compress(bytes(64 << 20))  # 64 KB that inflate to 64 MiB: handed out 1 MiB at a time
    assert len(bomb) < 100_000 and max(len(p) for p in decompress([bomb], url="x")) <= PIECE
    with pytest.raises(ShardFormatError, match="'x' is not valid gzip data"):
        list(decompress([b"PK\x03\x04 a zip"], url="x"))


def _gz_cases() -> dict[str, bytes]:
    good = gzip.compress(tar_bytes(0, 3))
    crc, size = struct.unpack("<II", good[-8:])
    return {
        "no trailer": good[:-8],
        "half a trailer": good[:-3],
        "a wrong CRC32": good[:-8] + struct.pack("<II", crc ^ 1, size),
        "a wrong ISIZE": good[:-8] + struct.pack("<II", crc, size + 512),
        "a second member cut short": good + gzip.compress(bytes(512))[:-8],
    }


@pytest.mark.parametrize("case", list(_gz_cases()))
def test_a_gzip_shard_without_a_whole_trailer_is_refused_not_taken_whole(tmp_path: Path, case: str) -> None:
    """The tar reader stops at the end-of-archive blocks, before the gzip trailer (CRC32, ISIZE):
    on 15d7008 a shard cut there, or with a wrong trailer after its padding, was taken whole."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a-0.tar.gz").write_bytes(_gz_cases()[case])
    with pytest.raises(ShardFormatError, match=r"a-0\.tar\.gz' (ends inside a gzip member|is not valid gzip data)"):
        list(samples_from_shards(Store(str(tmp_path / "in")), "*.tar.gz"))
    res = CliRunner().invoke(cli, ["shard", f"{tmp_path}/in/*.tar.gz", str(tmp_path / "ds")])
    assert res.exit_code != 0 and "a-0.tar.gz" in res.stderr, res.output
    assert not (tmp_path / "ds" / "index.json").exists(), "a dataset was published from a damaged shard"


def test_gzip_data_after_the_archive_is_bounded(tmp_path: Path) -> None:
    """What follows the end-of-archive is read for the trailer, up to max_sample_bytes, never without end."""
    (tmp_path / "a-0.tar.gz").write_bytes(gzip.compress(tar_bytes(0, 2) + bytes(3 << 20)))
    (tmp_path / "b-0.tar.gz").write_bytes(gzip.compress(tar_bytes(0, 2) + bytes(10240)))
    with pytest.raises(ShardFormatError, match=r"a-0.tar.gz' holds more than 1048576 bytes of gzip data after its"):
        list(samples_from_shards(Store(str(tmp_path)), "a-0.tar.gz", max_sample_bytes=1 << 20))
    got = list(samples_from_shards(Store(str(tmp_path)), "b-0.tar.gz", max_sample_bytes=1 << 20))
    assert [s["__key__"] for s in got] == ["0000", "0001"]
