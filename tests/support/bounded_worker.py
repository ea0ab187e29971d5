"""Ranks of the bounded-save test (tests/checkpoint/test_checkpoint_bounded_ddp.py), run by the
zygote of :mod:`support.sharded_procs`.

``stalled``: every rank saves step 1 straight to moto (replicated state, then FSDP2/DTensor state
under a second root, then through ``torch.distributed.checkpoint.save`` and a ``StreamioWriter``
under a third), then, through the FaultProxy whose ``stall`` holds rank 1's part uploads,
continues each root (``adopt``; DCP: a writer of step 2) and saves step 2 with ``save_timeout_s``:
what each rank raised, how long it took, and what rank 0 then sees in each root.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch.distributed as dist


def _attempt(root: str, state: Any, args: dict[str, Any]) -> dict[str, Any]:
    from streamio.checkpoint import CheckpointManager, SaveOptions

    options = SaveOptions(part_size=32 << 10, block_size=1024, concurrency=2)
    began = time.monotonic()
    with CheckpointManager(root, async_save=False, options=options, storage_options=args["direct"]) as first:
        first.save(1, state(1))
    first_s = time.monotonic() - began
    options = dataclasses.replace(options, save_timeout_s=args["bound"])
    ckpt = CheckpointManager(root, async_save=False, options=options, storage_options=args["proxied"])
    ckpt.adopt()
    began = time.monotonic()
    try:
        ckpt.save(2, state(2))
        raised = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        raised = {"type": type(exc).__name__, "timeout": isinstance(exc, TimeoutError), "message": str(exc)}
    took = time.monotonic() - began
    began = time.monotonic()
    ckpt.close()
    out = {"raised": raised, "took": took, "first_s": first_s, "close_s": time.monotonic() - began}
    if dist.get_rank() == 0:
        out.update(latest=ckpt.latest_step(), steps=ckpt.steps())
    return out


def _dcp(root: str, args: dict[str, Any]) -> dict[str, Any]:
    """The same through ``torch.distributed.checkpoint.save`` with a ``StreamioWriter`` (its
    ``save``, which raises streamio's error rather than torch's ``CheckpointException``)."""
    from streamio.checkpoint import SaveOptions, StreamioWriter
    from streamio.checkpoint.root import committed_steps, pointed_step
    from streamio.storage import Store
    from support.sharded_worker import build

    def items(step: int) -> dict[str, Any]:
        state = build("fsdp", step)
        return {"app": state["app"].state_dict(), "tp": state["tp"]}

    options = SaveOptions(part_size=32 << 10, block_size=1024, concurrency=2)
    StreamioWriter(root, step=1, storage_options=args["direct"], options=options).save(items(1))
    writer = StreamioWriter(root, step=2, storage_options=args["proxied"],
                            options=dataclasses.replace(options, save_timeout_s=args["bound"]))
    began = time.monotonic()
    try:
        writer.save(items(2))
        raised = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        raised = {"type": type(exc).__name__, "timeout": isinstance(exc, TimeoutError), "message": str(exc)}
    out = {"raised": raised, "took": time.monotonic() - began, "first_s": 0.0, "close_s": 0.0}
    if dist.get_rank() == 0:
        store = Store(root, args["direct"])
        out.update(latest=pointed_step(store), steps=committed_steps(store))
    return out


def stalled(args: dict[str, Any]) -> dict[str, Any]:
    from support.ckpt import light_state_for
    from support.sharded_worker import build

    return {
        "replicated": _attempt(args["root"] + "/replicated", light_state_for, args),
        "sharded": _attempt(args["root"] + "/sharded", lambda step: build("fsdp", step), args),
        "dcp": _dcp(args["root"] + "/dcp", args),
    }


SCENARIOS = {"stalled": stalled}
