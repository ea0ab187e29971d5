"""A loopback S3 server (moto in server mode) for tests and demos.

``local_s3()`` starts moto on 127.0.0.1 with a free port (never 0.0.0.0), creates a fresh bucket
and yields an :class:`S3Endpoint` that says how to reach it, the way s3fs and boto3 take it.
The credentials are moto's dummies; nothing real is ever used or needed.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

REGION = "us-east-1"
ACCESS_KEY = "streamio-test-key"
SECRET_KEY = "streamio-test-secret"  # noqa: S105 - moto's dummy credentials


@dataclass(frozen=True)
class S3Endpoint:
    """Where a local S3 server listens and a bucket made for the caller."""

    endpoint_url: str
    bucket: str
    region: str = REGION
    key: str = field(default=ACCESS_KEY, repr=False)
    secret: str = field(default=SECRET_KEY, repr=False)

    def url(self, path: str = "") -> str:
        """``s3://bucket/path``."""
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    def storage_options(self, endpoint_url: str | None = None) -> dict[str, Any]:
        """s3fs options for this server (or for a proxy in front of it at ``endpoint_url``)."""
        return {
            "key": self.key,
            "secret": self.secret,
            "endpoint_url": endpoint_url or self.endpoint_url,
            "client_kwargs": {"region_name": self.region},
        }

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """Environment variables that point boto3 and s3fs in a child process at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": endpoint_url or self.endpoint_url,
            "AWS_ENDPOINT_URL": endpoint_url or self.endpoint_url,
        }

    def boto3_client(self, endpoint_url: str | None = None) -> Any:
        """A boto3 S3 client for this server (for tests and benchmark ceilings)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint_url,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=self.region,
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=32),
        )

    def new_bucket(self, name: str | None = None) -> S3Endpoint:
        """Create another bucket on the same server."""
        name = name or f"streamio-{uuid.uuid4().hex[:12]}"
        self.boto3_client().create_bucket(Bucket=name)
        return S3Endpoint(self.endpoint_url, name, self.region, self.key, self.secret)


class MotoServer:
    """moto's threaded server bound to 127.0.0.1 on ``port`` (0: a free one); ``start()`` / ``stop()``."""

    def __init__(self, port: int = 0) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.endpoint_url = ""

    def start(self) -> str:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        return self.endpoint_url

    def stop(self) -> None:
        self._server.stop()


class MotoProcess:
    """moto in a process of its own (``python -m streamio.testing s3``) on 127.0.0.1, a free port;
    ``start()`` / ``stop()`` as :class:`MotoServer`.

    For a process that forks while the server runs (a DataLoader's workers): a fork copies every
    lock moto's threads hold at that moment into the child, held for good; in a process of its own
    the server's threads are never forked. The server gets SIGTERM if the process that started it
    dies first (Linux).
    """

    START_TIMEOUT_S = 60.0

    def __init__(self) -> None:
        self.endpoint_url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        with tempfile.TemporaryFile() as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "streamio.testing", "s3"], stdin=subprocess.DEVNULL,
                bufsize=0,  # unbuffered: select() then sees every line still to read
                stdout=subprocess.PIPE, stderr=err, preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only
            )
            assert self._proc.stdout is not None
            deadline = time.monotonic() + self.START_TIMEOUT_S
            while not self.endpoint_url:
                ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                line = self._proc.stdout.readline().decode() if ready else ""
                if line.startswith("export AWS_ENDPOINT_URL_S3="):
                    self.endpoint_url = shlex.split(line.split("=", 1)[1])[0]
                elif not line:
                    self.stop()
                    err.seek(0)
                    raise RuntimeError(f"the moto process did not start within {self.START_TIMEOUT_S:g} s: "
                                       f"{err.read().decode()[-2000:]}")
        return self.endpoint_url

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _die_with_parent() -> None:
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl
            os._exit(1)


@contextmanager
def local_s3(bucket: str | None = None) -> Iterator[S3Endpoint]:
    """Start a loopback moto S3 server with a fresh bucket; stop it on exit.

    Example::

        with local_s3() as s3:
            ds = StreamingDataset(s3.url("data"), storage_options=s3.storage_options())
    """
    server = MotoServer()
    endpoint = server.start()
    try:
        yield S3Endpoint(endpoint, "unused").new_bucket(bucket)
    finally:
        server.stop()
