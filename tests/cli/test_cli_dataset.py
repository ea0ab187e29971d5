"""The dataset verbs end to end through click: shard, index, ls, inspect, verify (local and S3)."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import tarfile

import pytest
from click.testing import CliRunner

from streamio.cli.common import parse_size
from streamio.cli.main import cli
from streamio.data.format.index import load_index
from streamio.data.format.layout import INDEX_NAME
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import StoragePermissionError
from streamio.storage import Store
from streamio.testing import S3Endpoint


def run(*args: str, code: int = 0, env: dict[str, str] | None = None) -> tuple[str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    return result.stdout, result.stderr


def make_tree(root) -> None:  # type: ignore[no-untyped-def]
    for i in range(7):
        (root / f"cls{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"cls{i % 2}" / f"{i:03d}.jpg").write_bytes(bytes([i]) * 4000)
        (root / f"cls{i % 2}" / f"{i:03d}.cls").write_bytes(str(i % 2).encode())


def test_shard_a_directory_then_ls_inspect_verify(tmp_path) -> None:
    make_tree(tmp_path / "src")
    dest = str(tmp_path / "ds")
    out, _ = run("shard", str(tmp_path / "src"), dest, "--max-count", "3", "--compress", "zstd")
    assert "3 shards, 7 samples" in out
    listing = json.loads(run("ls", dest, "--json")[0])
    assert [(s["path"], s["samples"], s["compression"]) for s in listing] == [
        ("data-000000.tar.zst", 3, "zstd"), ("data-000001.tar.zst", 3, "zstd"), ("data-000002.tar.zst", 1, "zstd")
    ]
    summary = json.loads(run("inspect", dest, "--json")[0])
    assert summary["samples"] == 7 and summary["keys"] == ["cls", "jpg"] and summary["compression"] == "zstd"
    assert summary["fingerprint"] == load_index(Store(dest)).fingerprint
    assert "data-000001.tar.zst" in run("ls", dest)[0] and "samples      7" in run("inspect", dest)[0]
    assert json.loads(run("verify", dest, "--json")[0])["ok"] is True
    assert "all 3 shards OK" in run("verify", dest)[0]


def test_shard_shuffle_is_seeded(tmp_path) -> None:
    make_tree(tmp_path / "src")
    keys = []
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        run("shard", str(tmp_path / "src"), str(tmp_path / name), "--shuffle", "--seed", seed)
        idx = load_index(Store(str(tmp_path / name)))
        keys.append(idx.shards[0].checksum)
    assert keys[0] == keys[1] != keys[2]


def test_verify_exits_non_zero_listing_bad_shards(tmp_path) -> None:
    dest = tmp_path / "ds"
    write_dataset(
        [{"__key__": f"{i}", "bin": os.urandom(3000)} for i in range(9)], str(dest), spec=ShardSpec(max_count=3),
    )
    raw = bytearray((dest / "data-000000.tar").read_bytes())
    raw[1000] ^= 0xFF
    (dest / "data-000000.tar").write_bytes(bytes(raw))
    (dest / "data-000002.tar").unlink()
    _, err = run("verify", str(dest), code=1)
    assert "2 of 3 shards are bad" in err and "data-000000.tar: " in err and "data-000002.tar: missing" in err
    report = json.loads(run("verify", str(dest), "--json", code=1)[0])
    assert [b["path"] for b in report["bad"]] == ["data-000000.tar", "data-000002.tar"]
    quick = json.loads(run("verify", str(dest), "--quick", "--json", code=1)[0])
    assert [b["path"] for b in quick["bad"]] == ["data-000002.tar"]


def test_index_foreign_shards_by_brace_pattern(tmp_path) -> None:
    for n in range(3):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(4):
                info = tarfile.TarInfo(f"s{n}_{i}.txt")
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
        (tmp_path / f"shard-{n:06d}.tar").write_bytes(buf.getvalue())
    out, _ = run("index", str(tmp_path / "shard-{000000..000002}.tar"), "--json")
    assert json.loads(out)["samples"] == 12
    assert (tmp_path / INDEX_NAME).exists()
    run("verify", str(tmp_path))


def test_shard_from_jsonl_and_reshard_from_tar_glob(tmp_path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"JPEG")
    (tmp_path / "in.jsonl").write_text(json.dumps({"__key__": "x", "jpg": "a.jpg", "txt": "caption"}) + "\n")
    run("shard", str(tmp_path / "in.jsonl"), str(tmp_path / "line"))
    assert json.loads(run("inspect", str(tmp_path / "line"), "--json")[0])["keys"] == ["json"]
    run("shard", str(tmp_path / "in.jsonl"), str(tmp_path / "j"), "--file-field", "jpg")
    assert json.loads(run("inspect", str(tmp_path / "j"), "--json")[0])["keys"] == ["jpg", "json"]
    run("shard", str(tmp_path / "in.jsonl"), str(tmp_path / "split"), "--split-fields")
    run("shard", str(tmp_path / "split" / "data-*.tar"), str(tmp_path / "k"), "--compress", "zstd")
    assert json.loads(run("inspect", str(tmp_path / "k"), "--json")[0])["keys"] == ["jpg", "txt"]


def _tar_with(tmp_path, name: str, members: list[tuple[str, bytes]]) -> None:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for member, data in members:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / name).write_bytes(buf.getvalue())


def test_index_refuses_a_member_named_dotdot_and_a_non_tar_shard(tmp_path) -> None:
    _tar_with(tmp_path, "s-0.tar", [("a.txt", b"fine")])
    _tar_with(tmp_path, "s-1.tar", [("ok.txt", b"fine"), ("../x.txt", b"escape")])
    _, err = run("index", str(tmp_path / "s-{0..1}.tar"), code=1)
    assert "s-1.tar" in err and "member '../x.txt' at byte 1024 is unsafe to read: it has a '..' component" in err
    (tmp_path / "s-1.tar").write_bytes(b"PK\x03\x04 a zip file, not a tar" + bytes(600))
    _, err = run("index", str(tmp_path / "s-{0..1}.tar"), code=1)
    assert "s-1.tar" in err and "not a valid tar header" in err
    assert not (tmp_path / INDEX_NAME).exists()


@pytest.mark.parametrize("case", ["empty", "unreadable", "no-index", "unknown-version", "bad-src", "exists"])
def test_bad_inputs_give_one_clear_line(tmp_path, case: str) -> None:
    src, dest = tmp_path / "src", tmp_path / "ds"
    src.mkdir()
    if case == "empty":
        _, err = run("shard", str(src), str(dest), code=1)
        assert "holds no files: nothing to shard" in err and not (dest / INDEX_NAME).exists()
    elif case == "unreadable":
        (src / "a.txt").write_text("x")
        (src / "b.jpg").mkdir()  # a directory where a file is expected ...
        os.symlink(src / "missing", src / "c.jpg")  # ... and a dangling link: refused (the source must change)
        _, err = run("shard", str(src), str(dest), code=2)
        assert "c.jpg is a symbolic link to" in err and "which does not exist" in err
    elif case == "no-index":
        _, err = run("ls", str(src), code=3)  # nothing to read there: could not check
        assert f"no index.json at {src}/index.json" in err and f"`streamio index {src}`" in err
    elif case == "unknown-version":
        (src / INDEX_NAME).write_text(json.dumps({"format": "streamio.dataset/9", "shards": []}))
        _, err = run("inspect", str(src), code=1)
        assert "format 'streamio.dataset/9'; this streamio reads 'streamio.dataset/1'" in err
    elif case == "bad-src":
        (src / "x.csv").write_text("a,b")
        _, err = run("shard", str(src / "x.csv"), str(dest), code=2)
        assert "is not a directory, a .jsonl file or a .tar glob" in err
    else:
        (src / "a.txt").write_text("x")
        run("shard", str(src), str(dest))
        _, err = run("shard", str(src), str(dest), code=2)  # usage: DEST is taken, --overwrite is the fix
        assert "already holds a dataset" in err and "--overwrite" in err
        run("shard", str(src), str(dest), "--overwrite")


def test_s3_with_environment_and_storage_options(tmp_path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "src")
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    url = s3.url("ds")
    run("shard", str(tmp_path / "src"), url, "--max-size", "20KB")
    assert json.loads(run("inspect", url, "--json")[0])["shards"] == 3
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    report = json.loads(run("verify", url, "--json", "-o", f"endpoint_url={s3.endpoint_url}")[0])
    assert report["ok"] and report["checked"] == 3


def test_parse_size() -> None:
    assert parse_size("256MB") == 256_000_000 and parse_size("1GiB") == 1 << 30 and parse_size("4096") == 4096
    assert parse_size("1.5kb") == 1500
    with pytest.raises(Exception, match="not a size"):
        parse_size("lots")


def test_index_elsewhere_for_shards_one_cannot_write(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = tmp_path / "public"
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(6)), str(shards), spec=ShardSpec(max_count=2))
    (shards / INDEX_NAME).unlink()
    out, _ = run("index", str(shards / "data-{000000..000002}.tar"), "--index-url", str(tmp_path / "mine" / "web.json"))
    assert out.startswith(f"{tmp_path}/mine/web.json: 3 shards, 6 samples") and f"shards at {shards}" in out
    assert not (shards / INDEX_NAME).exists() and json.loads((tmp_path / "mine" / "web.json").read_text())[
        "shards_url"] == f"file://{shards}"
    for verb in ("ls", "inspect", "verify"):
        run(verb, str(tmp_path / "mine" / "web.json"))
    run("plan", str(tmp_path / "mine" / "web.json"), "-R", "2")

    def refused(*args: object, **kwargs: object) -> None:
        raise StoragePermissionError("access denied writing s3://public/index.json")

    monkeypatch.setattr("streamio.data.format.index.write_index", refused)
    _, err = run("index", str(shards), code=3)
    assert "access denied writing s3://public/index.json. For shards you cannot write beside" in err
    assert "--index-url URL" in err
    _, err = run("index", str(shards), "--index-url", str(tmp_path / "other"), code=3)
    assert "access denied" in err and "--index-url" not in err  # already elsewhere: no advice to go elsewhere
    _, err = run("index", str(shards), "--index-url", str(tmp_path / "bad\x01.json"), code=2)
    assert "cannot name an index" in err and "control character" in err


def test_a_pattern_names_the_indexed_shards_or_says_to_index_them(tmp_path) -> None:
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(6)), str(tmp_path), spec=ShardSpec(max_count=2))
    assert json.loads(run("inspect", str(tmp_path / "data-{000000..000002}.tar"), "--json")[0])["samples"] == 6
    _, err = run("verify", str(tmp_path / "data-{000000..000001}.tar"), code=3)
    assert "names 2 shards but" in err
    assert f"`streamio index '{tmp_path}/data-{{000000..000001}}.tar' --index-url" in err  # apart: drops nothing
    (tmp_path / INDEX_NAME).unlink()  # no index: the hint is to index them beside the shards
    _, err = run("verify", str(tmp_path / "data-{000000..000001}.tar"), code=3)
    assert f"`streamio index '{tmp_path}/data-{{000000..000001}}.tar'`" in err


@pytest.mark.parametrize("where", ["local", "s3"])
def test_index_never_silently_replaces_an_index(tmp_path, where: str, request: pytest.FixtureRequest) -> None:
    """Issue 23: the hint for a subset pattern made `streamio index` replace a 10-shard index with 5 (exit 0)."""
    env: dict[str, str] = {}
    if where == "s3":
        s3: S3Endpoint = request.getfixturevalue("s3")
        env, root = s3.env(), s3.url("ds")
        store = Store(root, s3.storage_options())
    else:
        root = str(tmp_path / "ds")
        store = Store(root)
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(10)), store, spec=ShardSpec(max_count=1))
    before = store.read(INDEX_NAME)
    subset = f"{root}/data-{{000000..000004}}.tar"
    _, err = run("inspect", subset, code=3, env=env)
    hint = re.search(r"`(streamio index [^`]*)`", err)
    assert hint is not None and "--index-url" in hint.group(1), err
    _, err = run("index", subset, code=2, env=env)  # what the old hint said: refused, nothing written
    assert f"{root}/index.json exists" in err and "--index-url" in err and "--overwrite" in err
    assert store.read(INDEX_NAME) == before
    out, _ = run(*shlex.split(hint.group(1))[1:], "--json", env=env)  # the hint, as printed: a subset apart
    assert json.loads(out)["samples"] == 5 and store.read(INDEX_NAME) == before
    assert json.loads(run("inspect", f"{root}/subset.json", "--json", env=env)[0])["shards"] == 5
    assert json.loads(run("index", subset, "--overwrite", "--json", env=env)[0])["samples"] == 5  # asked for


def test_two_indexers_cannot_replace_each_other(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is written create-only: an indexer that finishes second loses (exit 2) instead of replacing."""
    from streamio.data.write import indexer

    store = Store(s3.url("ds"), s3.storage_options())
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(4)), store, spec=ShardSpec(max_count=1))
    store.delete(INDEX_NAME)
    real = indexer.build_index

    def other_indexer_finishes_first(*args: object, **kwargs: object) -> object:
        found = real(*args, **kwargs)  # type: ignore[arg-type]
        store.put(INDEX_NAME, b'{"written": "by the other indexer"}')
        return found

    monkeypatch.setattr(indexer, "build_index", other_indexer_finishes_first)
    _, err = run("index", s3.url("ds"), code=2, env=s3.env())
    assert "index.json exists" in err and store.read(INDEX_NAME) == b'{"written": "by the other indexer"}'


def test_jsonl_file_field_json_is_a_usage_error(tmp_path) -> None:
    (tmp_path / "in.jsonl").write_text('{"json": "a.txt"}\n')
    _, err = run("shard", str(tmp_path / "in.jsonl"), str(tmp_path / "ds"), "--file-field", "json", code=2)
    assert "'json' is the member holding each line" in err and "--split-fields" in err


@pytest.mark.parametrize("compress", [[], ["--compress", "zstd"]], ids=["tar", "zst"])
def test_verify_fails_an_index_that_drops_the_last_sample(tmp_path, compress: list[str]) -> None:
    """Issue 23: an index listing 9 of a shard's 10 samples (its size and checksum right) passed `verify`."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"__key__": f"k{i}", "n": i}) + "\n" for i in range(10)))
    dest = tmp_path / "ds"
    run("shard", str(tmp_path / "in.jsonl"), str(dest), *compress)
    doc = json.loads((dest / INDEX_NAME).read_text())
    entry = doc["shards"][0]
    entry["offsets"], entry["crc32c"] = entry["offsets"][:-1], entry["crc32c"][:-1]
    entry["samples"] -= 1
    doc["samples"] -= 1
    (dest / INDEX_NAME).write_text(json.dumps(doc))
    _, err = run("verify", str(dest), code=1)
    assert "data-000000.tar" in err and "member 'k9.json' at byte" in err and "the index does not list it" in err
