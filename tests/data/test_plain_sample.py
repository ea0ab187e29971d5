"""The verified-sample fast path agrees with the full tar parser, and hands anything unusual to it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.data.format.plain import plain_sample
from streamio.data.format.samples import group_samples
from streamio.data.format.tar import encode_sample, iter_members
from streamio.errors import ShardFormatError

NAME_CHARS = st.text(alphabet="ab.-_/é", min_size=1, max_size=12)


def full_parse(data: bytes) -> list[tuple[int, dict[str, Any]]] | None:
    """What the full parser makes of one sample's bytes; None when it refuses them."""
    try:
        members = iter_members([data], url="u", require_end=False, max_sample_bytes=len(data))
        return list(group_samples(members, url="u", max_sample_bytes=len(data)))
    except ShardFormatError:
        return None


@settings(max_examples=300, deadline=None)
@given(
    key=NAME_CHARS,
    exts=st.lists(NAME_CHARS, min_size=1, max_size=4),
    sizes=st.lists(st.integers(0, 2000), min_size=4, max_size=4),
)
def test_fast_path_equals_the_full_parser_or_defers_to_it(key: str, exts: list[str], sizes: list[int]) -> None:
    members = [(f"{key}.{ext}", bytes([i + 1]) * sizes[i]) for i, ext in enumerate(exts)]
    data = b"".join(encode_sample(members))
    fast = plain_sample(memoryview(data))
    full = full_parse(data)
    if fast is not None:
        assert full is not None and len(full) == 1 and full[0][1] == fast
        assert all("/" not in name for name in fast)
    names = [name for name, _ in members]
    plain = "." not in key and len(set(exts)) == len(exts) and all(n.isascii() and "/" not in n for n in names)
    if plain and full is not None and len(full) == 1 and all(len(n) <= 100 for n in names):
        assert fast == full[0][1]  # the plain case never falls back


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_damaged_bytes_never_yield_what_the_full_parser_would_not(data: st.DataObject) -> None:
    raw = bytearray(b"".join(encode_sample([("k1.bin", b"\x07" * 700), ("k1.cls", b"3")])))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    fast = plain_sample(bytes(raw))
    if fast is None:
        return
    # the header sums are not added up (the index's CRC32C covers them): compare with sums fixed
    fixed = bytearray(raw)
    pos = 0
    while pos + 512 <= len(fixed):
        header = fixed[pos : pos + 512]
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        fixed[pos : pos + 512] = header
        size = int(bytes(header[124:136]).split(b"\0")[0], 8)
        pos += 512 + size + (-size % 512)
    full = full_parse(bytes(fixed))
    assert full is not None and len(full) == 1 and full[0][1] == fast
    assert sum(len(v) for k, v in fast.items() if k != "__key__") <= len(raw)


def test_what_the_fast_path_leaves_to_the_full_parser() -> None:
    def one(name: str, typeflag: bytes = b"0") -> bytes:
        data = bytearray(b"".join(encode_sample([(name, b"x")])))
        data[156:157] = typeflag
        return bytes(data)

    assert plain_sample(one("k.bin")) == {"__key__": "k", "bin": b"x"}
    for name in ("dir/k.bin", ".k.bin", "k", "k.", "../k.bin", "x" * 120 + ".bin", "ké.bin"):
        assert plain_sample(one(name)) is None, name  # paths, dots, no extension, pax names: the full parser
    assert plain_sample(one("k.bin", b"2")) is None  # a symlink
    assert plain_sample(one("k.bin", b"5")) is None  # a directory
    two_keys = b"".join(encode_sample([("a.bin", b"1"), ("b.bin", b"2")]))
    assert plain_sample(two_keys) is None
    repeated = b"".join(encode_sample([("a.bin", b"1"), ("a.bin", b"2")]))
    assert plain_sample(repeated) is None
    assert plain_sample(b"") is None and plain_sample(one("k.bin")[:600]) is None
    assert plain_sample(one("k.bin") + bytes(512)) is None  # bytes after the last member
