"""Shared helpers of the benchmark suite: interleaving, statistics, machine limits, servers.

Why these exist. The machines here are small and shared (2 cores, ~6 concurrent users), so an
absolute MB/s means little from one run to the next. Every section therefore:

* runs its contenders **interleaved** in one process run (:func:`interleave`: A B C, B C A, ...),
  so a noisy minute hurts every contender alike;
* reports the **median and the spread** (min-max) of several repetitions (:func:`summary`);
* states **ratios** to references measured in the same run: the store's ceiling (boto3 parallel
  GET/PUT of the same bytes through the same moto server and proxy, :func:`boto3_ceiling`), local
  disk sequential read/write (:func:`disk_reference`) and memory copy bandwidth
  (:func:`memcpy_reference`).

Servers. :class:`S3Servers` runs moto and one :class:`~streamio.testing.FaultProxy` per simulated
node in a *child process* (so their Python threads never share a GIL with the code measured),
driven by a one-line JSON protocol on stdin/stdout (latency, request-log summaries).
:class:`Nginx` serves a local directory on 127.0.0.1 with Debian's nginx (installed with apt-get
when missing and allowed; otherwise :meth:`Nginx.start` says why and the caller skips): a fast
real HTTP server showing where moto, not our code, is the limit.

Run ``python -m benchmarks.common --serve ...`` only through :class:`S3Servers`.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MB = 1_000_000
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def emit_json(result: Any, path: str | None, *, indent: int = 2) -> None:
    """A benchmark's results as JSON: written to ``path`` (``--json``), else printed."""
    text = json.dumps(result, indent=indent, default=str)
    if path:
        Path(path).write_text(text)
    else:
        print(text)


def print_runs(result: Mapping[str, Any], json_path: str | None, names: Iterable[str] | None = None) -> None:
    """A timing benchmark's end: its machine, each run's median [min-max] seconds (``names``, in
    that order; default all of ``result["runs_s"]``) and its ratios, then ``--json`` if given."""
    print(machine_line(result["machine"]))
    names = list(result["runs_s"] if names is None else names)
    width = max(map(len, names), default=0)
    for name in names:
        s = summary(result["runs_s"][name])
        print(f"{name:>{width}}: {s['median']:.3f} s [{s['min']:.3f}-{s['max']:.3f}]")
    for name, value in result["ratios"].items():
        print(f"{name}: {value:.2f}")
    if json_path:
        emit_json(result, json_path)


# ----------------------------------------------------------------------------- statistics
def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, count and relative spread ((max - min) / median) of ``values``."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0, "spread": float("nan")}
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "spread": (max(values) - min(values)) / med if med else float("nan"),
    }


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when ``b`` is zero or missing (a ratio to nothing is no figure)."""
    try:
        return a / b if b else float("nan")
    except TypeError:
        return float("nan")


def phase_seconds(since: Mapping[str, float] | None = None) -> dict[str, float]:
    """Seconds per checkpoint phase so far in this process, as streamio's own instruments report
    them (``streamio_checkpoint_seconds``), less ``since``: benchmarks read streamio's phases from
    there, not from a clock of their own, and check them against one around the call."""
    import streamio.metrics

    hist = streamio.metrics.snapshot()["streamio_checkpoint_seconds"]
    out = {p: hist.get(f'phase="{p}"', {"sum": 0.0})["sum"] for p in ("blocked", "local", "durable", "restore")}
    return {p: v - (since or {}).get(p, 0.0) for p, v in out.items()}


def interleave(
    contenders: Mapping[str, Callable[[], Any]],
    reps: int,
    *,
    before: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, list[Any]]:
    """Run every contender ``reps`` times, interleaved, the order rotating each repetition.

    Args:
        contenders: name -> zero-argument callable returning the measured value (e.g. MB/s).
        reps: repetitions of each contender.
        before: called untimed with the name before each run (e.g. wipe a cold cache).
        log: progress sink (one line per run).

    Returns:
        name -> the values in run order.
    """
    names = list(contenders)
    out: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            if before is not None:
                before(name)
            value = contenders[name]()
            out[name].append(value)
            if log is not None:
                shown = (", ".join(f"{k}={v:.3g}" for k, v in list(value.items())[:4] if isinstance(v, (int, float)))
                         if isinstance(value, dict) else f"{value:.4g}" if isinstance(value, float) else str(value))
                log(f"  rep {r} {name:<30} {shown}")
    return out


def timed_rate(nbytes_fn: Callable[[], int]) -> float:
    """Run ``nbytes_fn`` and return its throughput in MB/s (10^6 bytes per second)."""
    t0 = time.perf_counter()
    n = nbytes_fn()
    return n / (time.perf_counter() - t0) / MB


# ----------------------------------------------------------------------------- machine
def machine() -> dict[str, Any]:
    """What every figure is measured on: CPUs, memory, CPU model, kernel, Python, torch, load."""
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = "absent"
    return {
        "nproc": os.cpu_count(),
        "memory_GiB": round(mem_kb / 2**20, 1),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch_version,
        "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def machine_line(m: Mapping[str, Any]) -> str:
    """One line for a figure caption."""
    return (
        f"{m['nproc']} CPUs ({m['cpu'] or 'unknown model'}), {m['memory_GiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, torch {m['torch']}, load {m['loadavg']} at start, {m['date']}"
    )


# ----------------------------------------------------------------------------- references
def memcpy_reference(size_mb: int = 256, reps: int = 5) -> dict[str, Any]:
    """Memory copy bandwidth (numpy copy into a reused, pre-touched buffer), median of ``reps``."""
    import numpy as np

    src = np.frombuffer(os.urandom(size_mb * MB), dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = src  # touch: the first write into fresh memory is slow on these VMs
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        rates.append(size_mb / (time.perf_counter() - t0))
    return {"size_MB": size_mb, "reps": reps, "MBps": summary(rates)}


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _read_direct(path: str, block: int = 4 * MiB) -> int | None:
    """Read ``path`` with O_DIRECT into an aligned buffer; None where O_DIRECT is refused."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    n = 0
    try:
        while True:
            got = os.preadv(fd, [buf], n)
            if got <= 0:
                break
            n += got
    except OSError:
        return None
    finally:
        os.close(fd)
        buf.close()
    return n


def disk_reference(directory: str | os.PathLike[str], size_mb: int = 512, reps: int = 3) -> dict[str, Any]:
    """Local disk sequential write (fsync'd) and read (cold where possible, and warm), MB/s.

    Cold means the page cache was dropped (``/proc/sys/vm/drop_caches``, root only) or bypassed
    (``O_DIRECT``); the result says which, or ``"unavailable"`` when neither works here.
    """
    path = os.path.join(directory, f"disk-ref-{os.getpid()}.bin")
    block = os.urandom(4 * MiB)
    nblocks = max(1, size_mb * MB // len(block))
    total = nblocks * len(block)
    writes, cold, warm = [], [], []
    cold_how = "unavailable"
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            with open(path, "wb", buffering=0) as f:
                for _ in range(nblocks):
                    f.write(block)
                os.fsync(f.fileno())
            writes.append(total / (time.perf_counter() - t0) / MB)
            if _drop_caches():
                cold_how = "page cache dropped"
                t0 = time.perf_counter()
                with open(path, "rb", buffering=0) as f:
                    while f.read(4 * MiB):
                        pass
                cold.append(total / (time.perf_counter() - t0) / MB)
            else:
                t0 = time.perf_counter()
                n = _read_direct(path)
                if n == total:
                    cold_how = "O_DIRECT"
                    cold.append(total / (time.perf_counter() - t0) / MB)
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                while f.read(4 * MiB):
                    pass
            warm.append(total / (time.perf_counter() - t0) / MB)
    finally:
        with _suppress():
            os.unlink(path)
    return {
        "size_MB": round(total / MB),
        "reps": reps,
        "write_fsync_MBps": summary(writes),
        "read_cold_MBps": summary(cold),
        "read_cold_how": cold_how,
        "read_warm_MBps": summary(warm),
    }


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def boto3_ceiling(client: Any, bucket: str, keys: Sequence[str], *, concurrency: int = 16,
                  reps: int = 3) -> dict[str, Any]:
    """The store's raw ceiling: parallel whole-object GETs, and PUTs of the same bytes, with boto3.

    ``client`` should point at the same endpoint (proxy) the contenders use. PUTs go to a scratch
    prefix and are deleted afterwards.
    """

    def get(key: str) -> bytes:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()

    with ThreadPoolExecutor(concurrency) as pool:
        blobs = list(pool.map(get, keys))  # warm-up, and the bytes to PUT
        total = sum(len(b) for b in blobs)
        gets, puts = [], []
        for r in range(reps):
            t0 = time.perf_counter()
            n = sum(len(b) for b in pool.map(get, keys))
            gets.append(n / (time.perf_counter() - t0) / MB)
            scratch = f"ceiling-{r}"
            t0 = time.perf_counter()
            list(pool.map(lambda kb, prefix=scratch: client.put_object(Bucket=bucket, Key=f"{prefix}/{kb[0]}",
                                                                      Body=kb[1]),
                          zip(keys, blobs, strict=True)))
            puts.append(total / (time.perf_counter() - t0) / MB)
            list(pool.map(lambda k, prefix=scratch: client.delete_object(Bucket=bucket, Key=f"{prefix}/{k}"), keys))
    return {"objects": len(keys), "bytes": total, "concurrency": concurrency, "reps": reps, "get_MBps": summary(gets),
            "put_MBps": summary(puts)}


# ----------------------------------------------------------------------------- moto + proxies
def clean_aws_env() -> None:
    """Drop the host's ``AWS_*`` variables (this machine sets some): boto3/s3fs must see only ours."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]


class S3Servers:
    """moto + ``proxies`` FaultProxies (each with ``latency`` s first-byte delay) in a child process.

    Attributes (after :meth:`start`): ``moto`` (direct endpoint, for setup), ``proxies`` (one
    endpoint per simulated node), ``s3`` (an :class:`~streamio.testing.S3Endpoint` with a fresh
    bucket).

    Call order: ``start()`` -> ``set_latency()`` / ``clear()`` / ``log_summary()`` -> ``stop()``.
    """

    def __init__(self, *, proxies: int = 1, latency: float = 0.03) -> None:
        self.n_proxies = proxies
        self.latency = latency
        self.moto = ""
        self.proxies: list[str] = []
        self.s3: Any = None
        self._child: subprocess.Popen[str] | None = None

    def start(self) -> S3Servers:
        from streamio.testing import S3Endpoint

        clean_aws_env()
        self._child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.common", "--serve", "--proxies", str(self.n_proxies),
             "--latency", str(self.latency)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        )
        urls = json.loads(self._child.stdout.readline())  # type: ignore[union-attr]
        self.moto, self.proxies = urls["moto"], urls["proxies"]
        self.s3 = S3Endpoint(self.moto, "unused").new_bucket()
        return self

    def _ask(self, **cmd: Any) -> Any:
        assert self._child is not None and self._child.stdin is not None and self._child.stdout is not None
        self._child.stdin.write(json.dumps(cmd) + "\n")
        self._child.stdin.flush()
        return json.loads(self._child.stdout.readline())

    def set_latency(self, seconds: float) -> None:
        """First-byte latency of every proxy."""
        self._ask(op="latency", value=seconds)

    def clear(self) -> None:
        """Forget the proxies' request logs (latency stays)."""
        self._ask(op="clear")

    def log_summary(self) -> list[dict[str, Any]]:
        """Per proxy: GETs, response bytes, and GETs per object path, since the last :meth:`clear`."""
        return list(self._ask(op="log"))

    def stop(self) -> None:
        if self._child is None:
            return
        try:
            self._ask(op="stop")
        except (OSError, ValueError):
            pass
        self._child.wait(timeout=30)
        for pipe in (self._child.stdin, self._child.stdout):  # else a ResourceWarning when the Popen is collected
            if pipe is not None:
                pipe.close()
        self._child = None

    def __enter__(self) -> S3Servers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(n_proxies: int, latency: float) -> None:
    """Child mode of :class:`S3Servers`."""
    import logging

    from streamio.testing import FaultProxy, MotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = MotoServer()
    endpoint = server.start()
    proxies = [FaultProxy(endpoint).start() for _ in range(n_proxies)]

    def settle() -> None:
        for p in proxies:
            p.set_latency(latency)

    settle()
    print(json.dumps({"moto": endpoint, "proxies": [p.endpoint_url for p in proxies]}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "latency":
            latency = float(cmd["value"])
            settle()
            reply: Any = True
        elif op == "clear":
            for p in proxies:
                p.clear()
            settle()
            reply = True
        elif op == "log":
            reply = []
            for p in proxies:
                gets = [r for r in p.log() if r.method == "GET"]
                reply.append({
                    "requests": len(p.log()),
                    "gets": len(gets),
                    "bytes": sum(r.response_bytes for r in gets),
                    "gets_per_path": dict(Counter(r.path for r in gets)),
                })
        else:
            print(json.dumps(True), flush=True)
            break
        print(json.dumps(reply), flush=True)
    for p in proxies:
        p.stop()
    server.stop()


# ----------------------------------------------------------------------------- nginx
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx:
    """Debian's nginx serving ``root`` on ``127.0.0.1:<free port>`` (sendfile, no access log).

    :meth:`start` installs nginx with ``apt-get update`` + ``apt-get install nginx-light`` when it
    is missing and we are root; it returns False and sets :attr:`why` when nginx cannot run.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self.url = ""
        self.why = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = ""

    @staticmethod
    def binary() -> str | None:
        return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)

    def _install(self) -> bool:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            self.why = "nginx is not installed and apt-get is not available as root here"
            return False
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nginx-light"]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0 and cmd[1] == "install":
                proc = subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], env=env, capture_output=True,
                                      text=True, timeout=600)
            if proc.returncode != 0:
                self.why = f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-300:]}"
                return False
        return True

    def start(self) -> bool:
        """Start serving; False (and :attr:`why`) if nginx cannot be installed or started."""
        if self.binary() is None and not self._install():
            return False
        binary = self.binary()
        if binary is None:
            self.why = "nginx was installed but no nginx binary was found"
            return False
        self._dir = tempfile.mkdtemp(prefix="bench-nginx-")
        port = free_port()
        conf = os.path.join(self._dir, "nginx.conf")
        Path(conf).write_text(
            ("user root;\n" if os.geteuid() == 0 else "")  # the served tree may be private (mkdtemp)
            + f"daemon off;\nworker_processes 2;\npid {self._dir}/nginx.pid;\nerror_log {self._dir}/error.log;\n"
            "events { worker_connections 256; }\n"
            "http {\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 10000;\n"
            f"  client_body_temp_path {self._dir};\n  proxy_temp_path {self._dir};\n  fastcgi_temp_path {self._dir};\n"
            f"  uwsgi_temp_path {self._dir};\n  scgi_temp_path {self._dir};\n"
            "  types { application/x-tar tar; application/json json; }\n"
            f"  server {{ listen 127.0.0.1:{port}; root {self.root}; }}\n}}\n"
        )
        self._proc = subprocess.Popen([binary, "-c", conf, "-p", self._dir], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE)
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    self.url = f"http://127.0.0.1:{port}"
                    return True
            except OSError:
                if self._proc.poll() is not None:
                    self.why = f"nginx exited: {self._proc.stderr.read().decode()[-300:]}"  # type: ignore[union-attr]
                    return False
                time.sleep(0.05)
        self.why = "nginx did not start listening within 5 s"
        self.stop()
        return False

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""


def http_parallel_ceiling(urls: Iterable[str], *, concurrency: int = 8) -> int:
    """GET every URL with plain ``http.client`` on ``concurrency`` threads; bytes read (the HTTP ceiling)."""
    import http.client
    import urllib.parse

    def get(url: str) -> int:
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        try:
            conn.request("GET", u.path)
            resp = conn.getresponse()
            n = 0
            while chunk := resp.read(4 * MiB):
                n += len(chunk)
            return n
        finally:
            conn.close()

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(get, list(urls)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--proxies", type=int, default=1)
    ap.add_argument("--latency", type=float, default=0.03)
    args = ap.parse_args()
    if args.serve:
        _serve(args.proxies, args.latency)


if __name__ == "__main__":
    main()
