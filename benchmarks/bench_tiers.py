"""Checkpoint tiers (issue 25): the local tier against its references, in one interleaved run.

Run: ``.venv/bin/python -m benchmarks.bench_tiers [--quick] [--size-mb 300] [--reps 5] [--json OUT]``
(or the ``tiers`` section of ``python -m benchmarks.run``).

State: :func:`benchmarks.bench_checkpoint.build_state` (an MLP of 2048-wide layers + Adam, moments
filled) of ``--size-mb``. The durable root is S3: moto in a child process behind a FaultProxy
with 30 ms first-byte latency per response (:class:`benchmarks.common.S3Servers`). Local tiers
live in a directory on the disk (``--dir``, default a temp directory) and, when it has room, in
``/dev/shm`` (a RAM tier).

The machine is shared and its load swings within a minute (a plain memory copy took 0.03 s and
0.15 s in one run), so what a ratio compares runs back to back: each comparison is a *group* whose
members run one after the other, in an order that rotates each repetition, and each ratio is the
median of the per-round ratios (a round = one run of every member). The groups themselves are
interleaved (A B C, B C A, ...), after one untimed warm-up round each (the first write into fresh
memory is slow on these VMs):

1. ``local.disk`` / ``local.shm``: ``save(step, state, durable="local")`` then ``wait()`` with a
   ``LocalTier`` there. ``commit``: from the end of the host copy (``SaveStats.blocked_s``) to
   ``latest.json`` written (the ``on_phase`` hook's ``"local-pointer"``), the local commit;
   ``SaveStats.local_s`` also counts the host copy and the local retention that follows.
   ``ceiling.*``: the same bytes cut into as many files as the tier writes parts, one thread each,
   each file fsync'd, then the directory; ``ceiling.*.seq``: one file, written and fsync'd. Ratio:
   the commit against the faster ceiling of its round (target <= 1.2).
2. ``restore.local``: ``restore(state)`` by a manager with a ``LocalTier`` whose newest save is on
   disk and in the root; ``restore.s3``: the same save by a manager without one (the root alone);
   ``pointer.get``: one round trip to the root. Requests through the proxy are counted from its
   log (part GETs: 0 is the target for the local restore).
3. ``save.tier`` / ``save.root`` / ``copy``: the wall time of ``save(step, state)`` (and
   ``SaveStats.blocked_s``; then ``wait()`` until the root's pointer names it) with a local tier
   and ``durable_every=1`` vs without a tier, both to S3, and the host copy alone (the state's
   tensors into reused buffers), three rounds a repetition.
4. ``loop.none`` / ``loop.tier`` / ``loop.root``: a real training loop (forward, backward, Adam
   step on a batch of 16) of ``10 x --every`` steps, saving every ``--every`` steps: no checkpoint,
   a local tier with ``durable_every=10`` (one upload per loop), no tier (every save uploaded).
   Seconds in ``save`` per step (the loop's pause) and the loop's wall time (without the final
   ``wait``, reported apart as ``drain``).

The page cache is warm for the local restore (a process restarting on a healthy node finds it so;
the caches are not dropped: other jobs share this machine). moto is slow (uploads ~0.15 GB/s,
downloads ~1 GB/s), so the S3 side of each ratio is moto's; docs/design.md "Measured behaviour".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_checkpoint import build_state, state_bytes  # noqa: E402
from benchmarks.common import (  # noqa: E402
    MB,
    S3Servers,
    clean_aws_env,
    interleave,
    machine,
    machine_line,
    phase_seconds,
    ratio,
    summary,
)
from streamio.checkpoint import CheckpointManager, KeepLast, LocalTier, SaveOptions  # noqa: E402
from streamio.checkpoint.save.parts import part_size_for  # noqa: E402

LATENCY = 0.03
SAVES_PER_REP = 3  # blocked times are short and noisy: several rounds per repetition
SETTLE_S = 0.2  # before each timed save: what the previous one left running (moto's side) settles
SAVES_PER_LOOP = 10
DURABLE_EVERY = 10


def shm_room(nbytes: int) -> str | None:
    """A directory in /dev/shm for a RAM tier of ``nbytes`` states, or None if it has no room."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    if free < 6 * nbytes:  # keep=2 local saves, one being written, the ceiling's files, margin
        return None
    return tempfile.mkdtemp(prefix="bench-tiers-", dir="/dev/shm")


def write_ceiling(directory: str, chunks: list[bytes], threads: int) -> float:
    """Seconds to write ``chunks`` as files (``threads`` at a time, each fsync'd, then the
    directory fsync'd); ``threads == 0``: all chunks into one file, one fsync. Files removed after."""
    os.makedirs(directory, exist_ok=True)

    def one(i: int, data: bytes) -> None:
        with open(f"{directory}/{i}", "wb", buffering=0) as f:
            f.write(data)
            os.fsync(f.fileno())

    t0 = time.perf_counter()
    if threads:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(chunks)), chunks))
    else:
        with open(f"{directory}/0", "wb", buffering=0) as f:
            for data in chunks:
                f.write(data)
            os.fsync(f.fileno())
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    dt = time.perf_counter() - t0
    shutil.rmtree(directory, ignore_errors=True)
    return dt


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=False)
    model(x).square().mean().backward()
    opt.step()


class Bench:
    """Every contender of one run: its managers, roots and recorded figures (see the module docstring)."""

    def __init__(self, servers: S3Servers, disk: str, shm: str | None, size_mb: int, every: int) -> None:
        from streamio.testing import S3Endpoint

        self.servers, self.disk, self.shm, self.every = servers, disk, shm, every
        self.model, self.opt = build_state(size_mb)
        self.nbytes = state_bytes(self.model, self.opt)
        self.state = {"model": self.model, "optim": self.opt}
        self.tensors = list(self.model.state_dict().values()) + [
            v for s in self.opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
        self.copy_bufs = [torch.empty_like(t) for t in self.tensors]
        self.x = torch.randn(16, 2048)
        # the proxy's endpoint: every request pays the 30 ms first-byte latency
        self.s3 = S3Endpoint(servers.proxies[0], servers.s3.bucket)
        self.results: dict[str, list[float]] = {}
        self.requests: dict[str, dict[str, list[int]]] = {}
        self.steps: dict[str, int] = {}
        self.marks: dict[tuple[str, str], float] = {}
        self.turns: dict[str, int] = {}
        self.parts = -(-self.nbytes // part_size_for(self.nbytes, SaveOptions(), local=True))
        blob = os.urandom(-(-self.nbytes // self.parts))
        self.chunks = [blob[: min(len(blob), self.nbytes - s)] for s in range(0, self.nbytes, len(blob))]
        self.managers = {
            "local.disk": self._manager("local-disk", f"{disk}/tier-local", 10**6),
            "save.tier": self._manager("save-tier", f"{disk}/tier-save", 1),
            "save.root": self._manager("save-root", None, 1),
            "loop.tier": self._manager("loop-tier", f"{disk}/tier-loop", DURABLE_EVERY),
            "loop.root": self._manager("loop-root", None, 1),
            "restore.local": self._manager("restore", f"{disk}/tier-restore", 1),
            "restore.s3": self._manager("restore", None, 1),
        }
        if shm is not None:
            self.managers["local.shm"] = self._manager("local-shm", f"{shm}/tier", 10**6)
        self.managers["restore.local"].save(1, self.state, durable=True)  # on the local tier and in the root
        self.managers["restore.local"].wait()

    def _manager(self, name: str, local: str | None, durable_every: int) -> CheckpointManager:
        def phase(p: str, key: str = name) -> None:  # when each commit phase completed
            self.marks[(key, p)] = time.perf_counter()

        return CheckpointManager(self.s3.url(f"tiers/{name}"), storage_options=self.s3.storage_options(),
                                 retention=KeepLast(1), options=SaveOptions(durable_every=durable_every),
                                 local=LocalTier(local, keep=2) if local is not None else None, on_phase=phase)

    def record(self, name: str, value: float) -> float:
        self.results.setdefault(name, []).append(value)
        return value

    def _next(self, name: str) -> int:
        self.steps[name] = self.steps.get(name, 0) + 1
        return self.steps[name]

    # ---------------------------------------------------------------- 1. local save vs ceiling
    def local_save(self, name: str) -> float:
        mgr = self.managers[name]
        key = name.replace(".", "-")
        before = phase_seconds()
        t0 = time.perf_counter()
        mgr.save(self._next(name), self.state, durable="local")
        stats = mgr.wait()
        outside = time.perf_counter() - t0
        spent = phase_seconds(before)  # streamio's own instruments, checked against this clock
        assert stats is not None and stats.local_s is not None and stats.durable_s is None
        assert spent["local"] <= outside + 1e-3 and abs(spent["local"] - stats.local_s) < 1e-6, (spent, stats)
        pointer = self.marks[(key, "local-pointer")] - t0  # latest.json written: the local commit
        self.record(f"{name}.blocked", spent["blocked"])
        self.record(f"{name}.commit", pointer - spent["blocked"])
        self.record(f"{name}.prune", spent["local"] - pointer)
        return self.record(name, spent["local"])

    def ceiling(self, name: str, directory: str, threads: int) -> float:
        return self.record(name, write_ceiling(f"{directory}/ceiling-{uuid.uuid4().hex[:6]}", self.chunks, threads))

    # ---------------------------------------------------------------- 2. restore
    def restore(self, name: str) -> float:
        self.servers.clear()
        before = phase_seconds()
        t0 = time.perf_counter()
        step = self.managers[name].restore(self.state)
        outside = time.perf_counter() - t0
        dt = phase_seconds(before)["restore"]
        assert step == 1 and dt <= outside + 1e-3, (step, dt, outside)
        log = self.servers.log_summary()[0]
        counts = self.requests.setdefault(name, {"part GETs": [], "other requests": []})
        parts = sum(n for p, n in log["gets_per_path"].items() if "/part-" in p)
        counts["part GETs"].append(parts)
        counts["other requests"].append(log["requests"] - parts)
        return self.record(name, dt)

    def pointer_get(self) -> float:
        """One round trip to the root: ``latest_step()`` (a GET of latest.json through the proxy)."""
        t0 = time.perf_counter()
        self.managers["restore.s3"].latest_step()
        return self.record("pointer.get", time.perf_counter() - t0)

    # ---------------------------------------------------------------- 3. blocked time
    def save(self, name: str) -> float:
        mgr = self.managers[name]
        time.sleep(SETTLE_S)
        before = phase_seconds()
        t0 = time.perf_counter()
        mgr.save(self._next(name), self.state)
        returned = time.perf_counter() - t0
        stats = mgr.wait()
        waited = time.perf_counter() - t0
        spent = phase_seconds(before)  # streamio's own instruments, checked against this clock
        assert stats is not None and spent["blocked"] <= returned + 1e-3 and spent["durable"] <= waited + 1e-3, spent
        # blocked: save() until it returned, by this clock (the instrument's blocked is the host
        # copy inside it, recorded as host_copy; the two differ by what save() does after the copy)
        blocked = self.record(f"{name}.blocked", returned)
        self.record(f"{name}.durable", spent["durable"])
        self.record(f"{name}.host_copy", spent["blocked"])
        return blocked

    def copy(self) -> float:
        """The host copy alone: the state's tensors into reused buffers (what ``save`` blocks on)."""
        time.sleep(SETTLE_S)
        t0 = time.perf_counter()
        for buf, t in zip(self.copy_bufs, self.tensors, strict=True):
            buf.copy_(t)
        return self.record("copy", time.perf_counter() - t0)

    # ---------------------------------------------------------------- 4. training loop
    def loop(self, name: str) -> float:
        mgr = self.managers.get(name)
        steps = SAVES_PER_LOOP * self.every
        in_save = 0.0
        t0 = time.perf_counter()
        for i in range(1, steps + 1):
            train_step(self.model, self.opt, self.x)
            if mgr is not None and i % self.every == 0:
                s = time.perf_counter()
                mgr.save(self._next(name), self.state)
                in_save += time.perf_counter() - s
        loop_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if mgr is not None:
            mgr.wait()
        self.record(f"{name}.drain", time.perf_counter() - t1)
        self.record(f"{name}.save_per_step", in_save / steps)
        return self.record(name, loop_s)

    def warm(self, name: str) -> float:
        """A loop's warm-up: one step and one save (its host buffer touched), not a whole loop."""
        train_step(self.model, self.opt, self.x)
        mgr = self.managers.get(name)
        if mgr is not None:
            mgr.save(self._next(name), self.state)
            mgr.wait()
        return 0.0

    def groups(self, *, warm: bool = False) -> dict[str, Callable[[], float]]:
        """The groups to interleave; ``warm``: the loops' members replaced by :meth:`warm`."""
        loop = self.warm if warm else self.loop
        groups = {"local.disk": [lambda: self.local_save("local.disk"),
                                 lambda: self.ceiling("ceiling.disk", self.disk, self.parts),
                                 lambda: self.ceiling("ceiling.disk.seq", self.disk, 0)]}
        if self.shm is not None:
            groups["local.shm"] = [lambda: self.local_save("local.shm"),
                                   lambda: self.ceiling("ceiling.shm", self.shm, self.parts),
                                   lambda: self.ceiling("ceiling.shm.seq", self.shm, 0)]
        groups["restore"] = [lambda: self.restore("restore.local"), lambda: self.restore("restore.s3"),
                             self.pointer_get]
        groups["blocked"] = [lambda: self.save("save.tier"), lambda: self.save("save.root"), self.copy]
        groups["loop"] = [lambda: loop("loop.none"), lambda: loop("loop.tier"), lambda: loop("loop.root")]
        return {name: self._rounds(name, members, SAVES_PER_REP if name == "blocked" else 1)
                for name, members in groups.items()}

    def _rounds(self, name: str, members: list[Callable[[], float]], rounds: int) -> Callable[[], float]:
        """``rounds`` runs of every member, back to back, the order rotating each time."""
        def run() -> float:
            t0 = time.perf_counter()
            for _ in range(rounds):
                k = self.turns.get(name, 0) % len(members)
                self.turns[name] = self.turns.get(name, 0) + 1
                for member in members[k:] + members[:k]:
                    member()
            return time.perf_counter() - t0
        return run

    def close(self) -> None:
        for mgr in self.managers.values():
            mgr.close()


def paired(num: list[float], den: list[float]) -> float:
    """The median of the per-round ratios ``num[i] / den[i]`` (NaN without rounds)."""
    return summary([ratio(a, b) for a, b in zip(num, den, strict=True)])["median"]


def ratios(runs: dict[str, list[float]]) -> dict[str, float]:
    """The issue's ratios, each the median of its per-round ratios (tiers that did not run are left out)."""
    out = {}
    for tier in ("disk", "shm"):
        if f"local.{tier}" not in runs:
            continue
        ceiling = [min(a, b) for a, b in zip(runs[f"ceiling.{tier}"], runs[f"ceiling.{tier}.seq"], strict=True)]
        out[f"local {tier}: commit (host copy done to latest.json) / write+fsync ceiling (target <= 1.2)"] = paired(
            runs[f"local.{tier}.commit"], ceiling)
        out[f"local {tier}: SaveStats.local_s (host copy + commit + local retention) / ceiling"] = paired(
            runs[f"local.{tier}"], ceiling)
    out["restore: local tier / S3 (target <= 0.25)"] = paired(runs["restore.local"], runs["restore.s3"])
    out["save blocked: local tier / no tier (target <= 1.1)"] = paired(runs["save.tier.blocked"],
                                                                       runs["save.root.blocked"])
    out["save blocked, SaveStats.blocked_s: local tier / no tier"] = paired(runs["save.tier.host_copy"],
                                                                           runs["save.root.host_copy"])
    out["save blocked: no tier / host copy alone"] = paired(runs["save.root.blocked"], runs["copy"])
    out["save to durable (durable_every=1): local tier / no tier"] = paired(runs["save.tier.durable"],
                                                                            runs["save.root.durable"])
    out[f"loop seconds in save per step: local tier (durable_every={DURABLE_EVERY}) / no tier"] = paired(
        runs["loop.tier.save_per_step"], runs["loop.root.save_per_step"])
    out["loop wall: local tier / no checkpoint"] = paired(runs["loop.tier"], runs["loop.none"])
    out["loop wall: no tier / no checkpoint"] = paired(runs["loop.root"], runs["loop.none"])
    return out


def report(b: Bench) -> dict[str, Any]:
    med = {k: summary(v)["median"] for k, v in b.results.items()}
    r = ratios(b.results)
    print(f"\n== state {b.nbytes / MB:.0f} MB, {b.parts} local parts; medians [min-max] (s)")
    for k in sorted(b.results):
        s = summary(b.results[k])
        print(f"  {k:<32} {s['median']:9.4f}  [{s['min']:.4f}-{s['max']:.4f}]")
    print(f"  requests through the proxy per restore: {b.requests}")
    for k, v in r.items():
        print(f"  {k:<90} {v:6.3f}")
    return {"medians_s": med, "runs_s": b.results, "ratios": r, "restore_requests": b.requests}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 MB (one layer), 1 repetition, saves every step (~1 min)")
    ap.add_argument("--size-mb", type=int, help="state size (params + Adam), default 300 (quick: 50)")
    ap.add_argument("--reps", type=int, help="repetitions after the warm-up, default 5 (quick: 1)")
    ap.add_argument("--every", type=int, help="the loop saves every N steps, default 2 (quick: 1)")
    ap.add_argument("--dir", help="where the disk tier goes (default: a temp directory, on TMPDIR's disk)")
    ap.add_argument("--no-shm", action="store_true", help="no /dev/shm RAM tier")
    ap.add_argument("--json", type=Path, help="write all figures here")
    args = ap.parse_args(argv)
    size_mb = args.size_mb or (50 if args.quick else 300)
    reps = args.reps or (1 if args.quick else 5)
    every = args.every or (1 if args.quick else 2)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    clean_aws_env()
    disk = tempfile.mkdtemp(prefix="bench-tiers-", dir=args.dir)
    shm = None
    servers = S3Servers(proxies=1, latency=LATENCY).start()
    print(machine_line(machine()), flush=True)
    try:
        shm = None if args.no_shm else shm_room(size_mb * MB)
        b = Bench(servers, disk, shm, size_mb, every)
        interleave(b.groups(warm=True), 1, log=lambda line: print("warm-up", line, flush=True))
        b.results.clear()
        b.requests.clear()
        interleave(b.groups(), reps, log=lambda line: print(line, flush=True))
        out: dict[str, Any] = {
            "size_bytes": b.nbytes, "reps": reps, "latency_s": LATENCY, "every": every,
            "steps_per_loop": SAVES_PER_LOOP * every, "durable_every": DURABLE_EVERY, "local_parts": b.parts,
            "shm": shm is not None, **report(b),
        }
        b.close()
    finally:
        servers.stop()
        shutil.rmtree(disk, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
