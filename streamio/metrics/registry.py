"""The process's instruments and :func:`snapshot`, the one view every exporter renders.

:func:`snapshot` is process-wide and JSON-safe: ``{name: value}`` for a metric without labels,
``{name: {'op="get",outcome="ok"': value}}`` with labels (Prometheus' label syntax, values
escaped as Prometheus escapes them), a histogram as ``{"count", "sum", "buckets"}`` with cumulative
bucket counts keyed by upper bound (``"+Inf"`` last). It includes what forked children reported
(:mod:`.processes`).
"""

from __future__ import annotations

from typing import Any

from streamio.metrics import otel, processes
from streamio.metrics.catalog import ALL
from streamio.metrics.instruments import Gauge, Histogram, Instrument, LabelKey, merge_values

__all__ = ["label_string", "reset", "snapshot", "totals"]


def _own() -> processes.Family:
    return {i.name: i.values() for i in ALL}


def _first_record() -> None:
    processes.recording_started()
    otel.register(totals)  # OpenTelemetry imported since: report there too (a dict look-up otherwise)


processes.bind(lambda: ALL, _own)
Instrument.on_first_record = staticmethod(_first_record)


def totals() -> processes.Family:
    """This process's values and its forked children's, merged: name -> label key -> raw value."""
    out = _own()
    by_name = {i.name: i for i in ALL}
    for name, values in processes.children_values().items():
        merge_values(by_name[name], out.setdefault(name, {}), values)
    return out


def snapshot() -> dict[str, Any]:
    """Every streamio metric of this process and its forked DataLoader workers, JSON-safe.

    Example::

        >>> streamio.metrics.snapshot()["streamio_store_requests_total"]
        {'op="get",outcome="ok"': 212.0, 'op="get",outcome="throttled"': 3.0}
    """
    otel.register(totals)
    found = totals()
    return {i.name: _render(i, found.get(i.name, {})) for i in ALL}


def reset() -> None:
    """Forget this process's counts (tests and benchmarks that compare runs; children's too)."""
    for instrument in ALL:
        instrument.forget()
    processes.forget_children()


def label_string(instrument: Instrument, key: LabelKey) -> str:
    """``op="get",outcome="ok"``: Prometheus' label syntax."""
    return ",".join(f'{n}="{_escape(v)}"' for n, v in zip(instrument.labels, key, strict=True))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render(instrument: Instrument, values: dict[LabelKey, Any]) -> Any:
    def one(value: Any) -> Any:
        if isinstance(instrument, Histogram):
            running, buckets = 0, {}
            for bound, count in zip((*instrument.buckets, float("inf")), value[:-2], strict=True):
                running += count
                buckets["+Inf" if bound == float("inf") else repr(bound)] = running
            return {"count": value[-1], "sum": value[-2], "buckets": buckets}
        if isinstance(instrument, Gauge) and instrument.mode == "latest":
            return value[0]
        return value

    if not instrument.labels:
        return one(values[()]) if () in values else one(_zero(instrument))
    return {label_string(instrument, k): one(v) for k, v in sorted(values.items())}


def _zero(instrument: Instrument) -> Any:
    if isinstance(instrument, Histogram):
        return [0] * (len(instrument.buckets) + 1) + [0.0, 0]
    if isinstance(instrument, Gauge) and instrument.mode == "latest":
        return (0.0, 0.0)
    return 0.0


otel.register(totals)  # OpenTelemetry imported before streamio.metrics
