"""``RNGState``: capture and restore every random number generator a training rank uses.

Exact resume (docs/design.md "Bit-exact resume") needs more than weights and optimizer moments: dropout masks,
data augmentation and any sampling a user does draw from RNGs whose state must continue where the
crashed run left it. :class:`RNGState` is a stateful object (``state_dict`` / ``load_state_dict``)
that a :class:`~streamio.CheckpointManager` saves *per rank* (under the state name ``"rng"``, one
of ``SaveOptions.per_rank``), next to the model:

* Python's ``random`` module (``random.getstate()``);
* NumPy's legacy global RNG (``np.random.get_state()``: MT19937);
* any ``numpy.random.Generator`` the user registers by name (``register``);
* torch's CPU generator, and every CUDA device's generator (``torch.cuda.get_rng_state_all``)
  when CUDA is initialised.

Why the representation looks the way it does: the checkpoint format never unpickles from storage,
so the state dict holds only JSON types and tensors. ``np.random.get_state()`` contains an ndarray
that ``torch.load(weights_only=True)`` refuses (docs/design.md "Measured behaviour"), so the MT19937 key becomes an
int64 tensor; a NumPy ``Generator``'s 128-bit PCG64 words exceed JSON's portable integer range, so
integers beyond int64 are stored as decimal strings.

Re-seeding policy on a different world size: RNG streams belong to ranks. When a checkpoint saved
with ``W`` ranks is loaded with ``W' != W`` ranks there is no meaningful mapping of old streams to
new ranks (two new ranks would share one stream, or a stream would be lost), so every generator is
re-seeded deterministically from ``SeedSequence([seed, restore_epoch, world_size, rank])`` where
``seed`` is the base seed stored in the state and ``restore_epoch`` counts such re-seeds. The run is
then reproducible from that checkpoint for that world size, but no longer bit-identical to the
original run; a warning says so. With the same world size, each rank gets its own stream back
exactly.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from streamio.distributed import rank_and_world
from streamio.errors import CheckpointFormatError
from streamio.state_version import check_version

__all__ = ["RNGState", "STATE_VERSION"]

log = logging.getLogger(__name__)

STATE_VERSION = 1
_INT64_MAX = 2**63 - 1

# state dict keys
K_VERSION = "version"
K_SEED = "seed"
K_RANK = "rank"
K_WORLD = "world_size"
K_RESEEDS = "reseeds"
K_PYTHON = "python"
K_NUMPY = "numpy_legacy"
K_GENERATORS = "numpy_generators"
K_TORCH = "torch_cpu"
K_CUDA = "cuda"


def _encode(obj: Any) -> Any:
    """NumPy bit-generator state -> JSON types + tensors (big ints as strings, arrays as tensors)."""
    if isinstance(obj, dict):
        return {str(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(obj.astype(np.int64)), "dtype": str(obj.dtype)}
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        value = int(obj)
        return value if -_INT64_MAX <= value <= _INT64_MAX else {"__int__": str(value)}
    if isinstance(obj, (float, np.floating)):
        return float(obj)
    return obj


def _decode(obj: Any) -> Any:
    """Inverse of :func:`_encode`."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return _as_tensor(obj["__ndarray__"]).numpy().astype(obj["dtype"])
        if "__int__" in obj:
            return int(obj["__int__"])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def _as_tensor(value: Any) -> torch.Tensor:
    """A tensor from a tensor or from a plain list (a state that went through JSON)."""
    return value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.int64)


class RNGState:
    """Every RNG of this rank as one stateful object; see the module docstring.

    Args:
        seed: the run's base seed, stored in the state and used by the re-seeding policy when a
            checkpoint is loaded on a different world size.
        generators: NumPy generators to capture, by a stable name (also see :meth:`register`).
        rank: this process's rank; ``None`` asks :func:`streamio.distributed.rank_and_world` at
            each call (the process group, else torchrun's env).
        world_size: as ``rank``.

    Example::

        rng = RNGState(seed=cfg.seed, generators={"augment": aug_rng})
        ckpt.save(step, {"model": model, "optim": opt, "rng": rng})
        ...
        ckpt.restore({"model": model, "optim": opt, "rng": rng})  # same draws as before the crash
    """

    def __init__(
        self,
        seed: int = 0,
        generators: Mapping[str, np.random.Generator] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.seed = int(seed)
        self._generators: dict[str, np.random.Generator] = dict(generators or {})
        self._rank = rank
        self._world = world_size
        self.reseeds = 0

    def register(self, name: str, generator: np.random.Generator) -> None:
        """Capture ``generator`` under ``name`` too (names must match between save and restore)."""
        self._generators[name] = generator

    def _topology(self) -> tuple[int, int]:
        rank, world = rank_and_world()
        return (rank if self._rank is None else self._rank, world if self._world is None else self._world)

    # ------------------------------------------------------------------ capture
    def state_dict(self) -> dict[str, Any]:
        """This rank's RNG states as JSON types and tensors (no pickle needed to load them)."""
        rank, world = self._topology()
        py_version, py_state, py_gauss = random.getstate()
        name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state: dict[str, Any] = {
            K_VERSION: STATE_VERSION,
            K_SEED: self.seed,
            K_RANK: rank,
            K_WORLD: world,
            K_RESEEDS: self.reseeds,
            K_PYTHON: {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
            K_NUMPY: {
                "bit_generator": str(name),
                "key": torch.from_numpy(np.asarray(key).astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            K_GENERATORS: {n: _encode(g.bit_generator.state) for n, g in sorted(self._generators.items())},
            K_TORCH: torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state[K_CUDA] = list(torch.cuda.get_rng_state_all())
        return state

    # ------------------------------------------------------------------ restore
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every RNG from ``state`` (or re-seed them, on a different world size).

        Raises:
            CheckpointFormatError: the state has an unknown version, or lacks a registered
                generator.
        """
        state = check_version(state, STATE_VERSION, what="RNG state", error=CheckpointFormatError,
                              fix="restore it with the streamio version that saved it")
        self.seed = int(state[K_SEED])
        self.reseeds = int(state.get(K_RESEEDS, 0))
        rank, world = self._topology()
        saved_world = int(state[K_WORLD])
        if saved_world != world:
            self.reseeds += 1
            log.warning(
                "RNG state was saved with world size %d and is loaded with world size %d: per-rank RNG "
                "streams cannot be mapped, so every RNG is re-seeded from (seed=%d, reseed=%d, world=%d, "
                "rank=%d); the run stays reproducible but is not bit-identical to the original",
                saved_world, world, self.seed, self.reseeds, world, rank,
            )
            self.reseed(rank=rank, world_size=world)
            return
        if int(state[K_RANK]) != rank:
            log.warning("rank %d loads the RNG state saved by rank %s", rank, state[K_RANK])
        py = state[K_PYTHON]
        random.setstate((int(py["version"]), tuple(int(v) for v in _as_tensor(py["state"]).tolist()), py["gauss"]))
        npy = state[K_NUMPY]
        np.random.set_state(
            (
                npy["bit_generator"],
                _as_tensor(npy["key"]).numpy().astype(np.uint32),
                int(npy["pos"]),
                int(npy["has_gauss"]),
                float(npy["cached_gaussian"]),
            )
        )
        saved_gens = state.get(K_GENERATORS, {})
        missing = sorted(set(self._generators) - set(saved_gens))
        if missing:
            raise CheckpointFormatError(
                f"the checkpoint's RNG state has no numpy generator named {missing}: register the same "
                f"names as the run that saved it (saved: {sorted(saved_gens)})"
            )
        for name, gen in self._generators.items():
            gen.bit_generator.state = _decode(saved_gens[name])
        torch.set_rng_state(_as_tensor(state[K_TORCH]).to(torch.uint8))
        self._load_cuda(state.get(K_CUDA))

    @staticmethod
    def _load_cuda(saved: Any) -> None:
        if not saved:
            return
        if not torch.cuda.is_available():
            log.warning("the checkpoint holds CUDA RNG states but CUDA is not available here: they are ignored")
            return
        states = [_as_tensor(s).to(torch.uint8) for s in saved]
        count = torch.cuda.device_count()
        if len(states) != count:
            log.warning(
                "the checkpoint holds RNG states for %d CUDA devices, this process sees %d: restoring the first %d",
                len(states), count, min(len(states), count),
            )
        for device, s in enumerate(states[:count]):
            torch.cuda.set_rng_state(s, device)

    def reseed(self, *, rank: int, world_size: int) -> None:
        """Seed every RNG from ``(seed, reseeds, world_size, rank)``: the documented policy."""
        seq = np.random.SeedSequence([self.seed, self.reseeds, world_size, rank])
        words = seq.generate_state(4, dtype=np.uint32)
        random.seed(int(words[0]))
        np.random.seed(int(words[1]))
        torch.manual_seed(int(words[2]) | (int(words[3]) << 32) & _INT64_MAX)
        for child, (_, gen) in zip(seq.spawn(len(self._generators)), sorted(self._generators.items()), strict=True):
            gen.bit_generator.state = type(gen.bit_generator)(child).state

    def __repr__(self) -> str:
        return f"RNGState(seed={self.seed}, generators={sorted(self._generators)})"
