"""JSONL as a source (streamio.data.write.sources.samples_from_jsonl): by default one sample per line, the line
kept byte for byte as one ``json`` member (types kept, size about the input's plus the tar framing); the
per-field mapping only with ``split_fields=True``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamio.data.decode import make_decoder
from streamio.data.write.sources import samples_from_directory, samples_from_jsonl, samples_from_shards
from streamio.data.write.writer import write_dataset
from streamio.errors import DatasetError
from streamio.storage import Store

LINES = [
    {"__key__": "a", "id": 0, "score": 0.1 + 0.2, "ok": True, "none": None, "tags": ["x", {"y": [1, 2]}], "t": "héllo"},
    {"id": 1, "big": 2**70, "neg": -1.5e-300, "text": "a\nb \"quoted\""},
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_each_line_is_one_json_member_holding_the_line(tmp_path: Path) -> None:
    raw = [json.dumps(x, ensure_ascii=False) for x in LINES]
    src = _write(tmp_path / "in.jsonl", [raw[0], "", "   ", raw[1]])  # blank lines are not samples
    samples = samples_from_jsonl(str(src))
    assert samples.total == 2
    got = list(samples)
    assert got == [{"__key__": "a", "json": raw[0].encode()}, {"json": raw[1].encode()}]
    index = write_dataset(samples_from_jsonl(str(src)), str(tmp_path / "ds"))
    assert index.keys == ("json",)
    back = list(samples_from_shards(Store(str(tmp_path / "ds"))))
    assert [s["__key__"] for s in back] == ["a", "000000001"]  # the line's key, else its running number
    assert [s["json"] for s in back] == [r.encode() for r in raw]  # byte for byte
    decoded = [make_decoder("auto")(s)["json"] for s in back]  # what a reader gets: every type kept
    assert decoded == LINES and isinstance(decoded[1]["big"], int) and decoded[0]["score"] == 0.1 + 0.2


def test_the_shards_are_about_the_input_size(tmp_path: Path) -> None:
    line = json.dumps({"id": 7, "text": "word " * 400, "score": 0.25})  # ~2 KB lines
    src = _write(tmp_path / "in.jsonl", [line] * 400)
    size = src.stat().st_size
    whole = write_dataset(samples_from_jsonl(str(src)), str(tmp_path / "a"))
    split = write_dataset(samples_from_jsonl(str(src), split_fields=True), str(tmp_path / "b"))
    whole_bytes, split_bytes = (sum(s.bytes for s in i.shards) for i in (whole, split))
    # per line: the 512-byte header and the padding of the data to 512 bytes, and nothing else
    assert whole_bytes <= size + 400 * 1024 + 2048 and whole_bytes < 1.5 * size
    assert split_bytes > whole_bytes + 400 * 1024  # one header + padding per field: the old bloat


def test_file_fields_add_the_named_files_as_members(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "1.jpg").write_bytes(b"JPEG")
    line = json.dumps({"__key__": "s1", "jpg": "img/1.jpg", "txt": "a caption"})
    src = _write(tmp_path / "in.jsonl", [line])
    assert list(samples_from_jsonl(str(src), file_fields=["jpg"])) == [
        {"__key__": "s1", "json": line.encode(), "jpg": b"JPEG"}
    ]
    assert list(samples_from_jsonl(str(src))) == [{"__key__": "s1", "json": line.encode()}]  # never guessed
    with pytest.raises(DatasetError, match=r"cannot read .*a caption"):
        list(samples_from_jsonl(str(src), file_fields=["txt"]))
    with pytest.raises(DatasetError, match=r"sample 's1': file field 'cls' is None, not a file name"):
        list(samples_from_jsonl(str(src), file_fields=["cls"]))
    with pytest.raises(DatasetError, match="the file field 'json' would clash with the 'json' member"):
        samples_from_jsonl(str(src), file_fields=["json"])


def test_split_fields_is_the_per_field_mapping(tmp_path: Path) -> None:
    (tmp_path / "1.jpg").write_bytes(b"JPEG")
    src = _write(tmp_path / "in.jsonl", [json.dumps({"__key__": "s1", "jpg": "1.jpg", "cls": 4, "meta": {"w": 2}})])
    assert list(samples_from_jsonl(str(src), split_fields=True)) == [
        {"__key__": "s1", "jpg": b"JPEG", "cls": "4", "meta": '{"w":2}'}
    ]
    assert list(samples_from_jsonl(str(src), split_fields=True, file_fields=["json"])) == [
        {"__key__": "s1", "jpg": "1.jpg", "cls": "4", "meta": '{"w":2}'}  # no clash: there is no 'json' member
    ]


def test_shuffle_is_seeded_and_a_bom_is_skipped(tmp_path: Path) -> None:
    lines = [json.dumps({"__key__": f"{i:03d}"}) for i in range(50)]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")  # a BOM and CRLF, as editors write
    plain = [s["__key__"] for s in samples_from_jsonl(str(src))]
    assert plain == [f"{i:03d}" for i in range(50)]
    one = [s["__key__"] for s in samples_from_jsonl(str(src), shuffle_seed=1)]
    assert one == [s["__key__"] for s in samples_from_jsonl(str(src), shuffle_seed=1)] != plain
    assert sorted(one) == plain and one != [s["__key__"] for s in samples_from_jsonl(str(src), shuffle_seed=2)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"a": 1}\n\n[1, 2]\n', r"bad.jsonl:3 is a JSON list, not an object"),
        (b'{"a": 1}\n"text"\n', r"bad.jsonl:2 is a JSON string, not an object"),
        (b'{"a": 1}\n{"a": \n', r"bad.jsonl:2 is not valid UTF-8 JSON \(Expecting value"),
        (b'{"a": "\xff"}\n', r"bad.jsonl:1 is not valid UTF-8 JSON"),
        (b"\n  \n", "holds no samples: nothing to shard"),
    ],
    ids=["list", "string", "cut", "not-utf8", "empty"],
)
def test_bad_lines_are_named_by_line_number(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(DatasetError, match=message):
        list(samples_from_jsonl(str(tmp_path / "bad.jsonl")))


def test_an_unreadable_source_fails_when_opened(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"cannot read .*missing.jsonl: No such file"):
        samples_from_jsonl(str(tmp_path / "missing.jsonl"))
    (tmp_path / "d").mkdir()
    for name in ("a.txt", "a.cls", "b.txt"):
        (tmp_path / "d" / name).write_text("x")
    assert samples_from_directory(str(tmp_path / "d")).total == 2
