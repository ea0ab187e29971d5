"""Where the trainer's batches come from: :func:`make_data`.

The trainer sees two things, whatever the source:

* ``train``: a resumable loader of ``(x, y)`` batches for this rank, with ``set_epoch(e)``,
  ``len()`` (batches this epoch, identical on every rank), ``state_dict()`` / ``load_state_dict()``
  (the position inside the epoch, saved in every checkpoint);
* ``val``: an iterable of ``(x, y)`` batches holding this rank's share of the validation set,
  which may be uneven across ranks (the trainer reduces sums, never per-batch means); with
  ``--fsdp`` every rank has the same number of batches, the shorter shares padded with empty ones.

Sources: ``cfg.data_url``, a prefix holding ``train/`` and ``val/`` streamio datasets of ``npy`` +
``cls`` samples (what the demo writes): training streams through ``StreamingDataset`` +
``StreamingDataLoader`` (:class:`StreamingTrainLoader`). Without a URL, the bundled synthetic data
is generated in memory (below) and served by :class:`InMemoryLoader`, a small resumable loader
with the same contract (handy for tests and for a first run without storage).

Exactness rules the in-memory loader follows, and that any source must follow for bit-exact
resume: the order is a pure function of ``(seed, epoch)``; per-sample augmentation draws from an
RNG seeded by ``(seed, epoch, sample index)``, never from a worker's running RNG (a resumed worker
starts fresh); and creating an iterator must not draw from the global torch RNG that dropout uses
(the in-memory loader's DataLoader gets its own ``generator``; StreamingDataLoader has one itself).

The bundled demo data is a deterministic, learnable synthetic classification task. No download
and no file to ship: the same ``seed`` gives the same bytes on every machine (NumPy's
``default_rng`` with a structured seed: a tuple, not arithmetic). Each sample is a 32-dimensional
point from one of 8 overlapping Gaussian clusters pushed through a fixed random nonlinearity, so a
small MLP's loss starts at ``ln 8 = 2.08`` and visibly falls, without reaching zero in a few
hundred steps. Two views of the same data: :func:`make_arrays` -> ``(x, y)`` arrays, for training
straight from memory; :func:`iter_samples` -> WebDataset-style sample dicts (``{"__key__", "npy",
"cls"}``) for ``streamio.data.write.writer.write_dataset``, i.e. what the demo shards into object
storage.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from streamio.errors import ConfigError, StateMismatchError
from streamio.storage import Store
from streamio.train.config import TrainConfig, data_sources

Batch = tuple[torch.Tensor, torch.Tensor]
_LOADER_VERSION = 1

DIM = 32
"""Features of a synthetic sample."""
NUM_CLASSES = 8
"""Classes of the synthetic task."""
_SPLITS = {"train": 1, "val": 2}


def make_arrays(n: int, *, seed: int = 0, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``split`` as ``(x float32 [n, DIM], y int64 [n])``, deterministic in ``seed``.

    Raises:
        ValueError: ``split`` is not ``train`` or ``val``.
    """
    if split not in _SPLITS:
        raise ConfigError(f"split {split!r} is not one of {sorted(_SPLITS)}")
    task = np.random.default_rng([seed, 0xDA7A])  # the task itself: same for both splits
    centers = task.normal(0.0, 1.0, (NUM_CLASSES, DIM))
    mix = task.normal(0.0, 1.0 / np.sqrt(DIM), (DIM, DIM))
    draw = np.random.default_rng([seed, _SPLITS[split]])
    y = draw.integers(0, NUM_CLASSES, n)
    z = centers[y] + draw.normal(0.0, 1.1, (n, DIM))
    x = np.tanh(z @ mix) * 2.0
    return x.astype(np.float32), y.astype(np.int64)


def encode_npy(array: np.ndarray) -> bytes:
    """``array`` as ``.npy`` bytes (read back with ``allow_pickle=False``)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def iter_samples(n: int, *, seed: int = 0, split: str = "train") -> Iterator[dict[str, object]]:
    """The same samples as :func:`make_arrays`, as WebDataset sample dicts ``{"__key__", "npy", "cls"}``."""
    x, y = make_arrays(n, seed=seed, split=split)
    for i in range(n):
        yield {"__key__": f"{split}-{i:07d}", "npy": encode_npy(x[i]), "cls": str(int(y[i])).encode()}


class TrainLoader(Protocol):
    """What the trainer needs from a training data source (torchdata's Stateful + epochs)."""

    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass
class TrainData:
    """A rank's training loader and validation batches."""

    train: TrainLoader
    val: Any  # Iterable[Batch]
    source: str


def _seed_words(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


class AugmentedArrays(Dataset[Batch]):
    """Map-style dataset over arrays, with optional per-sample noise seeded by (seed, epoch, index)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, *, seed: int, noise: float) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.seed, self.noise, self.epoch = seed, noise, 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> Batch:
        x = self.x[index]
        if self.noise:
            gen = torch.Generator().manual_seed(_seed_words(self.seed, self.epoch, int(index)))
            x = x + self.noise * torch.randn(x.shape, generator=gen)
        return x, self.y[index]


class InMemoryLoader:
    """A resumable, sharded, shuffling DataLoader wrapper: the stand-in for StreamingDataLoader.

    Each epoch, the indices are permuted by ``default_rng([seed, epoch])`` and dealt round-robin to
    ranks, cut to the same count on every rank (equal work: no rank waits at the epoch's end).
    ``state_dict()`` is the epoch and the number of batches handed out; a loader restored from it
    yields exactly the remaining batches of that epoch, with any number of workers.

    On another world size the position is re-planned: after ``b`` batches on ``W`` ranks the ranks
    consumed exactly the first ``W * b * batch_size`` indices of the epoch's order (round-robin),
    so the new ranks deal the rest of that order among themselves (``start``), again cut to equal
    counts: nothing consumed is repeated, nothing else is skipped beyond that cut.
    """

    def __init__(
        self,
        dataset: AugmentedArrays,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
    ) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.num_workers, self.pin_memory, self.worker_init_fn = num_workers, pin_memory, worker_init_fn
        self.epoch, self.batches = 0, 0
        self.start = 0  # indices of the epoch's order consumed before this world size took over

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op on the epoch a restored state is in the middle of)."""
        if epoch != self.epoch:
            self.epoch, self.batches, self.start = epoch, 0, 0

    def _indices(self) -> np.ndarray:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.dataset))[self.start :]
        per_rank = len(order) // self.world_size
        return order[self.rank :: self.world_size][:per_rank]

    def _epoch_batches(self) -> int:
        return ((len(self.dataset) - self.start) // self.world_size) // self.batch_size

    def __len__(self) -> int:
        """Batches still to come in this epoch (all of them at its start); equal on every rank."""
        return self._epoch_batches() - self.batches

    def __iter__(self) -> Iterator[Batch]:
        self.dataset.epoch = self.epoch  # copied into the workers when the iterator forks them
        start = self.batches * self.batch_size
        indices = self._indices()[start : self._epoch_batches() * self.batch_size].tolist()
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=indices,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            worker_init_fn=self.worker_init_fn,
            drop_last=True,
            # its own generator: creating the iterator must not draw from the global torch RNG
            generator=torch.Generator().manual_seed(_seed_words(self.seed, self.epoch, self.batches, self.rank)),
        )
        for batch in loader:
            self.batches += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position: epoch, batches handed out, and what it must match on restore."""
        return {
            "version": _LOADER_VERSION,
            "epoch": self.epoch,
            "batches": self.batches,
            "start": self.start,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "samples": len(self.dataset),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at ``state``'s position (on another world size: re-planned, see the class docstring).

        Raises:
            StateMismatchError: the state belongs to another dataset, seed or batch size.
        """
        mine = self.state_dict()
        keys = ("version", "seed", "batch_size", "samples")
        if any(state.get(k) != mine[k] for k in keys):
            raise StateMismatchError(
                f"data-loader state {dict(state)!r} does not match this loader "
                f"({ {k: mine[k] for k in keys} }): resume with the same data, seed and batch size"
            )
        start, batches = int(state.get("start", 0)), int(state["batches"])  # no "start": saved before it existed
        if state["world_size"] != self.world_size:  # the ranks took the first of the rest of the order
            start, batches = start + int(state["world_size"]) * batches * self.batch_size, 0
        self.epoch, self.batches, self.start = int(state["epoch"]), batches, start


class XYTransform:
    """A demo sample (``npy`` + ``cls``, decoded) -> ``(x, y)``, with noise seeded by (seed, epoch, shard, index).

    The epoch is set by :meth:`StreamingTrainLoader.set_epoch` before workers are started, so each
    worker holds the right one; the noise never depends on a worker's running RNG.
    """

    def __init__(self, *, seed: int, noise: float) -> None:
        self.seed, self.noise, self.epoch = seed, noise, 0

    def __call__(self, sample: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
        x = torch.as_tensor(sample["npy"])
        if self.noise:
            sample_seed = _seed_words(self.seed, self.epoch, int(sample["__shard__"]), int(sample["__index__"]))
            gen = torch.Generator().manual_seed(sample_seed)
            x = x + self.noise * torch.randn(x.shape, generator=gen)
        return x, int(sample["cls"])


class StreamingTrainLoader:
    """``StreamingDataset`` + ``StreamingDataLoader`` behind the trainer's loader protocol.

    ``len()`` is the number of batches still to come in the current epoch, identical on every rank
    (the planner's equal-work guarantee); ``state_dict()`` is the StreamingDataLoader's exact
    position, valid with any number of workers.
    """

    def __init__(
        self, url: str | list[Any], cfg: TrainConfig, *, pin_memory: bool,
        storage_options: Mapping[str, Any] | None = None, worker_init_fn: Callable[[int], None] | None = None,
    ) -> None:
        from streamio.data.dataset import StreamingDataset
        from streamio.data.loader import StreamingDataLoader
        from streamio.data.options import DatasetOptions

        self.transform = XYTransform(seed=cfg.seed, noise=0.05)
        self.dataset = StreamingDataset(
            url, shuffle=True, seed=cfg.seed, batch_size=cfg.batch_size, decode="auto", transform=self.transform,
            storage_options=storage_options, options=DatasetOptions(policy="drop"),
        )
        threads = cfg.loader_threads  # batches on threads of this process: no workers, nothing pinned
        self.loader = StreamingDataLoader(
            self.dataset, num_workers=0 if threads else cfg.num_workers, pin_memory=pin_memory and not threads,
            worker_init_fn=worker_init_fn, threads=threads,
        )

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        self.transform.epoch = epoch

    def __len__(self) -> int:
        return self.dataset.plan(self.loader.num_workers).batches_per_rank

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)  # draws the workers' seeds from the loader's own generator, not the global RNG

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self.transform.epoch = self.dataset.epoch


def read_arrays(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every sample of the dataset at ``url`` (``npy`` + ``cls`` members) as ``(x, y)`` arrays.

    Used for validation, which must see every sample exactly once even when the set does not
    divide evenly across ranks (a ``StreamingDataset`` pads or drops to give equal work, right for
    training, wrong for a metric): every rank reads the whole (small) validation set through the
    :class:`~streamio.storage.Store`, each sample verified against the index's CRC32C, and keeps
    its share ``rank::world_size``.
    """
    from streamio.data.decode import BUILTIN_DECODERS
    from streamio.data.format.index import load_index
    from streamio.data.format.samples import iter_samples

    store = Store(url, storage_options)
    index = load_index(store)
    xs, ys = [], []
    for i, shard in enumerate(index.shards):
        chunks = store.iter_bytes(shard.path)
        layout = index.layout(i, store)
        for sample in iter_samples(chunks, url=store.url(shard.path), layout=layout, compression=shard.compression):
            xs.append(BUILTIN_DECODERS["npy"](sample["npy"]))
            ys.append(BUILTIN_DECODERS["cls"](sample["cls"]))
    return np.stack(xs).astype(np.float32), np.asarray(ys, dtype=np.int64)


def _val_batches(
    x: np.ndarray, y: np.ndarray, *, rank: int, world_size: int, batch_size: int, lockstep: bool = False
) -> list[Batch]:
    """This rank's share of the validation set: every sample once over all ranks, counts may differ.

    ``lockstep``: every rank gets as many batches as the largest share makes, the shorter shares
    ending with empty ones (FSDP: each forward pass is a collective every rank must join).
    """
    xs, ys = torch.from_numpy(x[rank::world_size]), torch.from_numpy(y[rank::world_size])
    batches = [(xs[i : i + batch_size], ys[i : i + batch_size]) for i in range(0, len(ys), batch_size)]
    if lockstep:
        largest_share = -(-len(y) // world_size)  # rank 0's: ceil(n / world)
        most = -(-largest_share // batch_size)
        batches += [(xs[:0], ys[:0])] * (most - len(batches))
    return batches


def make_data(
    cfg: TrainConfig, *, rank: int, world_size: int, pin_memory: bool,
    worker_init_fn: Callable[[int], None] | None = None,
) -> TrainData:
    """The training and validation data of this rank for ``cfg``.

    Args:
        cfg: the trainer configuration (source, sizes, batch sizes, workers, seed).
        rank: this process's rank.
        world_size: number of ranks.
        pin_memory: pin host batches (on CUDA) so host-to-device copies can be non-blocking.
        worker_init_fn: run in each training DataLoader worker (``Preemption.worker_init_fn``).
    """
    train: TrainLoader
    if cfg.data_url is not None:
        from streamio.data.mixing import Stream

        roots = data_sources(cfg.data_url)
        if len(roots) == 1 and roots[0][1] is None:
            url: str | list[Any] = f"{roots[0][0]}/train"
        else:
            url = [Stream(f"{root}/train", weight=weight) for root, weight in roots]
        streaming = StreamingTrainLoader(url, cfg, pin_memory=pin_memory, worker_init_fn=worker_init_fn)
        train = streaming
        vals = [read_arrays(f"{root}/val") for root, _ in roots]
        vx, vy = np.concatenate([v[0] for v in vals]), np.concatenate([v[1] for v in vals])
        source = f"{streaming.dataset!r}, validation {len(vy)} samples"
    else:
        x, y = make_arrays(cfg.train_samples, seed=cfg.seed, split="train")
        vx, vy = make_arrays(cfg.val_samples, seed=cfg.seed, split="val")
        source = "synthetic (in memory)"
        train = InMemoryLoader(
            AugmentedArrays(x, y, seed=cfg.seed, noise=0.05),
            batch_size=cfg.batch_size,
            rank=rank,
            world_size=world_size,
            seed=cfg.seed,
            num_workers=cfg.num_workers,
            pin_memory=pin_memory,
            worker_init_fn=worker_init_fn,
        )
    val = _val_batches(vx, vy, rank=rank, world_size=world_size, batch_size=cfg.val_batch_size,
                       lockstep=cfg.fsdp and world_size > 1)
    return TrainData(train=train, val=val, source=source)
