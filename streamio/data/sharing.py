"""What the ranks of a job read once when they open a dataset: every source's index, read by rank 0.

docs/design.md "StreamingDataset and exact resume" (Opening under ``torch.distributed``). Every
rank constructs its :class:`~streamio.data.dataset.StreamingDataset` (a collective already: the
ranks check that they agree on seed and settings). If each read the index itself, a job of N ranks
would GET each source's ``index.json`` N times (and list a pattern's shards N times), all at the
same moment. Instead:

1. every rank makes a gloo group of its own for the open (:class:`OpenGroup`), whose timeout
   (``DatasetOptions.collective_timeout_s``) bounds every wait: the dataset's collectives never
   pair with the training loop's on the default group (which may be NCCL), and a rank that never
   opens the dataset stops the others with an error, not a hang;
2. rank 0 opens every source as a single process does (:func:`~streamio.data.locate.fetch_dataset`:
   the size-bounded read, a pattern's listing, every check), keeping each index's bytes as read;
3. rank 0 broadcasts a header (an int64 tensor: success or failure, then each index's size) and
   the raw bytes in one uint8 tensor; nothing read from storage is pickled. When rank 0's open
   fails, it sends the error's class name and message instead, and every rank raises that error;
4. every other rank parses and checks the same bytes itself
   (:func:`~streamio.data.locate.parse_dataset`): they are as untrusted there as on rank 0.

DataLoader workers open nothing: they get the parsed indexes with the dataset (forked, or pickled:
a :class:`~streamio.data.format.index.DatasetIndex` is a value the library built). Without a
process group, or with one rank, no collective runs and each source is opened as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import numpy
import torch
import torch.distributed as dist

from streamio import errors
from streamio.data.format.index import DatasetIndex
from streamio.data.locate import fetch_dataset, open_dataset, parse_dataset
from streamio.distributed import group_initialized, rank_and_world
from streamio.errors import DatasetError, PlanError, StreamioError
from streamio.limits import load_json
from streamio.pool import run_parallel
from streamio.storage import Store
from streamio.storage.secrets import scrub

__all__ = ["OpenGroup", "Request", "check_agreement", "encode_failure", "open_sources", "raise_failure"]

Request = tuple[str, Mapping[str, Any] | None]
"""One source to open: its URL and storage options."""

T = TypeVar("T")
R = TypeVar("R")

_OK, _FAILED = 0, 1
_MESSAGE_CHARS = 1 << 16  # of rank 0's error message, sent to every rank


class OpenGroup:
    """The collectives of a dataset's open among the ranks of a job, each bounded by ``timeout_s``.

    A context manager: the group is destroyed on exit. Inactive (every method local) without a
    process group or with one rank.

    Args:
        timeout_s: how long a rank waits for the others (to make the group, for rank 0's reads).
        where: names the dataset in errors (``"StreamingDataset('s3://b/ds')"``).

    Attributes:
        rank: this process's rank (0 when inactive).
        world: the number of ranks (1 when inactive).

    Raises:
        PlanError: not every rank made the group within ``timeout_s``.
    """

    def __init__(self, timeout_s: float, where: str) -> None:
        self.timeout_s, self.where = timeout_s, where
        self.rank, self.world = rank_and_world() if group_initialized() else (0, 1)
        self._group: dist.ProcessGroup | None = None
        if self.world > 1:
            try:  # gloo connects every pair here: a rank that never opens the dataset stops this one
                self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
            except RuntimeError as exc:  # DistStoreError, DistBackendError
                raise self._lost(exc) from exc

    @property
    def active(self) -> bool:
        """Whether there are other ranks to share with."""
        return self._group is not None

    def __enter__(self) -> OpenGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` (same shape and dtype on every rank), in place."""
        if self._group is not None and tensor.numel():
            try:
                dist.broadcast(tensor, src=0, group=self._group)
            except RuntimeError as exc:
                raise self._lost(exc) from exc
        return tensor

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (index = rank): values the library built, never bytes from storage."""
        if self._group is None:
            return [obj]
        out: list[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj, group=self._group)
        except RuntimeError as exc:
            raise self._lost(exc) from exc
        return out

    def _lost(self, exc: BaseException) -> PlanError:
        return PlanError(
            f"{self.where} on rank {self.rank}: the {self.world} ranks did not all open it within "
            f"{self.timeout_s:g} s (DatasetOptions.collective_timeout_s), or one of them died: construct the "
            f"dataset on every rank, with the same arguments and in the same order; raise the timeout if rank 0 "
            f"needs longer to read the index ({type(exc).__name__}: {scrub(str(exc))[:500]})"
        )


def open_sources(requests: Sequence[Request], group: OpenGroup | None) -> list[tuple[Store, DatasetIndex]]:
    """Every source's store and index: read by rank 0 and shared, or opened here alone (see module docstring).

    Args:
        requests: each source's URL and storage options (in the same order on every rank).
        group: the open's collectives; None: this process alone.

    Raises:
        what :func:`~streamio.data.locate.open_dataset` raises, on every rank when rank 0's read
        failed; PlanError: the ranks did not all take part in time.
    """
    if group is None or not group.active:
        return _each(lambda r: open_dataset(*r), requests)
    if group.rank == 0:
        return _read_and_send(requests, group)
    header = group.broadcast(torch.zeros(1 + len(requests), dtype=torch.int64))
    status, sizes = int(header[0]), [int(s) for s in header[1:]]
    payload = memoryview(group.broadcast(torch.empty(sum(sizes), dtype=torch.uint8)).numpy()).cast("B")
    if status != _OK:
        raise_failure(payload, group.where)
    out, start = [], 0
    for (url, options), size in zip(requests, sizes, strict=True):
        out.append(parse_dataset(url, options, bytes(payload[start : start + size])))
        start += size
    return out


def _read_and_send(requests: Sequence[Request], group: OpenGroup) -> list[tuple[Store, DatasetIndex]]:
    """Rank 0: open every source, then send the indexes' bytes (or the error) to every rank."""
    header = torch.zeros(1 + len(requests), dtype=torch.int64)
    try:
        fetched = _each(lambda r: fetch_dataset(*r), requests)
    except Exception as exc:
        blob = encode_failure(exc)
        header[0], header[1] = _FAILED, len(blob)
        group.broadcast(header)
        group.broadcast(_tensor(blob))
        raise
    blobs = [data for _, _, data in fetched]
    header[1:] = torch.tensor([len(b) for b in blobs], dtype=torch.int64)
    group.broadcast(header)
    group.broadcast(_tensor(b"".join(blobs)))
    return [(store, index) for store, index, _ in fetched]


def _tensor(data: bytes) -> torch.Tensor:
    return torch.from_numpy(numpy.frombuffer(data, dtype=numpy.uint8).copy())


def encode_failure(exc: BaseException) -> bytes:
    """What rank 0 sends when its open failed: the error's class name and message (credentials
    scrubbed, at most 64 Ki characters) as JSON; :func:`raise_failure` raises it on the other ranks."""
    return json.dumps({"type": type(exc).__name__, "message": scrub(str(exc))[:_MESSAGE_CHARS]}).encode()


def raise_failure(payload: bytes | memoryview, where: str) -> NoReturn:
    """Raise, here, the error rank 0's open raised (:func:`encode_failure`): the same class and
    message where it is one of streamio's, else a :class:`~streamio.errors.DatasetError` naming it.

    Raises:
        StreamioError: always (DatasetError also for a payload that is not such a document).
    """
    doc = load_json(bytes(payload), what=f"rank 0's error opening {where}", error=DatasetError)
    doc = doc if isinstance(doc, dict) else {}
    name, message = str(doc.get("type", "")), str(doc.get("message", ""))
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, StreamioError):
        raise cls(message)
    raise DatasetError(f"{where}: rank 0 could not read the index for every rank: {name}: {message}")


def _each(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` of every item: the sources in parallel (one in this thread)."""
    if len(items) == 1:
        return [fn(items[0])]
    return run_parallel(fn, items, concurrency=16, name="streamio-sources")


def check_agreement(group: OpenGroup, mine: tuple[Any, ...]) -> None:
    """Raise if the ranks' ``(seed, (indexes, epoch_samples), policy, shuffle)`` differ: other
    libraries then duplicate data silently.

    Raises:
        PlanError: naming the ranks that differ from this one.
    """
    if not group.active:
        return
    everyone = group.all_gather(mine)
    bad = [r for r, v in enumerate(everyone) if tuple(v) != mine]
    if bad:
        raise PlanError(
            f"{group.where}: ranks disagree on (seed, index, policy, shuffle): rank {group.rank} has "
            f"{mine[:1] + mine[2:]}, ranks {bad} differ ({everyone[bad[0]][:1]}...). "
            "Pass the same seed and settings on every rank, or data is duplicated silently."
        )
