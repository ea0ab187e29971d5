"""Prometheus text on ``/metrics``: :func:`serve` (needs ``prometheus_client``, the ``metrics`` extra).

The server renders the same totals as :func:`streamio.metrics.snapshot` (this process and its
forked DataLoader workers) at each scrape, from a collector of its own in a private
``CollectorRegistry``: nothing of prometheus_client's global registry (the process's own
``python_*`` metrics, a user's instruments) is mixed in, and a user who already serves that
registry can add :class:`Collector` to it instead. One server per process; it runs in a daemon
thread for the rest of the process's life. A forked child does not inherit it (its thread stays in
the parent): the child closes its copy of the listening socket, and its own :func:`serve` starts a
server of its own, serving the child's metrics.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from streamio.errors import ConfigError, MissingDependencyError
from streamio.metrics.catalog import ALL
from streamio.metrics.instruments import METRICS_ENV, RECORDING, Counter, Gauge, Histogram
from streamio.metrics.registry import totals

__all__ = ["INSTALL", "Collector", "serve"]

#: What adds prometheus_client to an environment that has streamio.
INSTALL = "pip install 'streamio-torch[metrics]'"

log = logging.getLogger(__name__)

_lock = threading.Lock()
_server: Any = None  # the running WSGI server (its server_port is the bound port)


def _after_fork_in_child() -> None:
    """The parent's server is not this process's: forget it, and close the copy of its socket (a
    child that outlives the parent would hold the port with no thread answering)."""
    global _server, _lock
    _lock = threading.Lock()
    if _server is not None:
        with contextlib.suppress(OSError):
            _server.socket.close()
        _server = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _require() -> ModuleType:
    try:
        return importlib.import_module("prometheus_client.core")
    except ImportError as exc:
        raise MissingDependencyError(
            f"streamio.metrics.serve needs prometheus_client (it cannot be imported: {exc}). Install it with {INSTALL}"
        ) from exc


class Collector:
    """A prometheus_client collector of every streamio instrument (``registry.register(Collector())``)."""

    def collect(self) -> Iterator[Any]:
        """One metric family per instrument of the catalog, with its HELP line, read now."""
        core = _require()
        found = totals()
        for instrument in ALL:
            values = found.get(instrument.name, {})
            names = list(instrument.labels)
            if isinstance(instrument, Histogram):
                family = core.HistogramMetricFamily(instrument.name, instrument.help, labels=names)
                for key, row in sorted(values.items()):
                    running, buckets = 0.0, []
                    for bound, count in zip((*instrument.buckets, float("inf")), row[:-2], strict=True):
                        running += count
                        buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
                    family.add_metric(list(key), buckets, row[-2])
            elif isinstance(instrument, Counter):
                family = core.CounterMetricFamily(instrument.name, instrument.help, labels=names)
                for key, value in sorted(values.items()):
                    family.add_metric(list(key), value)
            else:
                family = core.GaugeMetricFamily(instrument.name, instrument.help, labels=names)
                latest = isinstance(instrument, Gauge) and instrument.mode == "latest"
                for key, value in sorted(values.items()):
                    family.add_metric(list(key), value[0] if latest else value)
            if not names and not values:  # an unlabelled series exists from the start, at zero
                if isinstance(instrument, Histogram):
                    family.add_metric([], [(repr(b), 0.0) for b in instrument.buckets] + [("+Inf", 0.0)], 0.0)
                else:
                    family.add_metric([], 0.0)
            yield family


def serve(port: int = 9464, host: str = "127.0.0.1") -> int:
    """Serve Prometheus text on ``http://host:port/metrics`` from a daemon thread; return the port.

    Args:
        port: the port to listen on; 0 picks a free one (the return value says which).
        host: the address to bind; ``"0.0.0.0"`` to be scraped from other machines.

    Returns:
        The bound port. A second call returns the running server's port, whatever it asks for.

    Raises:
        MissingDependencyError: prometheus_client is not installed (the ``metrics`` extra).
        ConfigError: ``port`` is not an int in 0-65535, or the address cannot be bound (the port is
            taken, the host is not this machine's).
    """
    global _server
    _require()
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(
            f"streamio.metrics.serve(port={port!r}): a port is an int from 0 to 65535 (0 picks a free one)"
        )
    if not RECORDING:
        log.warning("streamio.metrics.serve: %s=off, so every metric it serves stays at zero; unset %s to record",
                    METRICS_ENV, METRICS_ENV)
    with _lock:
        if _server is None:
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry(auto_describe=False)
            registry.register(Collector())
            try:
                _server, _ = start_http_server(port, addr=host, registry=registry)
            except OSError as exc:
                raise ConfigError(
                    f"streamio.metrics.serve cannot listen on {host}:{port} ({exc}); pass another port, or "
                    f"port=0 for a free one"
                ) from exc
        return int(_server.server_port)
