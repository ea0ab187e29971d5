"""Shuffle quality: how mixed the batches are that each loader delivers, measured on orders (no I/O).

Run: ``.venv/bin/python -m benchmarks.bench_shuffle [--quick] [--peers mosaicml,litdata] [--json OUT]``
(or as the ``shuffle`` section of ``python -m benchmarks.run``; ``--quick`` skips the peers).

Data set: 64 shards x 100 samples (6,400), shards sorted by class: shard ``s`` holds only class
``s * 10 // 64`` (10 classes, 6-7 shards each), as when shards are written one category at a time.
Batch 32; topologies ``ranks x DataLoader workers``: 1 x 2, 2 x 2 and (full mode) 8 x 4, where each
worker's share is only 2 shards. For every loader, the order in which each rank's DataLoader
delivers samples is computed, cut into that rank's batches, and measured:

* **distinct shards / batch** and **distinct classes / batch**: mean and 10th percentile over all
  batches of all ranks (iid sampling gives ~25.3 of 64 shards and ~9.7 of 10 classes);
* **displacement**: mean ``|delivered position - index position| / samples``, where the delivered
  position is in training-step order (step ``t`` of rank ``r`` follows step ``t`` of ranks ``< r``)
  and the index position is the sample's place in index order (shards in order). 0 = index order,
  1/3 = a uniformly random permutation. With several ranks even index order scores above 0: rank 1
  starts in the middle of the data set.

Loaders (each computed with the library's own code where it exists):

* ``streamio Shuffle()`` (the default), ``Shuffle(interleave=1)`` (the previous default) and
  ``Shuffle.off()``: :meth:`streamio.data.plan.EpochPlan.rank_order`.
* ``webdataset``: ``WebDataset(shardshuffle=100)`` + ``.shuffle(1000)``, rebuilt from webdataset's
  own stages: ``split_by_node`` and ``split_by_worker`` (its shard split, by index, before the shard
  shuffle as in webdataset 1.0), the ``shuffle`` filter over the shard list and over an in-memory
  iterator of the samples (a 1,000-sample buffer per worker, 100 before the first yield),
  ``batched(32)``, then the DataLoader's round-robin over workers.
* ``mosaicml py1e``: mosaicml-streaming's ``get_partitions`` (``relaxed``) and ``get_shuffle``
  (``py1e``) exactly as its ``random`` batching method calls them, in its own environment
  (``.venv-peers/mosaicml``): defaults ``num_canonical_nodes`` = physical nodes = 1 and block
  ``max(4,000,000 // 1, 262,144)`` = 4 M samples, i.e. larger than this data set (the shuffle then
  spans every shard). A second row uses a block of 512 samples: the same fraction of the data set
  as the default block of a 50 M-sample data set (what a large job sees).
* ``litdata shuffle=True``: litdata's ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``
  over a 64-chunk copy written by its own ``optimize``, iterated for real in its own environment
  (``.venv-peers/litdata``; ``LITDATA_POSIX_FAST=0`` so it plans as for an object store; its
  distributed environment set per rank).
* ``iid``: a uniform random permutation cut into ranks and batches (the reference).

The orders need no storage: quality is a property of the plan. What each order costs in reads and
memory is stated beside it (``reads`` column).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SHARDS, PER_SHARD, CLASSES, BATCH = 64, 100, 10, 32
SEEDS = (0, 1, 2)
TOPOLOGIES = ((1, 2), (2, 2), (8, 4))
QUICK_TOPOLOGIES = ((1, 2), (2, 2))
PEERS = ("mosaicml", "litdata")
MOSAIC_SCALED_BLOCK = 512  # 4 M / 50 M samples x 6,400 samples
REPO = Path(__file__).resolve().parents[1]

Batches = list[list[list[int]]]
"""Per rank, its batches in delivery order, each a list of global sample ids (index order)."""

READS = {
    "streamio Shuffle() (default)": "32 sequential shard reads open per worker (interleave=32); 256-sample window",
    "streamio Shuffle(interleave=1)": "1 sequential shard read per worker; 256-sample window",
    "streamio Shuffle.off()": "1 sequential shard read per worker; no buffer",
    "webdataset shardshuffle + shuffle(1000)": "1 sequential shard read per worker; 1,000-sample buffer",
    "mosaicml py1e (default block)": "whole shards downloaded, random access; block 4 M samples "
                                     "(here: every shard of the data set in cache)",
    f"mosaicml py1e (block {MOSAIC_SCALED_BLOCK})": "whole shards downloaded, random access; ~5 shards per block",
    "litdata shuffle=True": "whole chunks downloaded; chunk order shuffled, items shuffled within a chunk",
    "iid (reference)": "random access to every sample",
}


def counts() -> np.ndarray:
    """Samples per shard, index order."""
    return np.full(SHARDS, PER_SHARD, dtype=np.int64)


def shard_class(shard: np.ndarray) -> np.ndarray:
    """The class of every sample of a shard (shards are sorted by class)."""
    return shard * CLASSES // SHARDS


def _batched(order: Sequence[int], size: int = BATCH) -> list[list[int]]:
    return [list(order[i:i + size]) for i in range(0, len(order), size)]


def _round_robin(per_worker: Sequence[list[list[int]]]) -> list[list[int]]:
    """A DataLoader's batch order: one batch from each worker in turn, skipping exhausted workers."""
    out: list[list[int]] = []
    for t in range(max((len(b) for b in per_worker), default=0)):
        out.extend(b[t] for b in per_worker if t < len(b))
    return out


# ----------------------------------------------------------------------------- loaders (this environment)
def streamio_batches(shuffle: Any, world: int, workers: int, seed: int) -> Batches:
    """Each rank's delivered batches under ``streamio`` :class:`~streamio.data.plan.Shuffle` ``shuffle``."""
    from streamio.data.plan import Sampling, Topology, plan_epoch

    c = counts()
    base = np.concatenate(([0], np.cumsum(c)))
    plan = plan_epoch(c, seed=seed, epoch=0, topology=Topology(world, workers, BATCH), sampling=Sampling(shuffle))
    return [_batched([int(base[s]) + i for s, i in plan.rank_order(r)]) for r in range(world)]


@contextlib.contextmanager
def _wds_worker(rank: int, world: int, worker: int, workers: int) -> Iterator[None]:
    """The environment webdataset's ``pytorch_worker_info`` reads (set for this block only)."""
    keys = {"RANK": rank, "WORLD_SIZE": world, "WORKER": worker, "NUM_WORKERS": workers}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: str(v) for k, v in keys.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def webdataset_batches(world: int, workers: int, seed: int, buffer: int = 1000) -> Batches:
    """``WebDataset(shardshuffle=100, nodesplitter=split_by_node)`` + ``.shuffle(buffer)`` + ``batched``."""
    import webdataset as wds

    c = counts()
    base = np.concatenate(([0], np.cumsum(c)))

    def samples(src: Iterator[dict[str, Any]]) -> Iterator[int]:  # what the tar expander yields, per shard
        for item in src:
            s = item["url"]
            yield from range(int(base[s]), int(base[s + 1]))

    out: Batches = []
    for rank in range(world):
        per_worker = []
        for w in range(workers):
            with _wds_worker(rank, world, w, workers):
                pipe = wds.DataPipeline(
                    lambda: iter([{"url": s} for s in range(SHARDS)]),
                    wds.split_by_node, wds.split_by_worker,
                    wds.shuffle(100, seed=seed),  # WebDataset(shardshuffle=100): its seed, in every worker
                    samples,
                    wds.shuffle(buffer, rng=random.Random(f"{seed}/{rank}/{w}")),  # each worker its own rng
                    wds.batched(BATCH, collation_fn=list, partial=True),
                )
                per_worker.append([list(b) for b in pipe])
        out.append(_round_robin(per_worker))
    return out


def iid_batches(world: int, workers: int, seed: int) -> Batches:
    """A uniform random permutation of the epoch, rank ``r`` taking every ``world``-th sample."""
    perm = np.random.default_rng([seed, 99]).permutation(SHARDS * PER_SHARD)
    return [_batched(perm[r::world].tolist()) for r in range(world)]


# ----------------------------------------------------------------------------- loaders (peer environments)
def mosaicml_batches(world: int, workers: int, seed: int, block: int | None = None) -> Batches:
    """mosaicml-streaming's own partition + py1e shuffle, as its ``random`` batching applies them.

    Runs in mosaicml's environment. ``block`` None: its default for 1 physical node.
    """
    from streaming.base.partition import get_partitions
    from streaming.base.shuffle import get_shuffle

    c = counts()
    ncn = 1  # StreamingDataset: num_canonical_nodes defaults to the physical nodes for py1e
    block = max(4_000_000 // ncn, 1 << 18) if block is None else block
    ids = get_partitions("relaxed", int(c.sum()), ncn, 1, world, workers, BATCH, 0, None)
    shuffle = get_shuffle("py1e", c, ncn, seed, 0, block)
    ids = np.where(ids != -1, shuffle[ids], -1)
    out: Batches = []
    for r in range(world):
        # a worker yields its flattened ids minus the -1 padding; its DataLoader batches them
        per_worker = [_batched([int(x) for x in ids[0, r, w].ravel() if x != -1]) for w in range(workers)]
        out.append(_round_robin(per_worker))
    return out


def litdata_batches(world: int, workers: int, seed: int, root: str) -> Batches:
    """litdata ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``, iterated (its environment).

    The data set (``root``) is written once by :func:`litdata_write`; each sample holds its global id.
    """
    os.environ["LITDATA_POSIX_FAST"] = "0"  # plan as for an object store (FullShuffle), not a local mount
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.utilities.env import _DistributedEnv

    out: Batches = []
    for rank in range(world):
        ds = StreamingDataset(root, shuffle=True, seed=seed, drop_last=False)
        ds.distributed_env = _DistributedEnv(world, rank, 1)
        # fork, as a Linux DataLoader does by default (optimize() switched this process to spawn)
        loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, shuffle=True,
                                     multiprocessing_context="fork")
        out.append([[int(x) for x in batch["id"]] for batch in loader])
    return out


def litdata_write(root: str) -> None:
    """The 64-shard data set as litdata chunks of 100 samples (``optimize``, one chunk per shard)."""
    from litdata import optimize

    optimize(fn=_litdata_sample, inputs=list(range(SHARDS * PER_SHARD)), output_dir=root, chunk_size=PER_SHARD,
             num_workers=1, mode="overwrite")


def _litdata_sample(i: int) -> dict[str, int]:
    return {"id": i}


def _peer_main(peer: str, topologies: list[tuple[int, int]], seeds: list[int]) -> dict[str, Any]:
    """The orders of ``peer`` (run in its environment): ``{loader name: {"WxK": [per seed: Batches]}}``."""
    out: dict[str, dict[str, list[Batches]]] = {}
    if peer == "mosaicml":
        for name, block in (("mosaicml py1e (default block)", None),
                            (f"mosaicml py1e (block {MOSAIC_SCALED_BLOCK})", MOSAIC_SCALED_BLOCK)):
            out[name] = {f"{w}x{k}": [mosaicml_batches(w, k, s, block) for s in seeds] for w, k in topologies}
    elif peer == "litdata":
        with tempfile.TemporaryDirectory(prefix="bench-shuffle-litdata-") as root:
            litdata_write(os.path.join(root, "ds"))
            out["litdata shuffle=True"] = {
                f"{w}x{k}": [litdata_batches(w, k, s, os.path.join(root, "ds")) for s in seeds] for w, k in topologies
            }
    else:
        raise ValueError(f"unknown peer {peer!r}; choose from {PEERS}")
    return out


def peer_orders(peer: str, topologies: Sequence[tuple[int, int]], seeds: Sequence[int],
                log: Callable[[str], None]) -> dict[str, dict[str, list[Batches]]]:
    """Run :func:`_peer_main` in the peer's environment (built from ``benchmarks/peers/PEER.txt`` once)."""
    from benchmarks import peer_env

    exe = peer_env.python(peer, log=log)
    args = [str(exe), "-m", "benchmarks.bench_shuffle", "--peer-orders", peer,
            "--topologies", ",".join(f"{w}x{k}" for w, k in topologies), "--seeds", ",".join(map(str, seeds))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RANK", "WORLD_SIZE"))}
    proc = subprocess.run(args, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{peer} orders: `{' '.join(args[1:])}` exited {proc.returncode}: {proc.stderr[-1500:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


# ----------------------------------------------------------------------------- measures
def quality(runs: Sequence[Batches]) -> dict[str, Any]:
    """Distinct shards and classes per batch (mean, p10) and mean displacement, over ``runs`` (seeds)."""
    base = np.concatenate(([0], np.cumsum(counts())))
    shards_n, classes_n, disp = [], [], []
    for ranks in runs:
        steps = max(len(b) for b in ranks)
        delivered = [x for t in range(steps) for b in ranks if t < len(b) for x in b[t]]
        total = len(delivered)
        disp.append(float(np.mean(np.abs(np.asarray(delivered) - np.arange(total)))) / total)
        for batches in ranks:
            for batch in batches:
                shard = np.searchsorted(base, np.asarray(batch), side="right") - 1
                shards_n.append(np.unique(shard).size)
                classes_n.append(np.unique(shard_class(shard)).size)
    return {
        "shards_mean": float(np.mean(shards_n)), "shards_p10": float(np.percentile(shards_n, 10)),
        "classes_mean": float(np.mean(classes_n)), "classes_p10": float(np.percentile(classes_n, 10)),
        "displacement": float(np.mean(disp)), "batches": len(shards_n), "seeds": len(runs),
    }


def _local_loaders() -> dict[str, Callable[[int, int, int], Batches]]:
    from streamio.data.plan import Shuffle

    return {
        "streamio Shuffle() (default)": lambda w, k, s: streamio_batches(Shuffle(), w, k, s),
        "streamio Shuffle(interleave=1)": lambda w, k, s: streamio_batches(Shuffle(interleave=1), w, k, s),
        "streamio Shuffle.off()": lambda w, k, s: streamio_batches(Shuffle.off(), w, k, s),
        "webdataset shardshuffle + shuffle(1000)": webdataset_batches,
        "iid (reference)": iid_batches,
    }


def run(quick: bool = False, peers: Sequence[str] = PEERS, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every loader on every topology: ``{"setup", "rows": [...], "not_measured": {peer: why}}``.

    ``peers``: which of :data:`PEERS` to run from their environments (``quick`` runs none).
    """
    topologies = list(QUICK_TOPOLOGIES if quick else TOPOLOGIES)
    seeds = list(SEEDS[:1] if quick else SEEDS)
    orders: dict[str, dict[str, list[Batches]]] = {
        name: {f"{w}x{k}": [fn(w, k, s) for s in seeds] for w, k in topologies} for name, fn in _local_loaders().items()
    }
    not_measured: dict[str, str] = {}
    for peer in PEERS:
        if quick or peer not in peers:
            not_measured[peer] = ("--quick skips the peers' environments" if quick else
                                  f"not requested (`--peers {','.join(PEERS)}` runs it in its own environment)")
            continue
        try:
            orders.update(peer_orders(peer, topologies, seeds, log))
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, the rest still measured
            not_measured[peer] = f"failed: {type(exc).__name__}: {exc}"[-600:]
            log(f"shuffle: {peer} not measured: {not_measured[peer]}")
    local = [*_local_loaders()]
    order = local[:-1] + [n for n in orders if n not in local] + local[-1:]  # peers before the iid reference
    rows = []
    for name in order:
        for topo, runs in orders[name].items():
            rows.append({"loader": name, "topology": topo, **quality(runs), "reads": READS.get(name, "")})
    return {"setup": {"shards": SHARDS, "samples_per_shard": PER_SHARD, "classes": CLASSES, "batch_size": BATCH,
                      "seeds": seeds, "topologies": [f"{w}x{k}" for w, k in topologies]},
            "rows": rows, "not_measured": not_measured}


# ----------------------------------------------------------------------------- plot
def plot(sec: dict[str, Any], out_dir: Path, plt: Any, footer: str) -> list[str]:
    """``shuffle_quality.png``: distinct shards and classes per batch, per loader and topology."""
    rows = sec["rows"]
    topos = sec["setup"]["topologies"]
    names = list(dict.fromkeys(r["loader"] for r in rows))
    by = {(r["loader"], r["topology"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(names) * len(topos) / 2 + 2.2), sharey=True)
    height = 0.8 / len(topos)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple"]
    for ax, (key, label, iid) in zip(axes, (("shards", "distinct shards per batch of 32 (of 64)", 25.3),
                                            ("classes", "distinct classes per batch of 32 (of 10)", 9.7)),
                                     strict=True):
        for j, topo in enumerate(topos):
            ys = [i + (j - (len(topos) - 1) / 2) * height for i in range(len(names))]
            got = [by.get((n, topo)) for n in names]
            ax.barh(ys, [g[f"{key}_mean"] if g else 0 for g in got], height=height, color=colors[j % len(colors)],
                    label=f"{topo.replace('x', ' x ')} ranks x workers (bar: mean, tick: p10)")
            ax.scatter([g[f"{key}_p10"] if g else 0 for g in got], ys, marker="|", color="black", s=60, zorder=3)
        ax.axvline(iid, color="red", linestyle="--", linewidth=1)
        ax.text(iid, -0.6, " iid", color="red", fontsize=8, va="bottom")
        ax.set_xlabel(label)
    axes[0].set_yticks(range(len(names)), names, fontsize=8)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(topos), fontsize=7, bbox_to_anchor=(0.5, 0.02))
    s = sec["setup"]
    fig.suptitle(f"Shuffle quality: {s['shards']} shards x {s['samples_per_shard']} samples sorted by class "
                 f"({s['classes']} classes), batch {s['batch_size']}, seeds {s['seeds']}", fontsize=10)
    fig.text(0.01, 0.005, footer, fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out_dir / "shuffle_quality.png", dpi=110)
    plt.close(fig)
    return ["shuffle_quality.png"]


# ----------------------------------------------------------------------------- entry point
def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (t.split("x") for t in text.split(",") if t)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="one seed, 1x2 and 2x2, no peers")
    ap.add_argument("--peers", default=",".join(PEERS), help="peers run from their own environments")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--peer-orders", help=argparse.SUPPRESS)  # child mode, in a peer's environment
    ap.add_argument("--topologies", default="1x2,2x2", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", default="0", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer_orders:
        res = _peer_main(args.peer_orders, _pairs(args.topologies), [int(s) for s in args.seeds.split(",")])
        print(json.dumps(res, separators=(",", ":")))
        return
    sys.path.insert(0, str(REPO))
    from benchmarks.common import emit_json  # after the path: this file also runs in the peers' environments
    out = run(args.quick, [p for p in args.peers.split(",") if p], log=lambda s: print(s, file=sys.stderr, flush=True))
    emit_json(out, args.json, indent=1)


if __name__ == "__main__":
    main()
