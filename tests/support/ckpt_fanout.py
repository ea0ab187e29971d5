"""The rank processes of test_checkpoint_fanout.py (and benchmarks/bench_fanout.py).

    torchrun --nproc_per_node W tests/support/ckpt_fanout.py MODE ROOT OUT_DIR

``CKPT_TEST_STORAGE_OPTIONS`` (JSON) are the store's options (the proxy's endpoint). MODE:

* ``save``: every rank saves step 1 of :func:`state` (replicated model + per-rank RNG);
* ``restore`` / ``restore-nofanout``: every rank restores into a blank state (with fan-out, or
  ``restore_fanout=False``), checks it bit for bit and writes ``OUT_DIR/rank-N.json`` with
  ``{"ok", "step", "seconds", "warnings"}`` (``"error"`` instead of ``"step"`` when it raised);
  with ``DAMAGE_SENT_BY=R`` rank R flips a byte of everything it broadcasts (a rank with bad
  memory or a bad link: its own reads verified);
* ``restore-kill``: as ``restore``, but rank ``KILL_SENDER`` (default 1) kills itself (SIGKILL)
  as it starts its first broadcast of bytes (rank 1: its share of the fan-out; rank 0: the
  manifest); the other ranks restore once more (``"again"``: that error) and write their result
  at once (no teardown);
* ``save-paced`` / ``save-unpaced``: every rank saves steps 1..``SAVES`` (default 1) of a state of
  ``STATE_LAYERS`` layers (default 6) with its writes paced (the default) or not
  (``RetryPolicy(pace_writes=False)``), rank 0 putting ``between-N`` into the root before step N,
  and writes ``{"ok", "seconds"`` (of step 1), ``"each"}``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.checkpoint.comm import Comm
from streamio.storage import RetryPolicy

WIDTH = 256
LAYERS = int(os.environ.get("STATE_LAYERS", "6"))  # 6 x 256 KiB of weights in parts of 128 KiB
SAVED_WORLD = 2  # the test saves with 2 ranks


def state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    return {"model": model, "rng": {"r": torch.tensor([dist.get_rank() + seed])}}


def start_ranks(world: int, mode: str, root: str, options: dict[str, Any], out: Path,
                env: dict[str, str] | None = None) -> list[Any]:
    """Start ``world`` rank processes of ``mode`` without torchrun (whose agent would end the
    others when one dies): their ``Popen`` objects."""
    import socket
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    child_env.update(CKPT_TEST_STORAGE_OPTIONS=json.dumps(options), OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), WORLD_SIZE=str(world), **(env or {}))
    return [subprocess.Popen([sys.executable, __file__, mode, root, str(out)], env=dict(child_env, RANK=str(r)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(world)]


def _sabotage(rank: int) -> None:
    """This rank's test-only fault, from the environment (see the module docstring)."""
    original = Comm.broadcast_bytes

    def damaging(self: Comm, data: bytes | memoryview | None, *, src: int, size: int) -> memoryview:
        if src == rank and size and data is not None:
            damaged = bytearray(data)
            damaged[size // 2] ^= 0xFF
            data = damaged
        return original(self, data, src=src, size=size)

    def dying(self: Comm, data: bytes | memoryview | None, *, src: int, size: int) -> memoryview:
        if src == rank and size:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, data, src=src, size=size)

    if os.environ.get("DAMAGE_SENT_BY") == str(rank):
        Comm.broadcast_bytes = damaging  # type: ignore[method-assign]
    if os.environ.get("KILL_SENDER") == str(rank):
        Comm.broadcast_bytes = dying  # type: ignore[method-assign]


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_ranks(world: int, mode: str, root: str, options: dict[str, Any], out: Path,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``mode`` on ``world`` rank processes (torchrun, gloo); every rank's result."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    child_env.update(CKPT_TEST_STORAGE_OPTIONS=json.dumps(options), OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
         __file__, mode, root, str(out)],
        env=child_env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def main(mode: str, root: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "restore-kill":
        os.environ.setdefault("KILL_SENDER", "1")
    _sabotage(rank)
    warnings = _Warnings()
    logging.getLogger("streamio").addHandler(warnings)
    options = json.loads(os.environ["CKPT_TEST_STORAGE_OPTIONS"])
    fanout = mode != "restore-nofanout"
    write_rate = float(os.environ["WRITE_RATE"]) if os.environ.get("WRITE_RATE") else None
    save_options = SaveOptions(part_size=128 << 10, restore_fanout=fanout, write_rate=write_rate)
    retry = RetryPolicy(max_attempts=30, max_total=600, pace_writes=mode != "save-unpaced")
    with CheckpointManager(root, storage_options=options, options=save_options, async_save=False,
                           retry=retry) as mgr:
        if mode.startswith("save"):
            seconds = []
            for step in range(1, int(os.environ.get("SAVES", "1")) + 1):
                dist.barrier()
                if step > 1 and rank == 0:  # a mark in the store's request log between two saves
                    mgr.store.put(f"between-{step}", b"")
                dist.barrier()
                t0 = time.perf_counter()
                mgr.save(step, state(step))
                seconds.append(time.perf_counter() - t0)
            result: dict[str, Any] = {"ok": True, "seconds": seconds[0], "each": seconds}
        else:
            got = state(99)
            t0 = time.perf_counter()
            try:
                step = mgr.restore(got)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
            else:
                want = state(step)
                same = all(torch.equal(a, b) for a, b in zip(got["model"].state_dict().values(),
                                                            want["model"].state_dict().values(), strict=True))
                # saved by 2 ranks: on another world size rank r gets rank r % 2's per-rank state
                same = same and int(got["rng"]["r"]) == rank % SAVED_WORLD + step
                result = {"ok": same, "step": step, "seconds": time.perf_counter() - t0}
            result["warnings"] = warnings.messages
            if mode == "restore-kill":  # a peer is gone: no teardown
                try:
                    mgr.restore(state(99))
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    result["again"] = f"{type(exc).__name__}: {exc}"
                Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
                sys.stderr.flush()
                os._exit(0)
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
