"""Restore fan-out: the parts several ranks need are read once per job, from the nearest copy.

Without it every rank of a DDP job GETs every part holding replicated state: at W ranks the store
serves W times the checkpoint (docs/design.md "Restore fan-out"). Here the ranks first exchange
what each needs (:attr:`~.fetch.Read.key`, size, and whether the rank holds the part on its local
tier); every request two or more ranks want is given to one of them (:func:`assign`: balanced by
bytes, largest first, to the least loaded of the ranks that hold it locally, else of those that
want it); each rank reads and verifies its share (from its local tier where it holds it, else the
store); the ranks agree that every share verified; then each share is broadcast over the process
group. So the store serves each part at most once, and not at all when some rank's node holds it:
a save spread over several nodes' local tiers (each rank wrote its share of the replicated state
on its own node) restores without the store. Every rank verifies what it receives again, like a
read of its own (:func:`~.fetch.check_raw`, in :func:`~.fetch.fetch_spans`), so a peer's bytes
are trusted no more than the store's; bytes that do not verify there were verified by the rank
that sent them, so they were damaged on that rank or on the way, never in the store: the
receiving rank reads them itself, with a warning naming the sender, and the checkpoint is not
judged on them (docs/design.md "Restore"). Requests only one rank wants (its per-rank state,
the boxes of sharded state it holds) it reads itself, as before.

:func:`share_reads` is a collective: every rank calls it for every restore attempt, also a rank
that failed before knowing its requests (it passes ``None``; then no rank exchanges anything and
each reads its own, so the restore walk's agreement decides as before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from streamio.checkpoint.tensors.fetch import Read, Received
from streamio.errors import CorruptDataError
from streamio.pool import run_parallel

__all__ = ["Group", "Key", "assign", "share_reads"]

log = logging.getLogger(__name__)

Key = tuple[str, int, int]
"""A request as every rank names it: (part path, raw start, raw end)."""


class Group(Protocol):
    """The collectives a fan-out needs (:class:`~streamio.checkpoint.comm.Comm` is one)."""

    rank: int
    world: int

    def all_gather(self, obj: Any) -> list[Any]: ...
    def broadcast_bytes(self, data: bytes | memoryview | None, *, src: int, size: int) -> memoryview: ...


def assign(wants: Sequence[Mapping[Key, tuple[int, bool]] | None]) -> dict[Key, int]:
    """Which rank reads each request that two or more ranks want (pure; the same on every rank).

    Args:
        wants: per rank, its requests with their sizes in bytes and whether this rank holds the
            part on its local tier (``None``: the rank takes no part).

    Returns:
        ``key -> rank``: largest requests first, each to the least loaded rank (bytes assigned so
        far) among those that want it and hold it locally, else among all that want it; the
        lowest rank on a tie.
    """
    askers: dict[Key, list[int]] = {}
    holders: dict[Key, list[int]] = {}
    sizes: dict[Key, int] = {}
    for rank, mine in enumerate(wants):
        for key, (size, held) in (mine or {}).items():
            askers.setdefault(key, []).append(rank)
            if held:
                holders.setdefault(key, []).append(rank)
            sizes[key] = size
    load = [0] * len(wants)
    out: dict[Key, int] = {}
    for key in sorted((k for k, who in askers.items() if len(who) > 1), key=lambda k: (-sizes[k], k)):
        rank = min(holders.get(key) or askers[key], key=lambda r: (load[r], r))
        out[key] = rank
        load[rank] += sizes[key]
    return out


def share_reads(
    comm: Group, reads: Sequence[Read] | None, read: Callable[[Read], bytes | memoryview], *, concurrency: int,
    where: str, held: Collection[Key] = (),
) -> dict[Key, Received]:
    """Read this rank's share of the requests several ranks want, and exchange the shares (a collective).

    Args:
        comm: the restore's collectives.
        reads: the requests this rank needs (``None``: this rank failed before knowing them).
        read: one request's stored bytes from the nearest copy (this rank's local tier, else the
            store), verified (raises when they are not).
        concurrency: parallel GETs of this rank's share.
        where: the save directory's URL, for messages.
        held: the requests this rank can read from its local tier: a rank that holds a part
            serves it to the others, so a save spread over several nodes' local tiers restores
            without the store.

    Returns:
        The stored bytes of every shared request this rank wants and the rank that sent them,
        by key (empty when any rank passed ``None`` or the job is one process).

    Raises:
        CorruptDataError: another rank's share did not read or verify (its message); this rank's
            own error when its share did not.
        CheckpointError: the process group failed.
    """
    if comm.world == 1:
        return {}
    mine = None if reads is None else {r.key: (r.size, r.key in held) for r in reads}
    wants = comm.all_gather(mine)
    if any(w is None for w in wants):
        return {}
    owner = assign(wants)
    by_key = {r.key: r for r in reads or ()}
    todo = [by_key[k] for k, rank in owner.items() if rank == comm.rank]
    error: BaseException | None = None
    got: list[bytes | memoryview] = []
    try:
        got = run_parallel(read, todo, concurrency=concurrency, name="streamio-ckpt-fanout")
    except Exception as exc:  # reported to every rank first: all of them raise alike
        error = exc
    failures = comm.all_gather(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    for rank, failure in enumerate(failures):
        if failure is not None:
            raise CorruptDataError(f"rank {rank} could not read its share of {where} for the other ranks: {failure}")
    data = dict(zip((r.key for r in todo), got, strict=True))
    out: dict[Key, Received] = {}
    for key, rank in sorted(owner.items()):  # the same order on every rank
        sizes = wants[rank]
        assert sizes is not None
        received = comm.broadcast_bytes(data.get(key), src=rank, size=sizes[key][0])
        if key in by_key:
            out[key] = Received(received, rank)
    log.debug("restore fan-out: %d shared requests, %d read here, %d bytes read here", len(owner), len(todo),
              sum(len(d) for d in got))
    return out
