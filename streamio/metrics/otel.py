"""The same instruments in OpenTelemetry, when ``opentelemetry-api`` is in use (nothing otherwise).

What is registered, with the global ``MeterProvider``'s meter ``"streamio"``: one asynchronous
instrument per instrument of the catalog, under the same name, whose callback reads the totals
:func:`streamio.metrics.snapshot` reads (this process and its forked DataLoader workers):
counters as observable counters, gauges as observable gauges, label values as attributes. The
OpenTelemetry API has no asynchronous histogram, so a histogram is reported as Prometheus
renders one: observable counters ``<name>_count``, ``<name>_sum`` and ``<name>_bucket`` (cumulative,
attribute ``le``). Recording is never doubled: the hot path does not know OpenTelemetry.

When: :func:`register` runs once ``opentelemetry.metrics`` is imported in the process, checked at
the import of :mod:`streamio.metrics`, at each thread's first record and at each
:func:`~streamio.metrics.snapshot` (or call :func:`register` after setting a provider). streamio never imports
OpenTelemetry itself (its import costs ~0.1 s). The instruments are made with the API's global
meter, which forwards them to a provider set later: a user may set the provider before or after
importing streamio. A forked child's callbacks report nothing: its parent reports its totals.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from streamio.metrics import processes
from streamio.metrics.catalog import ALL
from streamio.metrics.instruments import Counter, Gauge, Histogram, Instrument

__all__ = ["METER", "register", "registered"]

METER = "streamio"
"""The instrumentation scope of streamio's instruments."""

Totals = Callable[[], processes.Family]
_registered = False


def registered() -> bool:
    """Whether streamio's instruments are registered with OpenTelemetry in this process."""
    return _registered


def register(read: Totals) -> bool:
    """Register the instruments with OpenTelemetry's global meter if ``opentelemetry.metrics`` is
    imported (once per process; cheap to call again). Returns whether they are registered.

    Args:
        read: what the callbacks read (:func:`streamio.metrics.registry.totals`).
    """
    global _registered
    if _registered or "opentelemetry.metrics" not in sys.modules:
        return _registered
    _registered = True  # before the work: a callback that fails must not register twice
    from opentelemetry import metrics

    from streamio.version import __version__

    meter = metrics.get_meter(METER, __version__)
    for instrument in ALL:
        _register_one(meter, instrument, read)
    return True


def _register_one(meter: Any, instrument: Instrument, read: Totals) -> None:
    if isinstance(instrument, Histogram):
        for suffix, part in (("_count", _count), ("_sum", _sum), ("_bucket", _buckets)):
            meter.create_observable_counter(instrument.name + suffix, callbacks=[_callback(instrument, part, read)],
                                            description=instrument.help)
    elif isinstance(instrument, Counter):
        meter.create_observable_counter(instrument.name, callbacks=[_callback(instrument, _value, read)],
                                        description=instrument.help)
    else:
        meter.create_observable_gauge(instrument.name, callbacks=[_callback(instrument, _value, read)],
                                      description=instrument.help)


Part = Callable[[Instrument, Any], Iterable[tuple[dict[str, str], float]]]


def _callback(instrument: Instrument, part: Part, read: Totals) -> Callable[[Any], list[Any]]:
    def observe(options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        if processes.in_forked_child():
            return []
        out = []
        values = read().get(instrument.name) or _unlabelled_zero(instrument)
        for key, value in sorted(values.items()):
            attributes = dict(zip(instrument.labels, key, strict=True))
            out.extend(Observation(v, {**attributes, **extra}) for extra, v in part(instrument, value))
        return out

    return observe


def _unlabelled_zero(instrument: Instrument) -> dict[tuple[str, ...], Any]:
    """A metric without labels is reported from the start, at zero (as snapshot() and a scrape do)."""
    if instrument.labels:
        return {}
    if isinstance(instrument, Histogram):
        return {(): [0] * (len(instrument.buckets) + 1) + [0.0, 0]}
    return {(): (0.0, 0.0) if isinstance(instrument, Gauge) and instrument.mode == "latest" else 0.0}


def _value(instrument: Instrument, value: Any) -> Iterable[tuple[dict[str, str], float]]:
    latest = isinstance(instrument, Gauge) and instrument.mode == "latest"
    yield {}, float(value[0] if latest else value)


def _count(instrument: Instrument, row: Any) -> Iterable[tuple[dict[str, str], float]]:
    yield {}, float(row[-1])


def _sum(instrument: Instrument, row: Any) -> Iterable[tuple[dict[str, str], float]]:
    yield {}, float(row[-2])


def _buckets(instrument: Instrument, row: Any) -> Iterable[tuple[dict[str, str], float]]:
    running = 0.0
    for bound, count in zip((*instrument.buckets, float("inf")), row[:-2], strict=True):  # type: ignore[attr-defined]
        running += count
        yield {"le": "+Inf" if bound == float("inf") else repr(bound)}, running
