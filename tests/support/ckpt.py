"""Helpers for the checkpoint tests: deterministic states and the child processes they kill.

``state_for(step)`` builds the same model + Adam + scheduler + plain values for the same step in
any process, so a parent can check that what a killed child left restores to exactly the state of
the step it reports. Run as a script it is the child of the kill -9 tests::

    python tests/support/ckpt.py zygote   # imports torch once, forks one child per JSON line
                                          # on stdin: saves step 1, then step 2 dying at a phase
                                          # (or wherever the proxy kills it); or the scenario the
                                          # line names (``timeline``, ``tiers``)
    torchrun --nproc_per_node 2 tests/support/ckpt.py ddp ROOT OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import torch

PART_SIZE = 256 << 10
FAULT_PART_SIZE = 32 << 10

# The builders seed torch's global generator: tests that build states from several threads at once
# (the kill tests run four cases in parallel) would otherwise interleave draws and build states
# that match no step.
_SEEDED = threading.Lock()


class Net(torch.nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, width)
        self.bn = torch.nn.BatchNorm1d(width)
        self.fc2 = torch.nn.Linear(width, 8)
        self.emb = torch.nn.Embedding(512, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x + self.emb.weight[:1]))))


def state_for(step: int, width: int = 256) -> dict[str, Any]:
    """A state whose every tensor depends on ``step`` (and nothing else).

    Built on one intra-op thread: with two, the same seeded steps came out with last-bit
    differences now and then on a loaded machine (docs/design.md "Measured behaviour"), and a
    test that builds a state twice compares them bit for bit.
    """
    with _SEEDED:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _state_for(step, width)
        finally:
            torch.set_num_threads(threads)


def _state_for(step: int, width: int) -> dict[str, Any]:
    torch.manual_seed(1000 + step)
    model = Net(width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(16, 64)).square().mean().backward()
        opt.step()
        sched.step()
    return {
        "model": model,
        "optim": opt,
        "sched": sched,
        "counters": {"step": step, "best": 1.0 / (step + 1), "history": (step, float("inf"))},
        "extra": torch.full((3,), float(step), dtype=torch.bfloat16),
    }


def fresh_state(width: int = 256) -> dict[str, Any]:
    """A state of the same structure with different values (what restore loads into)."""
    with _SEEDED:
        torch.manual_seed(99)
        model = Net(width)
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    return {
        "model": model,
        "optim": opt,
        "sched": torch.optim.lr_scheduler.StepLR(opt, step_size=2),
        "counters": None,
        "extra": torch.zeros(3, dtype=torch.bfloat16),
    }


def assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Bit-exact comparison of everything ``state_for`` builds."""
    for (k1, a), (k2, b) in zip(got["model"].state_dict().items(), want["model"].state_dict().items(), strict=True):
        assert k1 == k2 and a.dtype == b.dtype and torch.equal(a, b), k1
    so, wo = got["optim"].state_dict(), want["optim"].state_dict()
    assert so["param_groups"] == wo["param_groups"]
    assert so["state"].keys() == wo["state"].keys()
    for i in wo["state"]:
        for name, value in wo["state"][i].items():
            assert torch.equal(so["state"][i][name], value), (i, name)
    assert got["sched"].state_dict() == want["sched"].state_dict()
    assert got["counters"] == want["counters"]
    assert torch.equal(got["extra"], want["extra"]) and got["extra"].dtype == torch.bfloat16


def rewrite_manifest(store: Any, step: int, doc: dict[str, Any], *, repoint: bool = False) -> bytes:
    """Store ``doc`` as ``step``'s manifest sealed the way streamio seals it (and, with
    ``repoint``, make ``latest.json`` record its checksum): a careful forger, for tests of the
    checks that lie behind the seal and the pointer's checksum."""
    from streamio.checkpoint.format import checks, layout
    from streamio.checkpoint.format import pointer as ptr
    from streamio.checksum import checksum_bytes

    body = {k: v for k, v in doc.items() if k != checks.SEAL_KEY}
    data = checks.seal(json.dumps(body, separators=(",", ":")).encode())
    store.put(layout.manifest_path(step), data)
    if repoint:
        pointer = json.loads(store.read(ptr.LATEST))
        pointer["manifest_checksum"] = checksum_bytes(data)
        store.put(ptr.LATEST, json.dumps(pointer).encode())
    return data


def light_state_for(step: int) -> dict[str, Any]:
    """A smaller state for the kill tests: no optimizer step (it imports torch._dynamo: seconds)."""
    with _SEEDED:
        torch.manual_seed(2000 + step)
        model = Net(128)
        moments = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    return {
        "model": model,
        "moments": moments,
        "counters": {"step": step},
        "extra": torch.full((3,), float(step), dtype=torch.bfloat16),
    }


def fault_scenario(root: str, phase: str, options: dict[str, Any]) -> None:
    """Save step 1, then step 2 dying at ``phase`` ("-": no self-kill; the proxy may kill us)."""
    from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions

    armed = threading.Event()  # step 1 passes every phase too: only step 2 dies

    def die(name: str) -> None:
        if armed.is_set() and name == phase:
            os.kill(os.getpid(), 9)

    mgr = CheckpointManager(root, retention=KeepLast(1), async_save=False, storage_options=options,
                            options=SaveOptions(part_size=FAULT_PART_SIZE, concurrency=4), on_phase=die)
    mgr.save(1, light_state_for(1))
    armed.set()
    mgr.save(2, light_state_for(2), metrics={"loss": 0.5})


def timeline_scenario(root: str, phase: str, options: dict[str, Any]) -> None:
    """Three timelines, then a rollback whose first save dies at ``phase`` (state of timeline
    ``t``, step ``s``: ``light_state_for(100 * t + s)``)::

        T1: 1 2 3 4 5 6
        T2:         (from T1's 4) 5 6 7
        T3:                     (from T2's 6) 7 8
        T4:     (from T1's 3) 4   <- killed at ``phase``
    """
    from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions

    def manager(on_phase: Any = None) -> Any:
        return CheckpointManager(root, retention=KeepLast(20), async_save=False, storage_options=options,
                                 options=SaveOptions(part_size=FAULT_PART_SIZE, concurrency=4), on_phase=on_phase)

    def template() -> dict[str, Any]:
        return {"model": light_state_for(0)["model"], "moments": None, "counters": None, "extra": None}

    first = manager()
    for s in range(1, 7):
        first.save(s, light_state_for(100 + s))
    for t, (back, steps) in enumerate([(4, (5, 6, 7)), (6, (7, 8))], start=2):
        job = manager()
        job.restore(template(), step=back)
        for s in steps:
            job.save(s, light_state_for(100 * t + s))

    def die(name: str) -> None:
        if name == phase:
            os.kill(os.getpid(), 9)

    last = manager(die)
    last.restore(template(), step=3)
    last.save(4, light_state_for(404))


def tiers_scenario(root: str, phase: str, options: dict[str, Any], *, local: str, die_step: int) -> None:
    """Save steps 1-4 (``light_state_for(step)``) on a local tier with ``durable_every=2`` (steps 2
    and 4 go to the root, which keeps one), each waited for, dying at ``phase`` of step ``die_step``:
    a local phase in the save thread, a root phase in the upload thread ("-": no self-kill; the
    proxy may kill us)."""
    from streamio.checkpoint import CheckpointManager, KeepLast, LocalTier, SaveOptions

    armed = threading.Event()

    def die(name: str) -> None:
        if armed.is_set() and name == phase:
            os.kill(os.getpid(), 9)

    options_ = SaveOptions(part_size=FAULT_PART_SIZE, concurrency=4, durable_every=2)
    mgr = CheckpointManager(root, retention=KeepLast(1), storage_options=options, options=options_, on_phase=die,
                            local=LocalTier(local, keep=2))
    for step in range(1, 5):
        if step == die_step:
            armed.set()
        mgr.save(step, light_state_for(step))
        mgr.wait()  # the local commit and the upload due: each kill point is met by one save alone
    mgr.close()


SCENARIOS = {"fault": fault_scenario, "timeline": timeline_scenario, "tiers": tiers_scenario}


def _zygote() -> None:
    """Import torch once, then fork one child per command line (JSON) read from stdin.

    Each fork prints ``pid TOKEN PID``; the parent kills it (or lets it finish) and watches the
    pid disappear (SIGCHLD is ignored here, so the kernel reaps children at once).
    """
    import signal

    import s3fs  # noqa: F401 - imported before forking, never instantiated here

    import streamio.checkpoint  # noqa: F401

    torch.set_num_threads(1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("zygote ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                scenario = SCENARIOS[cmd.get("scenario", "fault")]
                scenario(cmd["root"], cmd["phase"], cmd["options"], **cmd.get("kwargs", {}))
            except BaseException as exc:  # noqa: BLE001 - report and die like a crashed trainer
                print(f"child {cmd['token']} failed: {exc!r}", file=sys.stderr, flush=True)
                os._exit(1)
            os._exit(0)
        print(f"pid {cmd['token']} {pid}", flush=True)


def _ddp_child(root: str, out_path: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from streamio.checkpoint import CheckpointManager, SaveOptions
    from streamio.distributed import leave

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical initial weights on every rank, as DDP expects
    model = DistributedDataParallel(Net(128))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)  # per-rank RNG (e.g. augmentation)
    rng = _GenState(gen)
    options = json.loads(os.environ.get("CKPT_TEST_STORAGE_OPTIONS", "{}"))
    mgr = CheckpointManager(root, storage_options=options, options=SaveOptions(part_size=64 << 10))

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(8, 64, generator=gen)).square().mean().backward()
            opt.step()

    train(3)
    state = {"model": model, "optim": opt, "rng": rng, "progress": {"step": 3}, "data": {"rank_seen": rank}}
    mgr.save(3, state)
    expected_params = {k: v.clone() for k, v in model.state_dict().items()}
    # buffers (BatchNorm statistics) are rank 0's on every rank, as DDP's next forward makes them
    for name, _ in model.named_buffers():
        dist.broadcast(expected_params[name], src=0)
    expected_moments = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    expected_draw = torch.rand(4, generator=gen)
    stats = mgr.wait()
    assert stats is not None
    train(2)  # move everything away from the saved state

    torch.manual_seed(rank + 7)
    model2 = DistributedDataParallel(Net(128))
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    gen2 = torch.Generator().manual_seed(12345)
    state2 = {"model": model2, "optim": opt2, "rng": _GenState(gen2), "progress": None, "data": None}
    mgr2 = CheckpointManager(root, storage_options=options)
    restored = mgr2.restore(state2)
    st2 = opt2.state_dict()["state"]
    checks = {
        "step": restored == 3,
        "params": all(torch.equal(v, expected_params[k]) for k, v in model2.state_dict().items()),
        "moments": all(torch.equal(st2[i][k], v) for i, s in expected_moments.items() for k, v in s.items()),
        "rng": torch.equal(torch.rand(4, generator=gen2), expected_draw),
        "values": state2["progress"] == {"step": 3} and state2["data"] == {"rank_seen": rank},
    }
    ok = all(checks.values()) or {k: v for k, v in checks.items() if not v}
    results: list[Any] = [None] * world
    dist.all_gather_object(results, {"rank": rank, "ok": ok, "bytes": stats.bytes_written})
    mgr.close()
    mgr2.close()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    leave(0)


class _GenState:
    """A per-rank RNG as a stateful object (its state is a uint8 tensor)."""

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "torch": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["torch"])


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        _zygote()
    elif sys.argv[1] == "ddp":
        _ddp_child(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
