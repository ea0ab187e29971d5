"""``streamio plan URL``: per-rank split, tail policy, runs, and the invariant checks, end to end."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from streamio.cli.main import cli
from streamio.data.plan import EpochPlan
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store
from streamio.testing import S3Endpoint

N = 103  # 10 shards of 10 and one of 3: nothing divides evenly


def _write(dest: str | Store) -> None:
    write_dataset(
        ({"__key__": f"{i:06d}", "txt": f"sample {i}"} for i in range(N)), dest, spec=ShardSpec(max_count=10),
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("plan-cli") / "ds")
    _write(root)
    return root


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["plan", *args])
    return res.exit_code, res.output


def _coverage(rep: dict) -> Counter:
    return Counter((path, i) for r in rep["ranks"] for path, first, end in r["runs"] for i in range(first, end))


@pytest.mark.parametrize(
    ("policy", "world", "workers", "batch"),
    [("pad", 4, 2, 4), ("drop", 4, 2, 4), ("pad", 150, 3, 1), ("drop", 7, 0, 2)],
)
def test_json_split_is_exact_and_equal(dataset: str, policy: str, world: int, workers: int, batch: int) -> None:
    code, out = _run(
        dataset,
        "--world-size", str(world),
        "--workers", str(workers),
        "-B", str(batch),
        "--policy", policy,
        "--epoch", "3",
        "--json",
    )
    assert code == 0, out
    rep = json.loads(out)
    assert rep["samples"] == N and rep["shards"] == 11 and rep["fingerprint"].startswith("sha256:")
    assert {r["samples"] for r in rep["ranks"]} == {rep["samples_per_rank"]}
    assert {r["batches"] for r in rep["ranks"]} == {rep["batches_per_rank"]} == {-(-rep["samples_per_rank"] // batch)}
    cover = _coverage(rep)
    if policy == "pad":
        assert rep["dropped"] == 0 and len(cover) == N
        assert sum(cover.values()) == N + rep["padding"] == world * rep["samples_per_rank"]
    else:
        assert rep["padding"] == 0 and set(cover.values()) == {1}
        assert len(cover) == N - rep["dropped"] == world * rep["samples_per_rank"]
    assert rep["checks"] == {"exactly_once": True, "equal_work": True} and rep["problems"] == []


def test_human_output_names_the_tail_and_the_runs(dataset: str) -> None:
    code, out = _run(dataset, "-R", "4", "-W", "2", "-B", "4", "--runs", "2")
    assert code == 0, out
    assert "per rank  26 samples, 7 batches (last batch 2 samples)" in out
    assert "pad: 1 sample repeated" in out
    assert "data-0000" in out and "more)" in out
    assert "exactly once (+1 padded, -0 dropped): OK; equal work: OK" in out
    code, out = _run(dataset, "-R", "4", "--policy", "drop")
    assert code == 0 and "drop: 3 samples left out" in out


def test_epochs_move_shards_between_ranks(dataset: str) -> None:
    reps = [json.loads(_run(dataset, "-R", "2", "--epoch", str(e), "--json")[1]) for e in range(4)]
    rank0 = {frozenset(path for path, _, _ in rep["ranks"][0]["runs"]) for rep in reps}
    assert len(rank0) > 1


def test_errors_are_one_line_with_the_fix(dataset: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out = _run(dataset, "-R", "200", "--policy", "drop")  # a split this dataset cannot give: usage
    assert code == 2 and "world_size=200 exceeds the 103 samples" in out and "policy='pad'" in out
    code, out = _run(str(tmp_path / "nothing"), "-R", "2")  # no dataset there: could not check
    assert code == 3 and "streamio index" in out


def test_failed_check_exits_1(dataset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EpochPlan, "check", lambda self: ["equal work: rank 1 yields 3 samples"])
    code, out = _run(dataset, "-R", "2")
    assert code == 1 and "equal work: FAILED" in out and "rank 1 yields 3 samples" in out


def test_plan_over_s3(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(Store(s3.url("ds"), s3.storage_options()))
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    code, out = _run(s3.url("ds"), "-R", "3", "-W", "2", "--json")
    assert code == 0, out
    rep = json.loads(out)
    assert rep["samples_per_rank"] == 35 and rep["padding"] == 2 and len(_coverage(rep)) == N


def test_a_mixture_shows_each_source_per_rank(dataset: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = str(tmp_path / "other")
    _write(other)
    code, out = _run(f"{dataset}:3", f"{other}:1", "-R", "2", "-W", "2", "-B", "4", "--epoch-samples", "100", "--json")
    assert code == 0, out
    rep = json.loads(out)
    assert rep["url"] is None and [s["samples_per_epoch"] for s in rep["sources"]] == [75, 25]
    assert [s["weight"] for s in rep["sources"]] == [3.0, 1.0]
    assert {sum(r["per_source"]) for r in rep["ranks"]} == {rep["samples_per_rank"]}
    assert [sum(r["per_source"][i] for r in rep["ranks"]) for i in range(2)] == [75, 25]  # 100 = 2 x 50: no tail
    assert rep["checks"] == {"exactly_once": True, "equal_work": True}
    code, text = _run(f"{dataset}:3", f"{other}:1", "-R", "2", "--epoch-samples", "100")
    assert code == 0 and "mixture   2 sources" in text and "weight 3, 75 samples per epoch" in text
    code, text = _run(f"{dataset}:-1", "-R", "2")
    assert code == 2 and "must be a number > 0" in text


def test_plan_uses_the_datasets_default_shuffle(dataset: str) -> None:
    rep = json.loads(_run(dataset, "-R", "1", "--json")[1])
    assert rep["shuffle"] == {"shards": True, "window": 256, "interleave": 32}
