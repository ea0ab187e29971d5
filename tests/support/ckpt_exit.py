"""Scripts that end, or are killed, right after an async save: the children of test_checkpoint_exit.py.

    python tests/support/ckpt_exit.py MODE ROOT OPTIONS_JSON

Every mode saves step 1 and waits for it, then saves step 2 asynchronously and never calls
``wait()`` or ``close()``. Step 2's commit is held for ``HOLD_S`` at its "parts" phase, so it is
surely still in flight when the script goes on. MODE:

* ``end``: the script ends there;
* ``fail``: the script ends there and step 2's commit then fails (injected at its "parts" phase);
* ``sigterm``: sleeps; the parent sends SIGTERM (default action: death) once step 2's commit
  printed ``parts written``;
* ``sigterm-exit``: the same with a SIGTERM handler that raises ``SystemExit(143)``;
* ``tier-end``: as ``end``, with a local tier (``LOCAL_TIER``, ``durable_every=1``): step 2 commits
  locally and its upload, held at its "parts" phase, is in flight when the script ends;
* ``fork``: forks a child process (as a DataLoader worker is) that ends at once, prints its exit
  code, and ends: the child must not wait for the parent's save;
* ``peer-gone``: rank ``RANK`` of ``WORLD_SIZE`` (gloo, ``MASTER_ADDR``/``MASTER_PORT``): every
  rank constructs its manager; rank 0 saves step 1 and ends, the other ranks end without saving.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import torch

from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions

HOLD_S = 1.0
PEER_TIMEOUT_S = 5.0


def state(step: int) -> dict[str, Any]:
    torch.manual_seed(step)
    return {"model": torch.nn.Linear(256, 256), "progress": {"step": step}}


def _manager(root: str, options: dict[str, Any], mode: str) -> CheckpointManager:
    armed: list[bool] = []

    def on_phase(name: str) -> None:
        if armed and name == "parts":
            print("parts written", flush=True)
            time.sleep(HOLD_S)
            if mode == "fail":
                raise RuntimeError("injected failure at the parts phase")

    local = LocalTier(os.environ["LOCAL_TIER"]) if mode.startswith("tier") else None
    mgr = CheckpointManager(root, storage_options=options, options=SaveOptions(part_size=64 << 10),
                            on_phase=on_phase, local=local)
    mgr.save(1, state(1))
    mgr.wait()
    armed.append(True)
    return mgr


def _peer_gone(root: str, options: dict[str, Any]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    mgr = CheckpointManager(root, storage_options=options, options=SaveOptions(collective_timeout_s=PEER_TIMEOUT_S))
    if dist.get_rank() == 0:
        mgr.save(1, state(1))
        print("saved", flush=True)
        return  # the interpreter exits with the save in flight, its peer gone
    sys.stdout.flush()
    os._exit(0)  # this rank is gone before the save's first collective


def main(mode: str, root: str, options: dict[str, Any]) -> None:
    if mode == "peer-gone":
        _peer_gone(root, options)
        return
    if mode == "sigterm-exit":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mgr = _manager(root, options, mode)
    mgr.save(2, state(2))
    print("saved", flush=True)
    if mode == "fork":
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=int)
        child.start()
        child.join(timeout=30)
        print(f"child exit code {child.exitcode}", flush=True)
    if mode.startswith("sigterm"):
        time.sleep(60)  # the parent's SIGTERM arrives here


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
