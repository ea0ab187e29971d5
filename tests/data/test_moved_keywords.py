"""The keywords of streamio 0.1 that moved into option objects still work, for one release, with a warning.

Issue 23, item 18: ``StreamingDataset(..., cache=)`` and ``write_dataset(..., max_count=)`` became
TypeErrors in the 0.2.0 restructure with no deprecation. Every public keyword that moved (found by
comparing the signatures of ``streamio.__all__`` at the last 0.1 commit, 2d9a55f, with today's) is
accepted with a ``DeprecationWarning`` that names the new spelling and points at the caller; the old
and new spelling together, or a keyword that never existed, is an ``ArgumentError`` (a TypeError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import streamio
from streamio.data.format.samples import SampleSpan, iter_samples
from streamio.data.write.writer import DatasetWriter
from streamio.errors import ArgumentError

ROWS = [{"__key__": f"{i:03d}", "txt": f"sample {i}"} for i in range(10)]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "ds")
    streamio.write_dataset(ROWS, url)
    return url


DATASET_MOVED: list[tuple[str, Any]] = [
    ("policy", "drop"),
    ("cache", streamio.CacheConfig("/tmp/streamio-moved-keywords-cache", max_bytes=1 << 30)),
    ("prefetch", streamio.PrefetchConfig(workers=2)),
    ("handler", bool),
]


@pytest.mark.parametrize(("name", "value"), DATASET_MOVED)
def test_a_dataset_keyword_of_0_1_warns_with_its_new_spelling_and_works(url: str, name: str, value: Any) -> None:
    with pytest.warns(DeprecationWarning, match=rf"StreamingDataset\({name}=\.\.\.\) is deprecated since streamio "
                                                rf"0\.2\.0 and will be removed in 0\.3\.0: pass "
                                                rf"options=DatasetOptions\({name}=\.\.\.\)") as caught:
        ds = streamio.StreamingDataset(url, **{name: value})
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert ds.options == streamio.DatasetOptions(**{name: value})


def test_several_moved_keywords_build_one_options_value(url: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"options=DatasetOptions\(policy=\.\.\., handler=\.\.\.\)"):
        ds = streamio.StreamingDataset(url, policy="drop", handler=bool)
    assert ds.options == streamio.DatasetOptions(policy="drop", handler=bool)


def test_the_old_and_the_new_spelling_together_name_both(url: str) -> None:
    with pytest.raises(ArgumentError, match=r"got cache= and options= together: cache= moved into options= in "
                                            r"streamio 0\.2\.0; pass options=DatasetOptions\(cache=\.\.\.\) only"):
        streamio.StreamingDataset(url, cache=DATASET_MOVED[1][1], options=streamio.DatasetOptions())


def test_a_keyword_that_never_existed_is_still_a_type_error(url: str) -> None:
    with pytest.raises(TypeError, match=r"StreamingDataset\(\) got an unexpected keyword argument 'polcy'"):
        streamio.StreamingDataset(url, polcy="drop")


def test_epoch_samples_of_0_2_warns_and_sets_the_samples_of_an_epoch(url: str) -> None:
    """``epoch_samples=`` moved into ``options`` in 0.2.0, where ``options=`` already existed."""
    weighted = streamio.Stream(url, weight=1)
    with pytest.warns(DeprecationWarning, match=r"StreamingDataset\(epoch_samples=\.\.\.\) is deprecated since "
                                                r"streamio 0\.2\.0 and will be removed in 0\.3\.0: pass "
                                                r"options=DatasetOptions\(epoch_samples=\.\.\.\)") as caught:
        ds = streamio.StreamingDataset([weighted], epoch_samples=25)
    assert caught[0].filename == __file__
    assert ds.options == streamio.DatasetOptions(epoch_samples=25) and ds.contributions == (25,)


def test_epoch_samples_beside_options_is_folded_into_them_unless_they_set_it(url: str) -> None:
    weighted = streamio.Stream(url, weight=1)
    with pytest.warns(DeprecationWarning, match=r"pass options=DatasetOptions\(epoch_samples=\.\.\.\)"):
        ds = streamio.StreamingDataset([weighted], epoch_samples=25, options=streamio.DatasetOptions(policy="drop"))
    assert ds.options == streamio.DatasetOptions(policy="drop", epoch_samples=25) and ds.contributions == (25,)
    with pytest.raises(ArgumentError, match=r"got epoch_samples= and options= together: epoch_samples= moved into "
                                            r"options= in streamio 0\.2\.0; pass options=DatasetOptions\("):
        streamio.StreamingDataset([weighted], epoch_samples=25, options=streamio.DatasetOptions(epoch_samples=30))
    with pytest.warns(DeprecationWarning) as caught:  # two moved keywords: one value, both named
        ds = streamio.StreamingDataset([weighted], policy="drop", epoch_samples=25)
    assert [str(w.message).split(")")[0] for w in caught] == [
        "StreamingDataset(policy=...", "StreamingDataset(epoch_samples=...",
    ]
    assert ds.options == streamio.DatasetOptions(policy="drop", epoch_samples=25)


def test_iter_samples_moved_keywords_warn_and_read_the_same_span(url: str) -> None:
    """``start_offset=``, ``first_sample=``, ``num_samples=`` moved into ``span=SampleSpan(...)`` in 0.2.0."""
    store = streamio.Store(url)
    index = streamio.load_index(store)
    shard, layout = index.shards[0], index.layout(0, store)
    start, end = layout.byte_range(2, 5)
    span = SampleSpan(start, 2, 3)
    expected = list(iter_samples([store.read(shard.path, start, end)], url=shard.path, span=span, layout=layout))
    assert [s["__key__"] for s in expected] == ["002", "003", "004"]
    with pytest.warns(DeprecationWarning, match=r"iter_samples\(start_offset=, first_sample=, num_samples=\.\.\.\) is "
                                                r"deprecated since streamio 0\.2\.0 and will be removed in 0\.3\.0: "
                                                r"pass span=SampleSpan\(start_offset=\.\.\., first_sample=\.\.\., "
                                                r"num_samples=\.\.\.\)") as caught:
        samples = iter_samples([store.read(shard.path, start, end)], url=shard.path, start_offset=start,
                               first_sample=2, num_samples=3, layout=layout)
    assert caught[0].filename == __file__ and list(samples) == expected
    with pytest.raises(ArgumentError, match=r"got first_sample= and span= together: first_sample= moved into span= in "
                                            r"streamio 0\.2\.0; pass span=SampleSpan\(first_sample=\.\.\.\) only"):
        iter_samples([], url=shard.path, span=span, first_sample=2)
    with pytest.raises(TypeError, match=r"iter_samples\(\) got an unexpected keyword argument 'start'"):
        iter_samples([], url=shard.path, start=start)  # at the call, as before: not when first iterated


WRITER_MOVED: list[tuple[str, Any]] = [
    ("max_count", 4), ("max_bytes", 1 << 20), ("compression", "zstd"), ("level", 5), ("prefix", "part"),
]


@pytest.mark.parametrize(("name", "value"), WRITER_MOVED)
def test_a_writer_keyword_of_0_1_warns_with_its_new_spelling_and_writes_the_same(
    tmp_path: Path, name: str, value: Any
) -> None:
    spec = streamio.ShardSpec(**{name: value})
    expected = streamio.write_dataset(ROWS, str(tmp_path / "new"), spec=spec)
    with pytest.warns(DeprecationWarning, match=rf"write_dataset\({name}=\.\.\.\) is deprecated .* "
                                                rf"pass spec=ShardSpec\({name}=\.\.\.\)") as caught:
        index = streamio.write_dataset(ROWS, str(tmp_path / "old"), **{name: value})
    assert caught[0].filename == __file__
    assert [(s.path, s.samples, s.checksum) for s in index.shards] == [
        (s.path, s.samples, s.checksum) for s in expected.shards
    ]


def test_the_writer_class_takes_them_too(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"DatasetWriter\(max_count=\.\.\.\) is deprecated"):
        writer = DatasetWriter(str(tmp_path / "ds"), max_count=3)
    assert writer.spec == streamio.ShardSpec(max_count=3)
    for row in ROWS:
        writer.write(row)
    assert len(writer.close().shards) == 4
    with pytest.raises(ArgumentError, match="got max_count= and spec= together"):
        streamio.write_dataset(ROWS, str(tmp_path / "x"), max_count=3, spec=streamio.ShardSpec())
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_size'"):
        streamio.write_dataset(ROWS, str(tmp_path / "y"), max_size=3)


def test_with_layouts_of_0_1_still_gives_an_index_holding_them(tmp_path: Path) -> None:
    index = streamio.write_dataset(ROWS, str(tmp_path / "ds"), spec=streamio.ShardSpec(max_count=4))
    store = streamio.Store(str(tmp_path / "ds"))
    layouts = {i: index.layout(i, store) for i in range(len(index.shards))}
    with pytest.warns(DeprecationWarning, match=r"DatasetIndex.with_layouts\(\) is deprecated since streamio 0\.2\.0"):
        copy = streamio.load_index(store).with_layouts(layouts)
    assert copy == index and copy.layout(1, streamio.Store("memory://nothing-there")) == layouts[1]


def test_restore_takes_step_positionally_for_one_release(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """0.1's ``restore(state, 7)``: still a restore of step 7, with the keyword named."""
    import torch

    from streamio import CheckpointManager
    from streamio.errors import ArgumentError

    with CheckpointManager(str(tmp_path / "ckpt"), async_save=False) as mgr:
        for step in (7, 8):
            mgr.save(step, {"w": torch.full((2,), float(step))})
        state = {"w": torch.zeros(2)}
        with pytest.warns(DeprecationWarning, match=r"pass step=7"):
            assert mgr.restore(state, 7) == 7
        assert state["w"].tolist() == [7.0, 7.0]
        with pytest.raises(ArgumentError, match="step= once"):
            mgr.restore(state, 7, step=8)
