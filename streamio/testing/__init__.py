"""What users need to test their own pipelines: a loopback S3 server, a GCS emulator, a fault proxy.

The same servers and proxy streamio's own tests use (docs/design.md "Testing"); the map of its
modules: docs/design.md "Layout and the direction of dependencies".
"""

from streamio.testing.gcs import FakeGcsServer, GcsEndpoint, local_gcs
from streamio.testing.proxy import FaultProxy, RequestRecord
from streamio.testing.s3 import MotoProcess, MotoServer, S3Endpoint, local_s3

__all__ = [
    "MotoServer", "MotoProcess", "S3Endpoint", "local_s3", "FaultProxy", "RequestRecord",
    "FakeGcsServer", "GcsEndpoint", "local_gcs",
]
