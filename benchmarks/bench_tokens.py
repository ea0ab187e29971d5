"""Token packing at read time: streamio ``Pack`` vs litdata ``TokensLoader``, same tokens, same loop.

Run: ``.venv/bin/python -m benchmarks.bench_tokens [--quick] [--json OUT] [--peers litdata]`` (or as
the ``tokens`` section of ``python -m benchmarks.run --only tokens --peers litdata``).

Data: ``docs`` documents of random lengths (uniform 50-4,000 tokens, uint16 ids below 50,257), the
same arrays for both contenders: streamio writes them with ``write_dataset`` (one ``.npy`` per
document, token counts in the index) and packs at read time with ``Pack(seq_len=2048, eos=0,
targets=True)``; litdata's ``optimize`` writes the same documents, each followed by the same EOS
token, with ``item_loader=TokensLoader()`` and reads blocks of ``block_size=2049`` (what its docs
use for seq_len 2048). Both from local disk (``file://`` / a local ``input_dir``), so the figures are
the loaders' CPU and not a network's; shard order unshuffled for both.

Loop: each contender in its own process (litdata in its own environment, ``.venv-peers/litdata``),
``StreamingDataLoader(batch_size=8, num_workers=2)``, one full epoch, no simulated compute.
Figures: tokens/s delivered (wall time from ``iter()`` to the last batch, worker start-up
included), CPU seconds (the process and its reaped DataLoader workers, ``getrusage``) per GB of
delivered tokens (int64 for streamio, litdata's as it delivers them: counted as 2 bytes a token
for both, the stored size), and the resume state's size in bytes after 1M tokens (measured, both)
and after 1B tokens (computed for streamio: the same plan over 1B tokens' counts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import emit_json, summary  # noqa: E402

SEQ_LEN, BATCH, WORKERS, EOS = 2048, 8, 2, 0
HERE = Path(__file__).resolve().parent


def make_tokens(root: Path, docs: int, seed: int = 0) -> dict[str, Any]:
    """The documents as ``tokens.npy`` (concatenated, uint16) and ``lengths.npy``: both contenders read these."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 4000, size=docs)
    tokens = rng.integers(1, 50257, size=int(lengths.sum()), dtype=np.uint16)
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "tokens.npy", tokens)
    np.save(root / "lengths.npy", lengths)
    return {"docs": docs, "tokens": int(lengths.sum())}


def write_streamio(src: Path, url: str) -> None:
    import io

    import numpy as np

    import streamio

    tokens, lengths = np.load(src / "tokens.npy"), np.load(src / "lengths.npy")
    starts = np.concatenate(([0], np.cumsum(lengths)))

    def samples() -> Any:
        for i in range(len(lengths)):
            buf = io.BytesIO()
            np.save(buf, tokens[starts[i] : starts[i + 1]])
            yield {"__key__": f"{i:09d}", "npy": buf.getvalue()}

    streamio.write_dataset(samples(), url, spec=streamio.ShardSpec(max_bytes=64 << 20))


def read_streamio(url: str, stop_tokens: int | None = None) -> dict[str, Any]:
    """One epoch (or up to ``stop_tokens``) of packed sequences; figures and the state."""
    import streamio

    ds = streamio.StreamingDataset(url, batch_size=BATCH, shuffle=False,
                                   pack=streamio.Pack(SEQ_LEN, eos=EOS, targets=True))
    loader = streamio.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    tokens, t0 = 0, time.perf_counter()
    for batch in loader:
        tokens += batch["tokens"].numel()
        if stop_tokens is not None and tokens >= stop_tokens:
            break
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "state_bytes": len(json.dumps(loader.state_dict()))}


def state_at_1b() -> int:
    """Bytes of streamio's loader state after 1B tokens, computed: the same plan over 1B tokens' counts."""
    import numpy as np

    from streamio.data.plan import Pack, Topology, plan_packing
    from streamio.data.position import state_of

    counts = [np.full(1000, 1000, dtype=np.int64) for _ in range(1000)]  # 1e9 tokens in 1e6 documents
    plan = plan_packing(counts, pack=Pack(SEQ_LEN, eos=EOS, targets=True), seed=0, epoch=0,
                        topology=Topology(1, WORKERS, BATCH), shuffle=False, index_fingerprint="sha256:" + "0" * 64)
    batches = -(-10**9 // (BATCH * (SEQ_LEN + 1)))
    state = {"version": 1, "dataset": state_of(0, plan.state_dict(batches))}  # what StreamingDataLoader saves
    return len(json.dumps(state))


def _child(args: list[str], python: str = sys.executable) -> dict[str, Any]:
    """Run a contender's process; its JSON result plus the CPU seconds of it and its reaped children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=1800, cwd=HERE.parent)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:3]} exited {proc.returncode}: {proc.stderr[-1500:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def run(quick: bool, *, peers: list[str], log: Any = print, scratch_dir: str | None = None, reps: int = 3) -> dict:
    """The section's results (see the module docstring)."""
    docs = 2_000 if quick else 25_000
    reps = 1 if quick else reps
    with tempfile.TemporaryDirectory(dir=scratch_dir) as tmp:
        src = Path(tmp, "src")
        info = make_tokens(src, docs)
        url = f"file://{tmp}/streamio"
        log(f"  {info['tokens']:,} tokens in {docs:,} documents")
        _child(["-m", "benchmarks.bench_tokens", "--write-streamio", str(src), url])
        contenders: dict[str, list[str] | None] = {"streamio": None}
        lit_python = None
        if "litdata" in peers:
            from benchmarks.peer_env import python

            lit_python = str(python("litdata", log=log))
            _child([str(HERE / "peer_litdata_tokens.py"), "convert", str(src), f"{tmp}/litdata"], lit_python)
            contenders["litdata"] = []
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
        for rep in range(reps):
            for name in contenders:
                if name == "streamio":
                    r = _child(["-m", "benchmarks.bench_tokens", "--read-streamio", url])
                else:
                    r = _child([str(HERE / "peer_litdata_tokens.py"), "read", f"{tmp}/litdata"], lit_python or "")
                log(f"  rep {rep} {name}: {r['tokens'] / r['wall_s'] / 1e6:.2f} M tokens/s, {r['cpu_s']:.1f} CPU s")
                rows[name].append(r)
        states = {"streamio": _child(["-m", "benchmarks.bench_tokens", "--read-streamio", url, "--stop", "1000000"])}
        if lit_python:
            states["litdata"] = _child([str(HERE / "peer_litdata_tokens.py"), "read", f"{tmp}/litdata", "--stop",
                                        "1000000"], lit_python)
    out: dict[str, Any] = {"data": info, "seq_len": SEQ_LEN, "batch_size": BATCH, "workers": WORKERS, "contenders": {}}
    for name, rs in rows.items():
        gb = [r["tokens"] * 2 / 1e9 for r in rs]
        out["contenders"][name] = {
            "tokens_per_s": summary([r["tokens"] / r["wall_s"] for r in rs]),
            "cpu_s_per_gb": summary([r["cpu_s"] / g for r, g in zip(rs, gb, strict=True)]),
            "tokens": rs[0]["tokens"],
            "state_bytes_1m": states[name]["state_bytes"],
        }
    out["contenders"]["streamio"]["state_bytes_1b"] = state_at_1b()
    if "litdata" not in peers:
        out["litdata_skipped"] = "not asked for: --peers litdata runs it from .venv-peers/litdata"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--peers", default="")
    ap.add_argument("--write-streamio", nargs=2, metavar=("SRC", "URL"), help=argparse.SUPPRESS)
    ap.add_argument("--read-streamio", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write_streamio:
        write_streamio(Path(args.write_streamio[0]), args.write_streamio[1])
        print("{}")
    elif args.read_streamio:
        print(json.dumps(read_streamio(args.read_streamio, args.stop)))
    else:
        peers = [p for p in args.peers.split(",") if p]
        emit_json(run(args.quick, peers=peers, log=lambda m: print(m, file=sys.stderr, flush=True)), args.json)


if __name__ == "__main__":
    main()
