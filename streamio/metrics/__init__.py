"""What streamio's I/O is doing, as numbers: store requests and bytes, the node cache, the
loader's waits, checkpoint phases (docs/observing.md).

::

    snap = streamio.metrics.snapshot()    # this process and its DataLoader workers, JSON-safe
    streamio.metrics.serve(port=9464)     # Prometheus text on /metrics (the ``metrics`` extra)

With ``opentelemetry-api`` installed and a ``MeterProvider`` set, the same instruments are
reported there too. ``STREAMIO_TRACE=/path/trace.json`` writes a Chrome/Perfetto trace of this
process's stages (one file per process, the pid in its name). Recording costs a dict update per
event in the recording thread, and nothing needs to be installed or configured;
``STREAMIO_METRICS=off`` turns it into a method call that does nothing.
"""

from streamio.metrics.catalog import ALL
from streamio.metrics.processes import report
from streamio.metrics.prometheus import serve
from streamio.metrics.registry import reset, snapshot

__all__ = ["ALL", "report", "reset", "serve", "snapshot"]
