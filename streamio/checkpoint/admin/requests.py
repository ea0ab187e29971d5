"""A save's and a restore's requests, on paper: ``streamio ckpt plan`` (no I/O).

What a checkpoint of a given size costs a store at a given world size, from the same rules the
code follows (docs/design.md "Request rates", "Restore fan-out"): each rank writes its share of
the state (``state / world``) cut into parts (:func:`~..options.part_size_for`: at most
``part_size``, about two per upload thread, never below 4 MiB, and about ``parts_per_save`` for
the whole job), an object larger than the store's
multipart threshold going up as a multipart upload (one request to start, one per 16 MiB, one to
complete); then one done marker per rank, the manifest and the pointer. A restore reads every part
once per rank that needs it: replicated state once per job with fan-out (``W`` times without),
sharded state once (each rank its own). Times are lower bounds: the requests at the store's
per-prefix rate and the bytes at each node's bandwidth, whichever is longer; twice: with every
request on one prefix (a new one, or a root the store has not partitioned), and with the save's
objects spread over ``min(key_prefixes, world)`` key prefixes (:class:`~..format.layout.Placement`)
that the store serves each at that rate once it has partitioned them.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamio.checkpoint.options import SaveOptions, part_size_for
from streamio.errors import ConfigError

__all__ = ["GCS", "S3", "StoreLimits", "Plan", "plan_requests"]

_MIB = 1 << 20
_MULTIPART_THRESHOLD = 64 * _MIB  # streamio.storage.store: larger objects go up in parts
_MULTIPART_PART = 16 * _MIB


@dataclass(frozen=True)
class StoreLimits:
    """What a store allows one prefix (the documented starting points; stores scale up over time).

    Attributes:
        name: for the report.
        writes_per_s: PUT/POST/DELETE per second per prefix.
        reads_per_s: GET/HEAD per second per prefix.
    """

    name: str
    writes_per_s: float
    reads_per_s: float


S3 = StoreLimits("s3 (3,500 writes/s, 5,500 reads/s per prefix)", 3500.0, 5500.0)
GCS = StoreLimits("gcs (1,000 writes/s, 5,000 reads/s at the start of a bucket)", 1000.0, 5000.0)


@dataclass(frozen=True)
class Plan:
    """The requests and bytes of one save and one restore (see the module docstring)."""

    world: int
    state_bytes: int
    part_bytes: int
    objects_per_rank: int
    save_requests: int
    save_bytes_per_node: int
    save_s: float
    restore_requests: int
    restore_store_bytes: int
    restore_bytes_per_node: int
    restore_s: float
    save_bound: str
    restore_bound: str
    key_prefixes: int = 1
    save_s_spread: float = 0.0
    restore_s_spread: float = 0.0


def plan_requests(
    state_bytes: int, world: int, *, options: SaveOptions | None = None, sharded: bool = False,
    limits: StoreLimits = S3, ranks_per_node: int = 8, node_bytes_per_s: float = 12.5e9,
) -> Plan:
    """The plan of a save and a restore of ``state_bytes`` by ``world`` ranks.

    Args:
        state_bytes: the checkpoint's size (replicated, or the sum of the shards with ``sharded``).
        world: ranks; ``ranks_per_node`` of them share a node's bandwidth (``node_bytes_per_s``).
        options: how each rank cuts its share (``part_size``, ``concurrency``, ``parts_per_save``),
            over how many key prefixes (``key_prefixes``) and whether a restore fans out
            (``restore_fanout``: replicated state read once per job).
        sharded: each rank restores only its own share (FSDP); else every rank needs all of it.
        limits: the store's per-prefix request rates.

    Raises:
        ConfigError: a size or count that is not positive.
    """
    options = options or SaveOptions()
    fanout = options.restore_fanout
    if state_bytes < 1 or world < 1 or ranks_per_node < 1:
        raise ConfigError(f"state_bytes, world and ranks_per_node must be positive, got "
                          f"{(state_bytes, world, ranks_per_node)}")
    share = -(-state_bytes // world)
    part = part_size_for(share, options, world=world)
    objects = -(-share // part)
    per_object = 1 if part <= _MULTIPART_THRESHOLD else 2 + -(-part // _MULTIPART_PART)
    nodes = -(-world // ranks_per_node)
    save_requests = world * (objects * per_object + 1) + 2  # parts, markers, manifest, pointer
    save_node = share * min(ranks_per_node, world)
    save_s, save_bound = _bound(save_requests / limits.writes_per_s, save_node / node_bytes_per_s)
    prefixes = min(options.key_prefixes, world)
    busiest = -(-world // prefixes)  # ranks on the busiest prefix (rank r on r mod prefixes)
    save_spread = max(busiest * (objects * per_object + 1) / limits.writes_per_s, save_node / node_bytes_per_s)
    readers = 1 if sharded or fanout else world  # how many times each part is read from the store
    gets_per_object = 1 if part <= _MULTIPART_THRESHOLD else -(-part // _MULTIPART_PART)  # ranged reads
    restore_requests = readers * world * objects * gets_per_object + 2  # parts, manifest and pointer once
    store_bytes = readers * share * world
    restore_node = store_bytes // nodes if readers == 1 else state_bytes * min(ranks_per_node, world)
    restore_s, restore_bound = _bound(restore_requests / limits.reads_per_s, restore_node / node_bytes_per_s)
    restore_spread = max(readers * busiest * objects * gets_per_object / limits.reads_per_s,
                         restore_node / node_bytes_per_s)
    return Plan(world, state_bytes, part, objects, save_requests, save_node, save_s, restore_requests, store_bytes,
                restore_node, restore_s, save_bound, restore_bound, prefixes, save_spread, restore_spread)


def _bound(rate_s: float, bandwidth_s: float) -> tuple[float, str]:
    return (rate_s, "request rate") if rate_s >= bandwidth_s else (bandwidth_s, "node bandwidth")
