"""Real gloo process groups for the sharded-checkpoint and checkpoint-tier tests, forked from one zygote.

Importing torch, FSDP2, torch DCP and streamio costs ~6 s per process on these machines, and a
test needs groups of 1 to 4 ranks several times; torchrun would pay it for every rank of every
group. So a zygote process imports everything once and forks each group's ranks
(:meth:`Zygote.run`): every rank joins a gloo group through a fresh ``FileStore``, runs a
scenario of :mod:`support.sharded_worker` (or of the worker module the command names:
:mod:`support.tiers_worker`) and writes its result to ``OUT/rank-N.json`` (or its
error), then leaves with ``os._exit`` (gloo/FSDP processes sometimes abort at interpreter exit).

    python tests/support/sharded_procs.py      # the zygote: one JSON command per stdin line
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any


class Zygote:
    """The forking helper process (parent side)."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]),
                                                                     env.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().strip()
        assert ready == "zygote ready", ready
        self._lock = threading.Lock()

    def start(
        self, scenario: str, world: int, args: dict[str, Any], *, worker: str = "support.sharded_worker"
    ) -> tuple[Path, list[int]]:
        """Fork ``world`` ranks running ``scenario`` of the module ``worker``; returns their output
        directory and pids."""
        out = Path(tempfile.mkdtemp(prefix="sharded-"))
        cmd = {"scenario": scenario, "world": world, "args": args, "out": str(out), "worker": worker}
        with self._lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            pids = [int(p) for p in self.proc.stdout.readline().split()[1:]]
        return out, pids

    def run(
        self, scenario: str, world: int, args: dict[str, Any], timeout: float = 120, *,
        worker: str = "support.sharded_worker",
    ) -> list[dict[str, Any]]:
        """Run a scenario on a fresh group of ``world`` ranks; every rank's result, by rank."""
        out, pids = self.start(scenario, world, args, worker=worker)
        try:
            wait_gone(pids, timeout)
            return results(out, world)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while _alive(pid):
            if time.monotonic() > deadline:
                for p in pids:
                    _kill(p)
                raise AssertionError(f"ranks {pids} did not finish within {timeout} s")
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def results(out: Path, world: int) -> list[dict[str, Any]]:
    """Every rank's result; a rank that failed or died is reported with what it said."""
    got = []
    for rank in range(world):
        path = out / f"rank-{rank}.json"
        got.append(json.loads(path.read_text()) if path.exists() else {"error": "no result: the rank died"})
    errors = [g["error"] for g in got if "error" in g]
    assert not errors, errors[0]
    return got


# ------------------------------------------------------------------------------ the zygote itself
def _rank(cmd: dict[str, Any], rank: int, store_path: str) -> None:
    import importlib

    import torch.distributed as dist

    scenarios = importlib.import_module(cmd.get("worker", "support.sharded_worker")).SCENARIOS
    out = Path(cmd["out"]) / f"rank-{rank}.json"
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=cmd["world"])
        result = scenarios[cmd["scenario"]](cmd["args"])
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the test, like a crashed trainer
        result = {"error": f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=repr))
    os.replace(tmp, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _zygote() -> None:
    import signal

    import s3fs  # noqa: F401 - imported before forking, never instantiated here
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401

    import streamio.checkpoint  # noqa: F401
    import streamio.checkpoint.dcp.reader  # noqa: F401
    import streamio.checkpoint.dcp.writer  # noqa: F401
    import support.sharded_worker

    torch.set_num_threads(1)
    support.sharded_worker.build("plain", 1)  # warm up: the first optimizer step imports torch._dynamo (seconds)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the ranks
    print("zygote ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        store_path = os.path.join(cmd["out"], f"store-{uuid.uuid4().hex}")
        pids = []
        for rank in range(cmd["world"]):
            pid = os.fork()
            if pid == 0:
                _rank(cmd, rank, store_path)
            pids.append(pid)
        print("pids " + " ".join(map(str, pids)), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))
    _zygote()
