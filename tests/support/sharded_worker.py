"""What each rank of a sharded-checkpoint test runs: FSDP2 models with exact expected values.

Every tensor of the state is a slice of a *global* tensor that depends only on its name and a
salt (:func:`global_value`), so any process, on any mesh, knows the exact value each element must
have after a restore: a checkpoint saved by 4 FSDP ranks is checked element by element on 3
ranks, or on one plain module, without moving tensors between processes.

Scenarios (``SCENARIOS``) run on every rank of a gloo group forked by :mod:`support.sharded_procs`
and return a JSON-able dict: ``save`` (CheckpointManager and/or torch DCP through StreamioWriter),
``restore`` (both, into fresh objects of another sharding, counting the bytes read).
"""

from __future__ import annotations

import math
import os
import zlib
from typing import Any

import torch
import torch.distributed as dist

WIDTH_IN, HIDDEN, OUT = 64, 512, 7  # 7 output rows: uneven shards on 2, 3 and 4 ranks
TP_SHAPE = (6, 10)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH_IN, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, OUT)
        self.register_buffer("scale", torch.ones(OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def global_value(name: str, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    """The whole tensor ``name`` must hold for ``salt`` (exact, the same in every process)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{salt}".encode()))
    value = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    return value.round() if not dtype.is_floating_point else value.to(dtype)


def _local(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The local tensor of ``t`` and its box in the global tensor (``None``: the whole of it)."""
    from streamio.checkpoint.tensors.boxes import local_box
    from streamio.checkpoint.tensors.tree import is_dtensor

    return (t.to_local(), local_box(t)) if is_dtensor(t) else (t, None)


def _expected(name: str, t: torch.Tensor, salt: int) -> torch.Tensor:
    local, box = _local(t)
    whole = global_value(name, tuple(t.shape), t.dtype, salt).to(t.dtype)
    if box is None:
        return whole
    from streamio.checkpoint.tensors.boxes import narrow

    return narrow(whole, *box)


def _leaves(tree: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        return [(path, tree)]
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{path}/{k}")]
    if isinstance(tree, (list, tuple)):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{path}/{i}")]
    return []


def build(kind: str, salt: int, *, tp_mesh: str = "1d") -> dict[str, Any]:
    """A state: ``app`` (model + Adam through DCP's helpers), a DTensor ``tp``, a plain ``extra``,
    per-rank ``data`` and plain ``progress``, every tensor at its expected value for ``salt``."""
    from torch.distributed.device_mesh import init_device_mesh

    from streamio.checkpoint import ShardedModelState

    torch.manual_seed(0)
    model = MLP()
    world = dist.get_world_size() if dist.is_initialized() else 1
    tp: torch.Tensor = global_value("tp", TP_SHAPE, torch.float32, salt)
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model.fc1, mesh=mesh)
        fully_shard(model.fc2, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if tp_mesh == "2d":  # a replicated mesh dim: each box has two holders, one writes it
            mesh2 = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "tp"))
            tp = distribute_tensor(tp, mesh2, [Replicate(), Shard(1)])
        else:
            tp = distribute_tensor(tp, mesh, [Shard(0)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3 * salt)
    app = ShardedModelState(model, opt)
    sd = app.state_dict()  # initialises Adam's moments
    with torch.no_grad():
        for name, t in _leaves(sd):
            _local(t)[0].copy_(_expected(name, t, salt))
    app.load_state_dict(sd)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return {"app": app, "tp": tp, "extra": global_value("extra", (5,), torch.bfloat16, salt),
            "progress": {"step": salt}, "data": {"rank": rank, "seen": torch.tensor([rank, salt])}}


def check(state: dict[str, Any], salt: int, *, saved_world: int) -> dict[str, Any]:
    """Which parts of ``state`` hold exactly what :func:`build` gave them for ``salt``."""
    sd = state["app"].state_dict()
    bad = [name for name, t in _leaves(sd) if not torch.equal(_local(t)[0], _expected(name, t, salt))]
    rank = dist.get_rank() if dist.is_initialized() else 0
    lr = sd["optim"]["param_groups"][0]["lr"]
    return {
        "app": not bad and math.isclose(lr, 1e-3 * salt), "bad": bad[:5],
        "tp": torch.equal(_local(state["tp"])[0], _expected("tp", state["tp"], salt)),
        "extra": torch.equal(state["extra"], global_value("extra", (5,), torch.bfloat16, salt)),
        "progress": state["progress"] == {"step": salt},
        "data": state["data"]["rank"] == rank % saved_world
        and torch.equal(state["data"]["seen"], torch.tensor([rank % saved_world, salt])),
    }


class _ReadCounter:
    """Counts the bytes this process reads from storage (instrumenting the Store)."""

    def __init__(self) -> None:
        from streamio.storage import Store

        self.bytes = 0
        read, read_view = Store.read, Store.read_view

        def counted_read(
            store: Any, path: str, start: int | None = None, end: int | None = None, **kw: Any
        ) -> bytes:
            data = read(store, path, start, end, **kw)
            self.bytes += len(data) if "/part-" in path else 0
            return data

        def counted_view(store: Any, path: str) -> Any:
            data = read_view(store, path)  # elsewhere than on local disk it calls read(): counted there
            self.bytes += len(data) if "/part-" in path and store.is_local else 0
            return data

        Store.read, Store.read_view = counted_read, counted_view  # type: ignore[method-assign]


def _die_at_put(count: int) -> None:
    """kill -9 this process once its ``count``-th part is stored (mid-upload: others in flight)."""
    import threading

    from streamio.storage import Store

    put, seen, lock = Store.put, [0], threading.Lock()

    def dying_put(store: Any, path: str, data: Any, **kwargs: Any) -> Any:
        version = put(store, path, data, **kwargs)
        if "/part-" in path:
            with lock:
                seen[0] += 1
                if seen[0] == count:
                    os.kill(os.getpid(), 9)
        return version

    Store.put = dying_put  # type: ignore[method-assign]


def _entries(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """What is handed to the manager: ``app`` (ShardedModelState) as it is, or with
    ``args["direct"]`` the FSDP module and its optimizer as two entries of their own."""
    if not args.get("direct"):
        return state
    rest = {k: v for k, v in state.items() if k != "app"}
    return {"model": state["app"].model, "optim": state["app"].optimizers[0], **rest}


def save(args: dict[str, Any]) -> dict[str, Any]:
    """Save ``args["steps"]`` (manager, async) and/or one DCP save to ``args["dcp_root"]``."""
    import torch.distributed.checkpoint as dcp

    from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions, StreamioWriter

    options = SaveOptions(part_size=32 << 10, block_size=1024, concurrency=4,
                          key_prefixes=args.get("key_prefixes", SaveOptions.key_prefixes))
    out: dict[str, Any] = {"stats": []}
    kind, tp_mesh = args.get("kind", "fsdp"), args.get("tp_mesh", "1d")
    if args.get("steps"):
        die = args.get("die")  # {"step": s, "put": n}: kill -9 when the n-th part of step s starts
        with CheckpointManager(args["root"], retention=KeepLast(3), storage_options=args["storage"],
                               options=options) as mgr:
            for step in args["steps"]:
                state = build(kind, step, tp_mesh=tp_mesh)
                mgr.wait()
                if die and die["step"] == step:
                    _die_at_put(die["put"])
                mgr.save(step, _entries(state, args))
                stats = mgr.wait()
                assert stats is not None
                out["stats"].append({"step": step, "bytes": stats.bytes_written, "blocked_s": stats.blocked_s})
    if args.get("dcp_root"):
        state = build(kind, 50, tp_mesh=tp_mesh)
        sd = state["app"].state_dict()
        writer = StreamioWriter(args["dcp_root"], step=50, storage_options=args["storage"], options=options)
        dcp.save({"app": sd, "tp": state["tp"], "extra": state["extra"], "progress": state["progress"]},
                 storage_writer=writer)
        out["dcp_bytes"] = writer.last_stats.bytes_written if writer.last_stats else None
    return out


def restore(args: dict[str, Any]) -> dict[str, Any]:
    """Restore into fresh objects of ``args["kind"]`` on this group; check every element."""
    import torch.distributed.checkpoint as dcp

    from streamio.checkpoint import CheckpointManager, StreamioReader

    counter = _ReadCounter()
    out: dict[str, Any] = {}
    kind = args.get("kind", "fsdp")
    if args.get("root"):
        state = build(kind, 999)
        with CheckpointManager(args["root"], storage_options=args["storage"]) as mgr:
            entries = _entries(state, args)
            out["step"] = mgr.restore(entries)
        state.update({k: v for k, v in entries.items() if k in state})  # plain values are replaced
        out["checks"] = check(state, out["step"], saved_world=args["saved_world"])
        out["bytes_read"] = counter.bytes
    if args.get("dcp_root"):
        state = build(kind, 999)
        sd = {"app": state["app"].state_dict(), "tp": state["tp"], "extra": state["extra"],
              "progress": {"step": 0}}
        dcp.load(sd, storage_reader=StreamioReader(args["dcp_root"], storage_options=args["storage"]))
        state["app"].load_state_dict(sd["app"])
        state.update(extra=sd["extra"], progress=sd["progress"], data={"rank": 0, "seen": torch.tensor([0, 50])})
        dcp_checks = check(state, 50, saved_world=1)
        dcp_checks.pop("data")
        out["dcp_checks"] = dcp_checks
    return out


def refusals(args: dict[str, Any]) -> dict[str, Any]:
    """What each save of state that cannot be saved sharded raised (``None``: it did not)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    from streamio.checkpoint import CheckpointManager
    from streamio.errors import CheckpointError

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dt = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
    cases = {"per_rank": {"data": {"t": dt}}, "partial": {"w": DTensor.from_local(torch.ones(4, 2), mesh, [Partial()])},
             "fine": {"w": dt}}
    out: dict[str, Any] = {}
    with CheckpointManager(args["root"], async_save=False) as mgr:
        for step, (name, state) in enumerate(cases.items(), start=1):
            try:
                mgr.save(step, state)
                out[name] = None
            except CheckpointError as exc:
                out[name] = str(exc)
    return out


SCENARIOS = {"save": save, "restore": restore, "refusals": refusals}

