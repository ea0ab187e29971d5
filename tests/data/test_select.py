"""Samples whose members differ (some ``.jpg``, some ``.png``): a clear error, and ``streamio.select``.

Issue 23, item 14: a data set mixing ``.jpg`` and ``.png`` samples failed in the default collate
with a raw ``KeyError: 'jpg'``. The collate error now names the sample, the member it lacks, the
members it has and the fix; ``streamio.select("jpg;png", "cls")`` takes the first member present,
as webdataset's ``to_tuple`` does.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import pytest

import streamio
from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader, collate_samples
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ConfigError, DatasetError, MissingMemberError

N = 24


def image_of(i: int) -> tuple[str, bytes]:
    """Sample ``i``'s image member: even samples are jpg, odd ones png."""
    return ("jpg", b"\xff\xd8jpeg %d" % i) if i % 2 == 0 else ("png", b"\x89PNG %d" % i)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "mixed")
    samples = ({"__key__": f"{i:04d}", image_of(i)[0]: image_of(i)[1], "cls": b"%d" % (i % 3)} for i in range(N))
    write_dataset(samples, url, spec=ShardSpec(max_count=8))
    return url


@pytest.fixture(autouse=True)
def one_rank(as_rank: Any) -> None:
    as_rank(0, 1)


def test_mixed_members_in_a_batch_name_the_sample_what_it_lacks_and_the_fix(url: str) -> None:
    loader = StreamingDataLoader(StreamingDataset(url, batch_size=4, shuffle=False))
    with pytest.raises(MissingMemberError) as err:
        next(iter(loader))
    text = str(err.value)
    assert "sample '0000'" in text and "lacks ['jpg']" in text and "sample '0001'" in text
    assert "it has ['cls', 'png']" in text and "streamio.select(image='jpg;png', label='cls')" in text
    assert isinstance(err.value, KeyError) and isinstance(err.value, DatasetError)  # old `except KeyError` holds
    assert not text.startswith("'")  # plain text, not KeyError's quoted repr


def test_extra_members_are_named_too() -> None:
    batch = [{"__key__": "a", "jpg": b"1"}, {"__key__": "b", "jpg": b"2", "txt": b"x"}]
    with pytest.raises(MissingMemberError, match=r"sample 'a' \(\?\) lacks \['txt'\], which sample 'b' has"):
        collate_samples(batch)


@pytest.mark.parametrize("workers", [0, 2])
def test_select_takes_the_first_member_present_and_collates(url: str, workers: int) -> None:
    pick = streamio.select(image="jpg;png;jpeg", label="cls")
    ds = StreamingDataset(url, batch_size=4, shuffle=False, transform=pick)
    batches = list(StreamingDataLoader(ds, num_workers=workers))
    keys = [k for b in batches for k in b["__key__"]]
    images = [x for b in batches for x in b["image"]]
    assert sorted(keys) == [f"{i:04d}" for i in range(N)]
    assert all(image == image_of(int(k))[1] for k, image in zip(keys, images, strict=True))
    assert set(batches[0]) == {"__key__", "__url__", "__shard__", "__index__", "image", "label"}


def test_select_as_a_tuple_is_webdatasets_to_tuple(url: str) -> None:
    ds = StreamingDataset(url, shuffle=False, transform=streamio.select("jpg;png", "cls"))
    first = list(ds)[:2]
    assert first == [image_of(0)[1:] + (b"0",), image_of(1)[1:] + (b"1",)]


def test_a_sample_without_any_alternative_names_it_and_its_members(url: str) -> None:
    ds = StreamingDataset(url, shuffle=False, transform=streamio.select(image="jpg;webp", label="cls"))
    it = iter(ds)
    next(it)
    with pytest.raises(MissingMemberError, match=r"sample '0001' of .* has none of the members of field 'image' "
                                                 r"\(jpg;webp\); it has \['cls', 'png'\]"):
        next(it)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [((), {}, "one form, at least one field"), (("jpg",), {"y": "cls"}, "one form"),
     (("",), {}, "give member names"), ((";",), {}, "give member names"), ((), {"k": "__key__"}, "__meta__")],
)
def test_select_refuses_what_it_cannot_mean(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        streamio.select(*args, **kwargs)


@pytest.mark.parametrize("spec", [" ", "jpg; png", "jpg ;png", "jpg png", "jpg,png", "\tcls", "png\n"])
def test_a_spec_no_member_could_match_is_refused_with_the_syntax(spec: str) -> None:
    """On 15d7008 these were accepted and never matched: every sample raised MissingMemberError later."""
    name = next(n for n in spec.split(";") if any(c.isspace() or c == "," for c in n))
    syntax = r'give member names, alternatives separated by ";" without spaces \("jpg;png"\)'
    with pytest.raises(ConfigError, match=rf"select\(#0={re.escape(repr(spec))}\): {re.escape(repr(name))} holds a "
                                          rf"space or a comma.*{syntax}"):
        streamio.select(spec)
    with pytest.raises(ConfigError, match=rf"select\(image={re.escape(repr(spec))}\)"):
        streamio.select(image=spec, label="cls")
    assert streamio.select("jpg;png", "cls")({"jpg": 1, "cls": 2}) == (1, 2)


def test_a_selector_pickles_into_spawned_workers() -> None:
    pick = streamio.select(image="jpg;png", label="cls")
    again = pickle.loads(pickle.dumps(pick))
    assert repr(again) == "select(image='jpg;png', label='cls')"
    assert again({"__key__": "k", "png": b"p", "cls": b"1"}) == {"__key__": "k", "image": b"p", "label": b"1"}
