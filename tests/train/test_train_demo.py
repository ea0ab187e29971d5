"""The demo's verdict: compare() says IDENTICAL only when every step's loss and every weight match."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from streamio.train.demo import compare


def _run(
    root: Path, name: str, steps: range, *,
    loss_of=lambda s, r: 1.0 / s + r, weight: float = 1.0, resume: int | None = None,
) -> Path:
    out = root / name
    out.mkdir(parents=True)
    for rank in (0, 1):
        lines = [{"event": "resume", "step": resume, "epoch": 0}] if resume is not None else []
        lines += [{"event": "step", "step": s, "epoch": 0, "loss": loss_of(s, rank)} for s in steps]
        lines += [{"event": "val", "epoch": 0, "val_loss": 0.5, "val_accuracy": 0.9}]
        (out / f"rank-{rank:05d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    torch.save({"w": torch.full((3,), weight)}, out / "final_model.pt")
    return out


def test_identical_runs_are_reported_identical(tmp_path: Path) -> None:
    ok, lines = compare(_run(tmp_path, "ref", range(1, 11)), _run(tmp_path, "crash", range(1, 7)),
                        _run(tmp_path, "resumed", range(5, 11), resume=4), 2)
    assert ok and "IDENTICAL" in lines[-2] and "resumed from latest.json at step 4" in "\n".join(lines)


def test_a_different_loss_weight_or_missing_step_is_reported(tmp_path: Path) -> None:
    ref = _run(tmp_path, "ref", range(1, 11))
    crash = _run(tmp_path, "crash", range(1, 7))
    bad_loss = _run(tmp_path, "bad-loss", range(5, 11), resume=4, loss_of=lambda s, r: 1.0 / s + r + (s == 9) * 1e-7)
    bad_weight = _run(tmp_path, "bad-weight", range(5, 11), resume=4, weight=1.0 + 1e-6)
    gap = _run(tmp_path, "gap", range(8, 11), resume=7)
    assert not compare(ref, crash, bad_loss, 2)[0]
    ok, lines = compare(ref, crash, bad_weight, 2)
    assert not ok and "max |difference|" in lines[5]
    ok, lines = compare(ref, crash, gap, 2)
    assert not ok and "MISSING steps [7]" in "\n".join(lines)


def test_demo_data_shards_into_any_url_and_reads_back_as_the_synthetic_arrays(tmp_path: Path) -> None:
    import numpy as np

    from streamio.train.data import make_arrays, read_arrays
    from streamio.train.demo import _location, shard_demo_data

    with _location(str(tmp_path / "bucket")) as loc:  # --url: no local S3, the user's environment
        assert loc.storage_options is None and loc.url == str(tmp_path / "bucket")
        data = shard_demo_data(loc, train=300, val=41, per_shard=64)
    x, y = read_arrays(f"{data}/train")
    ex, ey = make_arrays(300, split="train")
    assert np.array_equal(x, ex) and np.array_equal(y, ey)
    assert len(list((tmp_path / "bucket" / "data" / "train").glob("train-*.tar"))) == 5
