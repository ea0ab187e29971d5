"""What users need to test their own pipelines: a loopback S3 server, a GCS emulator, a fault proxy."""

from streamio.testing.gcs import FakeGcsServer, GcsEndpoint, local_gcs
from streamio.testing.proxy import FaultProxy, RequestRecord
from streamio.testing.s3 import MotoServer, S3Endpoint, local_s3

__all__ = [
    "MotoServer", "S3Endpoint", "local_s3", "FaultProxy", "RequestRecord", "FakeGcsServer", "GcsEndpoint", "local_gcs",
]
