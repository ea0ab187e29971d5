"""``prepare``: ``accelerator.prepare`` for everything except streamio's loaders, which keep their sharding.

A :class:`~streamio.StreamingDataLoader` is already what Accelerate makes of a loader: a disjoint
share per rank (and per worker), the same number of batches on every rank, an exact position in
its ``state_dict``. Given to ``accelerator.prepare`` it is sharded a second time or dispatched
(:mod:`.loader`), so :func:`prepare` hands every other object to ``accelerator.prepare`` in one call
(in order: Accelerate pairs optimizers with models by position) and wraps each streamio loader in a
:class:`~.loader.DeviceLoader` in its place.

Refused, each with an error that names the fix, because each re-shards or drops data silently:

* ``DataLoaderConfiguration(dispatch_batches=True)`` or ``split_batches=True`` with a streamio
  loader (both change who reads which batch, which streamio's plan already decides);
* a :class:`~streamio.StreamingDataset` where a loader belongs (give it a ``StreamingDataLoader``:
  the worker count and collate are the caller's to choose, and the batch size is the dataset's);
* any other loader over a ``StreamingDataset`` (a torch ``DataLoader``, a loader Accelerate
  already prepared): Accelerate would shard it again;
* a streamio loader whose rank and world size (the process group's, else torchrun's environment)
  are not the accelerator's: ``Accelerator()`` on a machine without GPUs under torchrun trains in
  independent processes while the dataset shards by ``WORLD_SIZE`` (measured: each process trained
  on half the data, alone).
"""

from __future__ import annotations

from typing import Any

from streamio.accelerate.attached import attached
from streamio.accelerate.loader import DeviceLoader
from streamio.accelerate.requirement import require
from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.distributed import rank_and_world
from streamio.errors import ArgumentError, ConfigError

__all__ = ["prepare", "refuse_resharded"]

_data_loader = require("accelerate.data_loader")


def prepare(accelerator: Any, *objects: Any) -> Any:
    """``accelerator.prepare(*objects)``, except that streamio loaders keep their sharding.

    Example::

        model, optimizer, loader = streamio.accelerate.prepare(accelerator, model, optimizer, loader)

    Args:
        accelerator: an ``accelerate.Accelerator``.
        objects: models, optimizers, schedulers, loaders: anything ``accelerator.prepare`` takes,
            and :class:`~streamio.StreamingDataLoader`\\ s (each returned as a
            :class:`~.loader.DeviceLoader`, recorded for :func:`~streamio.accelerate.save_state`).

    Returns:
        The prepared objects in the order given (one object alone is returned as itself, as
        ``accelerator.prepare`` does).

    Raises:
        ConfigError: the accelerator dispatches or splits batches while a streamio loader is given,
            or an object is a loader over a ``StreamingDataset`` that Accelerate would shard again.
        ArgumentError: a ``StreamingDataset`` is given where its loader belongs.
    """
    refuse_resharded(accelerator)
    for obj in objects:
        _check(accelerator, obj)
    others = [obj for obj in objects if not isinstance(obj, (StreamingDataLoader, DeviceLoader))]
    prepared = iter(_accelerate(accelerator, others))
    result = tuple(_wrap(accelerator, obj) if isinstance(obj, (StreamingDataLoader, DeviceLoader))
                   else next(prepared) for obj in objects)
    return result[0] if len(result) == 1 else result


def _accelerate(accelerator: Any, others: list[Any]) -> tuple[Any, ...]:
    if not others:
        return ()
    done = accelerator.prepare(*others)
    return (done,) if len(others) == 1 else tuple(done)


def _wrap(accelerator: Any, loader: StreamingDataLoader | DeviceLoader) -> DeviceLoader:
    """The wrapper of ``loader`` for ``accelerator``: made once, then the same object again."""
    side = attached(accelerator)
    known = side.wrapper_of(loader)
    if known is not None:
        return known
    inner = loader.loader if isinstance(loader, DeviceLoader) else loader
    wrapper = DeviceLoader(inner, accelerator.device, non_blocking=bool(accelerator.non_blocking))
    side.loaders.append(wrapper)
    return wrapper


def _check(accelerator: Any, obj: Any) -> None:
    if isinstance(obj, (StreamingDataLoader, DeviceLoader)):
        _check_ranks(accelerator, obj)
        config = accelerator.dataloader_config
        for option in ("dispatch_batches", "split_batches"):
            if getattr(config, option, None):
                raise ConfigError(
                    f"streamio.accelerate.prepare got a StreamingDataLoader over {obj.dataset!r}, and the "
                    f"Accelerator has DataLoaderConfiguration({option}=True): streamio's loader already reads a "
                    f"disjoint share of whole batches on each rank, so {option} cannot apply; leave {option} "
                    f"unset (or False) in the Accelerator's dataloader_config"
                )
    elif isinstance(obj, StreamingDataset):
        raise ArgumentError(
            f"streamio.accelerate.prepare got the dataset {obj!r} itself: pass a streamio.StreamingDataLoader "
            f"over it (StreamingDataLoader(dataset, num_workers=...)), which keeps its sharding and position"
        )
    else:
        dataset = _streaming_dataset(obj)
        if dataset is not None:
            raise ConfigError(_resharded(type(obj).__name__, dataset, "streamio.accelerate.prepare got"))


def _check_ranks(accelerator: Any, loader: StreamingDataLoader | DeviceLoader) -> None:
    """The dataset shards over the ranks the accelerator trains on (both read torchrun's, or the group's)."""
    ranks = rank_and_world()
    if ranks != (accelerator.process_index, accelerator.num_processes):
        raise ConfigError(
            f"streamio.accelerate.prepare: the dataset {loader.dataset!r} shards as rank {ranks[0]} of {ranks[1]} "
            f"(torch.distributed, else torchrun's RANK/WORLD_SIZE), the Accelerator runs as process "
            f"{accelerator.process_index} of {accelerator.num_processes}: each process would train alone on a "
            f"share of the data. On CPUs under torchrun, make it Accelerator(cpu=True); or start the job with "
            f"accelerate launch"
        )


def refuse_resharded(accelerator: Any) -> None:
    """Refuse an accelerator that already prepared a loader over a ``StreamingDataset`` itself.

    Raises:
        ConfigError: ``accelerator.prepare`` wrapped such a loader (it reads half the data on 2
            ranks, and its position is not saved).
    """
    for loader in getattr(accelerator, "_dataloaders", ()):
        dataset = _streaming_dataset(loader)
        if dataset is not None:
            raise ConfigError(_resharded(type(loader).__name__, dataset, "accelerator.prepare already made"))


def _resharded(kind: str, dataset: StreamingDataset, what: str) -> str:
    return (
        f"{what} a {kind} over {dataset!r}: Accelerate shards such a loader again over the ranks (half the data "
        f"on 2 ranks, silently) and does not save its position; pass a streamio.StreamingDataLoader(dataset) to "
        f"streamio.accelerate.prepare instead of accelerator.prepare"
    )


def _streaming_dataset(obj: Any) -> StreamingDataset | None:
    """The ``StreamingDataset`` under a loader Accelerate would re-shard (a torch ``DataLoader``,
    an Accelerate ``DataLoaderAdapter``, an ``IterableDatasetShard`` around the dataset), if any."""
    for _ in range(4):  # adapter -> base_dataloader -> dataset -> IterableDatasetShard.dataset
        if isinstance(obj, StreamingDataset):
            return obj
        if isinstance(obj, _data_loader.DataLoaderAdapter):
            obj = obj.base_dataloader
        elif hasattr(obj, "dataset") and not isinstance(obj, (StreamingDataLoader, DeviceLoader)):
            obj = obj.dataset
        else:
            return None
    return obj if isinstance(obj, StreamingDataset) else None
