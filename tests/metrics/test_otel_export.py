"""OpenTelemetry: with a MeterProvider set, streamio's totals are reported there, equal to
snapshot(), whether the provider is set before streamio.metrics is imported or after it.

The global provider can be set once per process, so each case runs in a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_SCRIPT = """
import json, sys
order = sys.argv[1]
if order == "late":
    import streamio.metrics  # OpenTelemetry not imported yet: nothing to register
    from streamio.metrics import otel
    assert not otel.registered()
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import streamio.metrics
from streamio.metrics import catalog as c, otel
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # after streamio.metrics's import
c.STORE_REQUESTS.add(5, "get", "ok")
c.STORE_REQUESTS.add(2, "get", "throttled")
c.STORE_BYTES_READ.add(12345)
for s in (0.0004, 0.02, 3.0):
    c.STORE_SECONDS.observe(s, "get")
c.CACHE_BYTES.set(4096)
c.PREFETCH_DEPTH.add(2)
c.CHECKPOINT_SECONDS.observe(1.25, "blocked")
flat = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        assert sm.scope.name == "streamio"
        for metric in sm.metrics:
            for point in metric.data.data_points:
                labels = ",".join(f'{k}="{v}"' for k, v in point.attributes.items())
                flat.setdefault(metric.name, {})[labels] = point.value
import os
read_end, write_end = os.pipe()
if os.fork() == 0:  # a forked worker: its totals reach OpenTelemetry through its parent, never twice
    c.STORE_BYTES_READ.add(5)
    data = reader.get_metrics_data()
    points = 0 if data is None else sum(len(m.data.data_points) for rm in data.resource_metrics
                                        for sm in rm.scope_metrics for m in sm.metrics)
    os.write(write_end, str(points).encode())
    os._exit(0)
os.close(write_end)
child_points = int(os.read(read_end, 100))
print(json.dumps({"registered": otel.registered(), "otel": flat, "snap": streamio.metrics.snapshot(),
                  "child_points": child_points}))
"""


def _expected(snap: dict) -> dict:
    """What OpenTelemetry should hold: the snapshot's series, histograms as _count, _sum and _bucket."""
    out: dict = {}
    for name, value in snap.items():
        series = value if isinstance(value, dict) and set(value) != {"count", "sum", "buckets"} else {"": value}
        for labels, v in series.items():
            if isinstance(v, dict):
                out.setdefault(f"{name}_count", {})[labels] = v["count"]
                out.setdefault(f"{name}_sum", {})[labels] = v["sum"]
                for le, n in v["buckets"].items():
                    out.setdefault(f"{name}_bucket", {})[",".join(filter(None, [labels, f'le="{le}"']))] = n
            else:
                out.setdefault(name, {})[labels] = v
    return out


@pytest.mark.parametrize("order", ["proxy", "late"])
def test_a_provider_set_after_the_import_receives_the_snapshot(order: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, order], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["registered"] is True and out["child_points"] == 0
    assert out["otel"] == _expected(out["snap"])
    requests = out["otel"]["streamio_store_requests_total"]
    assert requests == {'op="get",outcome="ok"': 5, 'op="get",outcome="throttled"': 2}
    assert out["otel"]["streamio_store_request_seconds_bucket"]['op="get",le="+Inf"'] == 3
