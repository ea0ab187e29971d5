"""Run a local S3 or GCS server for your own experiments: ``python -m streamio.testing s3|gcs``.

The loopback servers that the tests use (moto, as in ``local_s3()``; fake-gcs-server, as in
``local_gcs()``), started as a foreground process that prints the environment a shell needs to
reach them (on stdout, or into ``--env-file``) and serves until it is stopped::

    python -m streamio.testing s3 --bucket demo --env-file s3.env &   # or in its own terminal
    SERVER=$!
    until [ -s s3.env ] || ! kill -0 $SERVER 2>/dev/null; do sleep 0.2; done   # ready, or it failed
    source s3.env
    streamio shard ./images s3://demo/images                          # any s3:// tool now talks to it

Why environment variables and not ``-o endpoint_url=...``: every process of a job (the CLI, the
training script, its DataLoader workers, torchrun's ranks) then reaches the server without a
change to its code, the way it would reach a real bucket. streamio's ``Store`` builds its clients
from the environment when no storage options are given: botocore reads ``AWS_ENDPOINT_URL(_S3)``,
the credentials and the region; gcsfs reads ``STORAGE_EMULATOR_HOST``, and fsspec's
``FSSPEC_GS_TOKEN=anon`` makes gcsfs send no credentials instead of looking for Google ones (which
would probe the cloud metadata server). ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` spares
every GCS bucket a 20-80 s gRPC probe against the emulator.

The env file is written atomically once the server answers and its buckets exist (so "the file is
there" means "ready"), and removed when the server stops (a stale file would point at a dead port).
Objects live in memory (moto: in temporary files) and are gone when the server stops.

Exit status: 0 stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP; 1 the server could not start (port
in use, a bucket name the server refuses, fake-gcs-server missing); 2 usage. For S3, bucket names
are checked against AWS's naming rules before the server starts (moto itself accepts ``Demo`` or
``my_bucket``, which no real bucket can be called): the error names the bucket and the rule.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

from streamio.errors import ConfigError
from streamio.testing.gcs import FakeGcsServer, GcsEndpoint
from streamio.testing.s3 import MotoServer, S3Endpoint

__all__ = ["Serving", "StartError", "env_lines", "main", "serve"]

KINDS = ("s3", "gcs")
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StartError(RuntimeError):
    """The server could not start, make a bucket or write its env file (exit status 1)."""


@dataclass(frozen=True)
class Serving:
    """A running local server: where it listens, its buckets, and the environment that reaches it."""

    kind: str
    endpoint_url: str
    buckets: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)

    def urls(self) -> list[str]:
        """``s3://bucket`` / ``gs://bucket`` of each bucket made."""
        scheme = _SCHEMES[self.kind]
        return [f"{scheme}://{b}" for b in self.buckets]


def env_lines(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines (values shell-quoted), for ``source`` or ``eval`` in a POSIX shell."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def check_port_free(port: int) -> None:
    """Raise :class:`StartError` if ``port`` is taken on 127.0.0.1 (moto would wait forever on it)."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise StartError(f"port {port} on 127.0.0.1 is not free ({exc.strerror}): pick another --port") from exc


_S3_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
_S3_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")  # reserved by AWS
_S3_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def s3_bucket_rule_broken(name: str) -> str | None:
    """The S3 bucket naming rule ``name`` breaks, the first in AWS's order (None: it keeps them
    all). moto accepts most names AWS refuses (``Demo``, ``my_bucket``); a server that made them
    would teach a name no real bucket can have."""
    rules = [
        (not 3 <= len(name) <= 63, f"is 3 to 63 characters long, not {len(name)}"),
        (not set(name) <= _S3_CHARS,
         f"has only lower-case letters, digits, '.' and '-', not {''.join(sorted(set(name) - _S3_CHARS))!r}"),
        (not (name[:1] + name[-1:]).isalnum(), "begins and ends with a letter or digit"),
        (".." in name, "never has two periods in a row"),
        (name.count(".") == 3 and all(part.isdigit() for part in name.split(".")), "is never an IP address"),
        (name.startswith(_S3_PREFIXES), f"never begins with {', '.join(_S3_PREFIXES)}"),
        (name.endswith(_S3_SUFFIXES), f"never ends with {', '.join(_S3_SUFFIXES)}"),
    ]
    return next((f"an S3 bucket name {rule}" for broken, rule in rules if broken), None)


@contextlib.contextmanager
def _s3(port: int, buckets: Sequence[str]) -> Iterator[Serving]:
    from botocore.exceptions import ClientError, ParamValidationError

    for name in buckets:
        if (rule := s3_bucket_rule_broken(name)) is not None:
            raise StartError(f"refused bucket {name!r}: {rule}; pick another --bucket (the rules: "
                             f"https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)")
    check_port_free(port)
    server = MotoServer(port)
    endpoint = S3Endpoint(server.start(), "unused")
    try:
        for name in buckets:
            try:
                endpoint.new_bucket(name)
            except (ClientError, ParamValidationError) as exc:
                raise StartError(f"the S3 server refused bucket {name!r}: {exc}") from exc
        yield Serving("s3", endpoint.endpoint_url, tuple(buckets), endpoint.env())
    finally:
        server.stop()


@contextlib.contextmanager
def _gcs(port: int, buckets: Sequence[str]) -> Iterator[Serving]:
    import urllib.error

    check_port_free(port)
    server = FakeGcsServer(port)
    try:
        endpoint = GcsEndpoint(server.start(), "unused")
    except (FileNotFoundError, RuntimeError) as exc:
        server.stop()
        raise StartError(str(exc)) from exc
    try:
        for name in buckets:
            try:
                endpoint.new_bucket(name)
            except urllib.error.HTTPError as exc:
                raise StartError(f"the GCS server refused bucket {name!r}: HTTP {exc.code} {exc.reason}") from exc
        env = {**endpoint.env(), "FSSPEC_GS_TOKEN": "anon"}
        yield Serving("gcs", endpoint.endpoint_url, tuple(buckets), env)
    finally:
        server.stop()


def serve(kind: str, *, port: int = 0, buckets: Sequence[str] = ()) -> contextlib.AbstractContextManager[Serving]:
    """Start a local ``"s3"`` (moto) or ``"gcs"`` (fake-gcs-server) server on 127.0.0.1 and make
    ``buckets``; stop it on exit.

    Args:
        kind: ``"s3"`` or ``"gcs"``.
        port: the port to listen on; 0 picks a free one.
        buckets: bucket names to create.

    Raises:
        ConfigError: ``kind`` is neither.
        StartError: the port is taken, the server did not start, or it refused a bucket name.
    """
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    return _STARTERS[kind](port, buckets)


_STARTERS = {"s3": _s3, "gcs": _gcs}
_SCHEMES = {"s3": "s3", "gcs": "gs"}  # server kind -> the URL scheme its buckets are reached by
_NAMES = {"s3": "S3 (moto)", "gcs": "GCS (fake-gcs-server)"}


def write_env_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temp file beside it, then a rename).

    Raises:
        StartError: it cannot be written (no such directory, no permission).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise StartError(f"cannot write --env-file {path}: {exc.strerror or exc}") from exc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m streamio.testing",
        description="Serve a local S3 (moto) or GCS (fake-gcs-server) on 127.0.0.1 until interrupted; "
        "print the environment that points s3:// or gs:// URLs at it.",
        epilog="Exit status: 0 stopped by Ctrl-C / SIGTERM / SIGHUP, 1 the server could not start, 2 usage.",
    )
    p.add_argument("kind", choices=KINDS, help="which server")
    p.add_argument("--bucket", action="append", default=[], metavar="NAME",
                   help="create this bucket (repeatable); none by default")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--env-file", type=Path, metavar="PATH",
                   help="write the export lines to PATH once ready, instead of stdout (removed on exit)")
    return p


def _announce(serving: Serving, env_file: Path | None, out: TextIO, err: TextIO) -> None:
    if env_file is None:
        out.write(env_lines(serving.env))
        out.flush()
    name = _NAMES[serving.kind]
    where = ", ".join(serving.urls()) or "no bucket (--bucket NAME makes one)"
    how = f"source {env_file}" if env_file else "export the lines above"
    scheme = _SCHEMES[serving.kind] + "://"
    err.write(f"{name} serving on {serving.endpoint_url}: {where}\n"
              f"{how} to point {scheme} URLs at it; Ctrl-C stops it (objects are not kept)\n")
    err.flush()


def main(argv: Sequence[str] | None = None, *, stop: threading.Event | None = None) -> int:
    """The command line; returns the exit status. ``stop`` (for tests) ends serving when set."""
    args = _parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        _parser().error(f"--port {args.port} is not a port number (0-65535)")
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        with serve(args.kind, port=args.port, buckets=args.bucket) as serving:
            if args.env_file is not None:
                write_env_file(args.env_file, env_lines(serving.env))
            try:
                _announce(serving, args.env_file, sys.stdout, sys.stderr)
                while not stop.wait(0.5):
                    pass
            finally:
                if args.env_file is not None:
                    with contextlib.suppress(FileNotFoundError):
                        args.env_file.unlink()
    except StartError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(f"{args.kind} server stopped", file=sys.stderr)
    return 0
