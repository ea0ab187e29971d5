"""streamio.limits: bounded decoding of untrusted JSON documents and zstd payloads."""

from __future__ import annotations

import os

import pytest
import zstandard

from streamio.errors import CorruptDataError, IndexFormatError
from streamio.limits import json_depth, load_json, zstd_decompress, zstd_framing_problem

RAW = os.urandom(300_000)
FRAME = zstandard.ZstdCompressor().compress(RAW)


def test_zstd_whole_frame_round_trips() -> None:
    assert zstd_decompress(FRAME, limit=len(RAW), what="part p", error=CorruptDataError) == RAW


def test_zstd_several_frames_and_a_skippable_one_round_trip() -> None:
    skippable = b"\x50\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc"
    data = FRAME + skippable + zstandard.ZstdCompressor().compress(b"tail")
    assert zstd_framing_problem(data) is None
    assert zstd_decompress(data, limit=len(RAW) + 4, what="part p", error=CorruptDataError) == RAW + b"tail"


@pytest.mark.parametrize("cut", [1, 7, len(FRAME) // 2, len(FRAME) - 20])
def test_zstd_truncated_frame_raises_the_callers_error(cut: int) -> None:
    # python-zstandard's stream_reader returns the partial output of a cut frame without an error
    with pytest.raises(CorruptDataError, match=r"part s3://b/p is truncated or damaged: the zstd frame at offset 0"):
        zstd_decompress(FRAME[:-cut], limit=len(RAW), what="part s3://b/p", error=CorruptDataError)


def test_zstd_second_frame_cut_is_named_by_its_offset() -> None:
    data = FRAME + FRAME[:100]
    with pytest.raises(CorruptDataError, match=rf"frame at offset {len(FRAME)} runs past the end"):
        zstd_decompress(data, limit=2 * len(RAW), what="part p", error=CorruptDataError)


def test_zstd_trailing_garbage_is_refused() -> None:
    with pytest.raises(CorruptDataError, match=rf"bytes at offset {len(FRAME)} are not a zstd frame"):
        zstd_decompress(FRAME + b"junkjunk", limit=len(RAW), what="part p", error=CorruptDataError)


def test_zstd_frame_declaring_more_than_the_limit_is_refused_before_decoding() -> None:
    with pytest.raises(CorruptDataError, match=rf"declares {len(RAW)} bytes of content, more than the 1000 expected"):
        zstd_decompress(FRAME, limit=1000, what="part p", error=CorruptDataError)


def test_zstd_unknown_size_frame_over_the_limit_stops_one_byte_past_it() -> None:
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    frame = cctx.compress(bytes(5_000_000))  # no declared size: only the output count can stop it
    assert zstandard.frame_content_size(frame) == -1
    with pytest.raises(CorruptDataError, match="decompresses to more than the 4096 bytes expected"):
        zstd_decompress(frame, limit=4096, what="part p", error=CorruptDataError)
    assert zstd_decompress(frame, limit=5_000_000, what="part p", error=CorruptDataError) == bytes(5_000_000)


def test_zstd_not_zstd_and_negative_limit() -> None:
    with pytest.raises(CorruptDataError, match="part p is not a zstd frame"):
        zstd_decompress(b"plain text, not zstd", limit=100, what="part p", error=CorruptDataError)
    with pytest.raises(CorruptDataError, match="negative size limit -1"):
        zstd_decompress(FRAME, limit=-1, what="part p", error=CorruptDataError)


def test_json_size_limit() -> None:
    assert load_json(b'{"a": [1, 2]}', what="doc", error=IndexFormatError, max_bytes=13) == {"a": [1, 2]}
    with pytest.raises(IndexFormatError, match="doc is 14 bytes, over the 13-byte limit"):
        load_json(b'{"a": [1, 22]}', what="doc", error=IndexFormatError, max_bytes=13)


def test_json_depth_limit() -> None:
    assert load_json(b"[" * 5 + b"]" * 5, what="doc", error=IndexFormatError, max_depth=5) == [[[[[]]]]]
    with pytest.raises(IndexFormatError, match="doc is nested 6\\+ levels deep, over the limit of 5"):
        load_json(b"[" * 6 + b"]" * 6, what="doc", error=IndexFormatError, max_depth=5)
    with pytest.raises(IndexFormatError, match="nested too deeply to parse"):
        load_json(b"[" * 200_000 + b"]" * 200_000, what="doc", error=IndexFormatError, max_bytes=1 << 20)
    assert json_depth({"a": {"b": [1]}, "c": 2}, limit=10) == 3


def test_json_not_json_names_the_document() -> None:
    with pytest.raises(IndexFormatError, match="index s3://b/index.json is not valid JSON"):
        load_json(b"\xff{", what="index s3://b/index.json", error=IndexFormatError)
