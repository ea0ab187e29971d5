"""Every instrument streamio reports, by name: what it counts is defined here once (docs/observing.md
explains each; the names follow Prometheus' conventions)."""

from __future__ import annotations

from streamio.metrics.instruments import Counter, Gauge, Histogram, Instrument

__all__ = [
    "ALL", "CACHE_BYTES", "CACHE_HITS", "CACHE_MISSES", "CHECKPOINT_BYTES", "CHECKPOINT_SECONDS", "LOADER_BATCHES",
    "LOADER_WAIT", "PREFETCH_DEPTH", "STORE_BYTES_READ", "STORE_BYTES_WRITTEN", "STORE_REQUESTS", "STORE_SECONDS",
]

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

STORE_REQUESTS = Counter(
    "streamio_store_requests_total",
    "HTTP attempts (file:// and memory:// calls) by operation and outcome: ok, throttled (503/429), retried, "
    "failed (the last attempt of a request that fails)",
    ("op", "outcome"),
)
STORE_BYTES_READ = Counter("streamio_store_bytes_read_total", "object body bytes received (GET responses)")
STORE_BYTES_WRITTEN = Counter("streamio_store_bytes_written_total", "object body bytes sent (PUT and part bodies)")
STORE_SECONDS = Histogram(
    "streamio_store_request_seconds", "seconds from sending a request to its response headers, by operation",
    ("op",), buckets=_SECONDS,
)
CACHE_HITS = Counter("streamio_cache_hits_total", "shard reads served by the node cache")
CACHE_MISSES = Counter("streamio_cache_misses_total", "shard reads that fetched from the store")
CACHE_BYTES = Gauge("streamio_cache_bytes", "bytes the node cache holds (as last measured)", mode="latest")
LOADER_WAIT = Histogram(
    "streamio_loader_wait_seconds", "seconds the training loop waited for each batch (the first included)",
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
LOADER_BATCHES = Counter("streamio_loader_batches_total", "batches the loader delivered")
PREFETCH_DEPTH = Gauge("streamio_prefetch_depth", "shards fetched ahead of the reader, summed over workers")
CHECKPOINT_SECONDS = Histogram(
    "streamio_checkpoint_seconds",
    "seconds of each checkpoint phase: blocked (inside save()), local (the local tier's commit), durable "
    "(save() call to the root's pointer naming the step), restore (inside restore())",
    ("phase",), buckets=(0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
)
CHECKPOINT_BYTES = Counter(
    "streamio_checkpoint_bytes_total", "checkpoint part bytes written to or read from a store", ("direction",)
)

ALL: tuple[Instrument, ...] = (
    STORE_REQUESTS, STORE_BYTES_READ, STORE_BYTES_WRITTEN, STORE_SECONDS, CACHE_HITS, CACHE_MISSES, CACHE_BYTES,
    LOADER_WAIT, LOADER_BATCHES, PREFETCH_DEPTH, CHECKPOINT_SECONDS, CHECKPOINT_BYTES,
)
