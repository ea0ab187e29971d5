"""How the trainer saves and restores: :func:`make_checkpointer`.

The trainer talks to a :class:`Checkpointer` (the protocol of ``streamio.CheckpointManager``):
``save(step, state, metrics=)`` (asynchronous: returns once the state is snapshotted),
``restore(state, step=None) -> step`` (raises ``CheckpointNotFoundError`` when there is none),
``wait()``, ``close()``. ``state`` maps names to stateful objects (``state_dict`` /
``load_state_dict``): model, optimizer, scheduler, RNG state, data position, progress, early
stopping.

Until ``streamio.checkpoint.manager.CheckpointManager`` lands, :class:`InterimCheckpointer` stands
in for it, with the same protocol and the same guarantees the trainer relies on, in a deliberately
small form: every rank writes its whole state as one raw-tensor blob plus a JSON header (no pickle
anywhere), rank 0 waits for every rank's header (the done marker), then writes the step's manifest
and finally replaces ``latest.json`` in one PUT. A crash at any instant leaves ``latest.json``
naming a complete checkpoint. Retention (keep last K, keep best by ``val_loss``) runs after that
commit, so the newest complete checkpoint is never deleted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError
from streamio.storage import Store

log = logging.getLogger(__name__)

LATEST = "latest.json"
FORMAT = "streamio.train.interim-checkpoint/1"


class Checkpointer(Protocol):
    """What the trainer needs from a checkpoint manager (see the module docstring)."""

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, float] | None = None) -> Any: ...
    def restore(self, state: Mapping[str, Any], step: int | None = None) -> int: ...
    def wait(self) -> None: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------------------- tree <-> JSON + blob
def _flatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """A state tree as JSON with tensors replaced by references into ``tensors`` (kept lossless)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach().to("cpu", copy=True))
        return {"__tensor__": len(tensors) - 1}
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj) and not any(k.startswith("__") for k in obj):
            return {k: _flatten(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_flatten(k, tensors), _flatten(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_flatten(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_flatten(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"cannot checkpoint a {type(obj).__name__} ({obj!r}): use tensors and JSON types")


def _unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__items__" in obj:
            return {_unflatten(k, tensors): _unflatten(v, tensors) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(_unflatten(v, tensors) for v in obj["__tuple__"])
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def _pack(tensors: list[torch.Tensor]) -> tuple[bytes, list[dict[str, Any]]]:
    parts, specs, offset = [], [], 0
    for t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        specs.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": offset, "bytes": len(raw)})
        parts.append(raw)
        offset += len(raw)
    return b"".join(parts), specs


def _unpack(blob: bytes, specs: list[dict[str, Any]]) -> list[torch.Tensor]:
    out = []
    for s in specs:
        raw = bytearray(blob[s["offset"] : s["offset"] + s["bytes"]])
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out.append(flat.view(getattr(torch, s["dtype"])).reshape(s["shape"]))
    return out


class InterimCheckpointer:
    """A small asynchronous checkpoint manager standing in for ``streamio.CheckpointManager``.

    Args:
        root_url: checkpoint root (any fsspec URL).
        rank: this process's rank.
        world_size: number of ranks (rank 0 commits once all of them wrote their part).
        keep_last: complete checkpoints kept by recency (at least 1).
        keep_best: complete checkpoints kept by lowest ``val_loss`` metric.
        storage_options: fsspec options (credentials, endpoint); never logged.
        commit_timeout_s: how long rank 0 waits for the other ranks' parts before giving up.
    """

    def __init__(
        self,
        root_url: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        keep_last: int = 2,
        keep_best: int = 1,
        storage_options: Mapping[str, Any] | None = None,
        commit_timeout_s: float = 300.0,
    ) -> None:
        self.store = Store(root_url, storage_options)
        self.rank, self.world_size = rank, world_size
        self.keep_last, self.keep_best = max(1, keep_last), keep_best
        self.commit_timeout_s = commit_timeout_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @staticmethod
    def _dir(step: int) -> str:
        return f"step-{step:09d}"

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, float] | None = None) -> float:
        """Snapshot ``state`` now, upload and commit it in the background; return seconds blocked."""
        start = time.perf_counter()
        self.wait()  # at most one save in flight; surfaces the previous one's error
        tensors: list[torch.Tensor] = []
        tree = _flatten({k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in state.items()}, tensors)
        self._thread = threading.Thread(
            target=self._upload, args=(step, tree, tensors, dict(metrics or {})), name=f"ckpt-{step}", daemon=True
        )
        self._thread.start()
        return time.perf_counter() - start

    def _upload(self, step: int, tree: Any, tensors: list[torch.Tensor], metrics: dict[str, float]) -> None:
        try:
            blob, specs = _pack(tensors)
            base = f"{self._dir(step)}/rank-{self.rank:05d}"
            self.store.put(f"{base}.bin", blob)
            header = {"format": FORMAT, "step": step, "rank": self.rank, "tree": tree, "tensors": specs, "bytes": len(blob)}
            self.store.put(f"{base}.json", json.dumps(header).encode())  # this rank's done marker
            if self.rank == 0:
                self._commit(step, metrics)
        except BaseException as exc:  # surfaced by the next save()/wait()
            self._error = exc

    def _commit(self, step: int, metrics: dict[str, float]) -> None:
        deadline = time.monotonic() + self.commit_timeout_s
        markers = [f"{self._dir(step)}/rank-{r:05d}.json" for r in range(self.world_size)]
        while not all(self.store.exists(m) for m in markers):
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"step {step}: not every rank wrote its part to {self.store.url(self._dir(step))} within "
                    f"{self.commit_timeout_s:.0f} s; the previous checkpoint stays the latest"
                )
            time.sleep(0.05)
        manifest = {"format": FORMAT, "step": step, "world_size": self.world_size, "metrics": metrics}
        self.store.put(f"{self._dir(step)}/manifest.json", json.dumps(manifest).encode())
        self.store.put(LATEST, json.dumps({"format": FORMAT, "step": step, "path": self._dir(step)}).encode())
        self._retain()

    def _manifests(self) -> dict[int, dict[str, Any]]:
        found = {}
        for info in self.store.list():
            if info.path.endswith("/manifest.json"):
                m = json.loads(self.store.read(info.path))
                found[int(m["step"])] = m
        return found

    def _retain(self) -> None:
        manifests = self._manifests()
        keep = set(sorted(manifests)[-self.keep_last :])
        scored = [(m["metrics"]["val_loss"], s) for s, m in manifests.items() if m["metrics"].get("val_loss") is not None]
        keep |= {s for _, s in sorted(scored)[: self.keep_best]}
        for info in self.store.list():
            top = info.path.split("/", 1)[0]
            if top.startswith("step-") and int(top[5:]) < max(manifests) and int(top[5:]) not in keep:
                self.store.delete(info.path)

    def latest_step(self) -> int | None:
        """The step ``latest.json`` names, read fresh; ``None`` when there is no checkpoint."""
        try:
            pointer = json.loads(self.store.read(LATEST))
        except FileNotFoundError:
            return None
        if pointer.get("format") != FORMAT:
            raise CheckpointFormatError(f"{self.store.url(LATEST)} has format {pointer.get('format')!r}, not {FORMAT!r}")
        return int(pointer["step"])

    def restore(self, state: Mapping[str, Any], step: int | None = None) -> int:
        """Load this rank's part of ``step`` (default: the latest) into ``state``'s objects in place.

        Raises:
            CheckpointNotFoundError: there is no checkpoint under the root.
            CheckpointFormatError: the checkpoint was written for another world size or format.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointNotFoundError(f"no checkpoint under {self.store.url()}: {LATEST} does not exist")
        base = f"{self._dir(step)}/rank-{self.rank:05d}"
        manifest = json.loads(self.store.read(f"{self._dir(step)}/manifest.json"))
        if manifest["world_size"] != self.world_size:
            raise CheckpointFormatError(
                f"{self.store.url(self._dir(step))} was saved by {manifest['world_size']} ranks, this job has "
                f"{self.world_size}: the interim checkpointer restores only on the same world size"
            )
        header = json.loads(self.store.read(f"{base}.json"))
        blob = self.store.read(f"{base}.bin")
        if len(blob) != header["bytes"]:
            raise CheckpointFormatError(f"{self.store.url(base + '.bin')} has {len(blob)} bytes, its header says {header['bytes']}")
        loaded = _unflatten(header["tree"], _unpack(blob, header["tensors"]))
        missing = sorted(set(state) - set(loaded))
        if missing:
            raise CheckpointFormatError(f"{self.store.url(base + '.json')} has no entry {missing}: saved {sorted(loaded)}")
        for key, obj in state.items():
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(loaded[key])
            elif isinstance(state, dict):
                state[key] = loaded[key]
        return step

    def wait(self) -> None:
        """Block until the save in flight is committed; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"saving a checkpoint to {self.store.url()} failed: {error}") from error

    def close(self) -> None:
        """Finish the save in flight."""
        self.wait()


def make_checkpointer(
    root_url: str | None,
    *,
    rank: int,
    world_size: int,
    keep_last: int,
    keep_best: int,
    timeout_s: float,
    storage_options: Mapping[str, Any] | None = None,
) -> Checkpointer | None:
    """The checkpoint manager for ``root_url`` (``None``: checkpointing off)."""
    if root_url is None:
        return None
    return InterimCheckpointer(
        root_url,
        rank=rank,
        world_size=world_size,
        keep_last=keep_last,
        keep_best=keep_best,
        storage_options=storage_options,
        commit_timeout_s=timeout_s,
    )
