"""CLI start-up: wall time of fresh ``streamio`` processes, per command, against its budget.

Run: ``.venv/bin/python benchmarks/bench_cli.py`` (``--runs N``, default 7; ``--entry module`` to
time ``python -m streamio.cli.main`` instead of the installed ``streamio`` script).

Budgets (issue 18): ``streamio --help`` and ``--version`` under 0.3 s; every verb's own start-up,
before it touches storage, under 0.6 s. A verb's start-up is measured as the whole run of the verb
on a tiny local dataset or checkpoint root (7 samples, 3 checkpoints of a 4x2 model) made once
before timing: reading a few KB from local disk costs milliseconds, so the figure is the start-up
plus a negligible read. The commands run round-robin (every one once per round, rounds rotated),
each in a fresh process, so a noisy moment on a shared machine hurts all alike; the table gives
the median, min and max of the rounds, the median CPU time (user + system) of the process, and
whether the median wall time is within the budget. Interpreter start-up alone (``python -c
pass``) is the floor, shown first. On a loaded machine the wall times swell with the load; the
CPU times do much less.

Why a benchmark and not a timed test: on a shared 2-core machine a single start-up varies by
2-3x; tests/cli/test_cli_startup.py instead checks what makes start-up fast (no torch, numpy or
fsspec imported by ``--help``), which does not depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HELP_BUDGET_S = 0.3
VERB_BUDGET_S = 0.6


def _fixtures(tmp: Path) -> dict[str, str]:
    """A tiny dataset, a JSONL file and a checkpoint root (made here, untimed)."""
    import torch

    from streamio.checkpoint import CheckpointManager, KeepLast
    from streamio.data.write.writer import ShardSpec, write_dataset

    ds = str(tmp / "ds")
    write_dataset(({"__key__": f"{i:03d}", "txt": f"sample {i}"} for i in range(7)), ds, spec=ShardSpec(max_count=3))
    (tmp / "in.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(7)))
    ckpt = str(tmp / "ckpt")
    with CheckpointManager(ckpt, retention=KeepLast(5), async_save=False) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"model": torch.nn.Linear(4, 2)})
    return {"ds": ds, "jsonl": str(tmp / "in.jsonl"), "out": str(tmp / "out"), "ckpt": ckpt}


def commands(f: dict[str, str]) -> list[tuple[str, list[str], float]]:
    """``(name, argv after the entry point, budget)`` of every command timed."""
    return [
        ("--version", ["--version"], HELP_BUDGET_S),
        ("--help", ["--help"], HELP_BUDGET_S),
        ("shard --help", ["shard", "--help"], HELP_BUDGET_S),
        ("shard", ["shard", f["jsonl"], f["out"], "--overwrite"], VERB_BUDGET_S),
        ("index", ["index", f["ds"]], VERB_BUDGET_S),
        ("ls", ["ls", f["ds"]], VERB_BUDGET_S),
        ("inspect", ["inspect", f["ds"]], VERB_BUDGET_S),
        ("verify", ["verify", f["ds"]], VERB_BUDGET_S),
        ("plan", ["plan", f["ds"], "-R", "2"], VERB_BUDGET_S),
        ("ckpt ls", ["ckpt", "ls", f["ckpt"]], VERB_BUDGET_S),
        ("ckpt inspect", ["ckpt", "inspect", f["ckpt"]], VERB_BUDGET_S),
        ("ckpt verify", ["ckpt", "verify", f["ckpt"]], VERB_BUDGET_S),
        ("ckpt gc", ["ckpt", "gc", f["ckpt"], "--dry-run"], VERB_BUDGET_S),
        ("ckpt rm", ["ckpt", "rm", f["ckpt"], "1", "--dry-run"], VERB_BUDGET_S),
    ]


def _entry(kind: str) -> list[str]:
    script = Path(sys.executable).with_name("streamio")
    if kind == "script" and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "streamio.cli.main"]


def _time(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=7, help="rounds (each command once per round)")
    parser.add_argument("--entry", choices=["script", "module"], default="script",
                        help="the installed `streamio` script, or `python -m streamio.cli.main`")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    try:
        fixtures = _fixtures(tmp)
        entry = _entry(args.entry)
        todo = [("python -c pass", [sys.executable, "-c", "pass"], 0.0)]
        todo += [(name, entry + argv, budget) for name, argv, budget in commands(fixtures)]
        times: dict[str, list[float]] = {name: [] for name, _, _ in todo}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in todo}
        for r in range(args.runs):
            k = r % len(todo)
            for name, argv, _ in todo[k:] + todo[:k]:
                wall, used = _time(argv)
                times[name].append(wall)
                cpu[name].append(used)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"entry: {' '.join(entry)}; {args.runs} runs each; {os.cpu_count()} CPUs, load average {load:.1f}")
    print(f"{'command':<16} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7} {'budget s':>9}  ok")
    failed = 0
    for name, _, budget in todo:
        med = statistics.median(times[name])
        ok = "-" if not budget else ("yes" if med <= budget else "NO")
        failed += ok == "NO"
        print(f"{name:<16} {med:>9.3f} {min(times[name]):>7.3f} {max(times[name]):>7.3f} "
              f"{statistics.median(cpu[name]):>7.3f} {budget or float('nan'):>9.1f}  {ok}")
    print(f"{failed} over budget" if failed else "all within budget")
    if load > (os.cpu_count() or 1):
        print(f"(load average {load:.1f} on {os.cpu_count()} CPUs: wall times are inflated; 'cpu s' is the "
              f"process's own user + system time, steadier on a shared machine)")


if __name__ == "__main__":
    main()
