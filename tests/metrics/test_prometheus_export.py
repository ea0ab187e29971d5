"""streamio.metrics.serve: Prometheus text over real HTTP, equal to snapshot(), parsed by
prometheus_client's own parser; one server per process; what a missing package or a taken port says."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import streamio.metrics
from streamio.errors import ConfigError, MissingDependencyError
from streamio.metrics import catalog as c
from streamio.metrics import prometheus
from streamio.metrics.instruments import Gauge, Histogram


@pytest.fixture
def recorded() -> dict[str, Any]:
    streamio.metrics.reset()
    c.STORE_REQUESTS.add(5, "get", "ok")
    c.STORE_REQUESTS.add(2, "get", "throttled")
    c.STORE_REQUESTS.add(1, "put", "failed")
    c.STORE_BYTES_READ.add(12345)
    for s in (0.0004, 0.02, 0.02, 3.0, 99.0):
        c.STORE_SECONDS.observe(s, "get")
    c.CACHE_BYTES.set(4096)
    c.PREFETCH_DEPTH.add(3)
    c.PREFETCH_DEPTH.add(-1)
    c.CHECKPOINT_SECONDS.observe(1.25, "blocked")
    c.CHECKPOINT_BYTES.add(77, "write")
    yield streamio.metrics.snapshot()
    streamio.metrics.reset()


def _scrape(port: int) -> dict[str, Any]:
    """The scrape as the snapshot's shape: name -> value, or labels -> value, histograms as dicts."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return _parse(response.read().decode())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _parse(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    helps = {}
    for family in text_string_to_metric_families(text):
        helps[family.name] = family.documentation
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            key = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            if family.type == "histogram":
                row = out.setdefault(family.name, {}).setdefault(key, {"count": None, "sum": None, "buckets": {}})
                part = sample.name[len(family.name) + 1:]
                if part == "bucket":
                    row["buckets"][sample.labels["le"]] = sample.value
                elif part in ("count", "sum"):
                    row[part] = sample.value
            elif sample.name.endswith("_created"):
                continue
            else:
                out.setdefault(sample.name, {})[key] = sample.value
    out["HELP"] = helps
    return out


def _expected(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with an unlabelled value under the empty label string; labelled metrics with no
    series yet are absent from a scrape."""
    out: dict[str, Any] = {}
    for name, value in snap.items():
        if not isinstance(value, dict) or set(value) == {"count", "sum", "buckets"}:
            value = {"": value}
        if value:
            out[name] = value
    return out


def test_a_scrape_equals_the_snapshot_with_the_catalog_help(recorded: dict[str, Any]) -> None:
    port = streamio.metrics.serve(port=0)
    assert port > 0 and streamio.metrics.serve(port=port + 1) == port  # one server per process
    scraped = _scrape(port)
    helps = scraped.pop("HELP")
    assert scraped == _expected(recorded)
    assert scraped["streamio_store_request_seconds"]['op="get"']["buckets"]["+Inf"] == 5
    assert scraped["streamio_store_requests_total"]['op="get",outcome="throttled"'] == 2
    assert helps == {i.name.removesuffix("_total"): i.help for i in c.ALL}
    c.STORE_REQUESTS.add(1, "get", "ok")  # read at each scrape, not at serve()
    assert _scrape(port)["streamio_store_requests_total"]['op="get",outcome="ok"'] == 6


def test_without_prometheus_client_serve_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)  # an environment without the package
    with pytest.raises(MissingDependencyError, match=r"pip install 'streamio-torch\[metrics\]'"):
        streamio.metrics.serve(port=0)


def test_a_taken_port_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus, "_server", None)  # as in a process that serves nothing yet
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{port} .*port=0") as info:
            streamio.metrics.serve(port=port)
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.parametrize("port", [70000, -1, None, "9464", True, 9464.0])
def test_a_port_that_is_not_one_is_a_config_error_naming_it(port: Any) -> None:
    with pytest.raises(ConfigError, match=r"serve\(port=.*\): a port is an int from 0 to 65535"):
        streamio.metrics.serve(port=port)


_FORKED = """
import json, os, urllib.request
import streamio.metrics
from streamio.metrics import catalog as c

def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        line = [x for x in r.read().decode().splitlines() if x.startswith("streamio_store_bytes_read_total ")]
        return float(line[0].split()[1])

c.STORE_BYTES_READ.add(7)
parent = streamio.metrics.serve(port=0)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    c.STORE_BYTES_READ.add(1000)
    child = streamio.metrics.serve(port=0)
    os.write(w, json.dumps([child, scrape(child)]).encode())
    streamio.metrics.report()  # as a DataLoader worker does at the end of its iterator
    os._exit(0)
os.waitpid(pid, 0)
child, seen = json.loads(os.read(r, 1000))
print(json.dumps({"parent": parent, "child": child, "child_saw": seen, "parent_sees": scrape(parent)}))
"""


def test_a_forked_child_serves_its_own_metrics_and_the_parent_keeps_serving() -> None:
    proc = subprocess.run([sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["child"] != out["parent"]  # not the parent's server, which answers with the parent's totals
    assert out["child_saw"] == 1000.0 and out["parent_sees"] == 1007.0  # the child's report reached the parent


def test_serve_with_recording_off_says_every_metric_stays_at_zero() -> None:
    env = {**os.environ, "STREAMIO_METRICS": "off"}
    code = "import streamio.metrics as m; print(m.serve(port=0) == m.serve(port=0))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True"
    assert proc.stderr.count("STREAMIO_METRICS=off, so every metric it serves stays at zero") == 2, proc.stderr


_records = st.lists(
    st.tuples(st.sampled_from(c.ALL), st.floats(0, 1e6),
              st.lists(st.sampled_from(["get", "a\\b", 'q"', "n\nl", ""]), min_size=2, max_size=2)),
    max_size=30,
)


@settings(max_examples=40)
@given(_records)
def test_the_exposition_of_any_recording_parses_back_to_the_snapshot(records: list[Any]) -> None:
    streamio.metrics.reset()
    try:
        for instrument, amount, labels in records:
            labels = labels[: len(instrument.labels)]  # label values with quotes, backslashes, newlines
            if isinstance(instrument, Histogram):
                instrument.observe(amount, *labels)
            elif isinstance(instrument, Gauge) and instrument.mode == "latest":
                instrument.set(amount, *labels)
            else:
                instrument.add(amount, *labels)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(prometheus.Collector())
        parsed = _parse(generate_latest(registry).decode())
        parsed.pop("HELP")
        assert parsed == _expected(streamio.metrics.snapshot())
    finally:
        streamio.metrics.reset()
