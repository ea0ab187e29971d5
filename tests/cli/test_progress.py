"""The progress display of the long verbs (cli/progress.py): plain lines on a fake clock, the bar on a
terminal, and what the verbs print with stderr not a terminal."""

from __future__ import annotations

import fcntl
import io
import json
import os
import select
import struct
import termios
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from streamio.cli import progress as progress_mod
from streamio.cli.main import cli
from streamio.cli.progress import Progress, human_bytes, plural
from streamio.data.write.writer import ShardSpec, write_dataset


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_every_interval_with_total_rate_and_eta() -> None:
    clock, out = Clock(), io.StringIO()
    p = Progress("index", unit="shard", stream=out, clock=clock, interval=5.0, tty=False)
    p.report(0, 100, 0)
    clock.now += 0.5
    p.report(1, 100, 10_000_000)
    assert out.getvalue() == ""  # nothing before the first interval
    clock.now += 4.5  # 5 s in: 25 shards, 250 MB -> 5 shards/s, 50 MB/s, 75 shards left = 15 s
    p.report(25, 100, 250_000_000)
    assert out.getvalue() == "index: 25/100 shards (25%), 250.0 MB, 50.0 MB/s, elapsed 0:00:05, ETA 0:00:15\n"
    clock.now += 1.0
    p.report(30, 100, 300_000_000)
    assert out.getvalue().count("\n") == 1  # the next line waits for the interval
    clock.now += 4.0
    p.report(100, 100, 1_000_000_000)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[1] == "index: 100/100 shards (100%), 1.0 GB, 100.0 MB/s, elapsed 0:00:10"  # done: no ETA
    assert lines[2] == lines[1] and len(lines) == 3  # the closing line
    p.close()
    assert len(out.getvalue().splitlines()) == 3  # closing twice prints nothing more


def test_no_rate_before_a_second_and_a_short_run_is_silent() -> None:
    clock, out = Clock(), io.StringIO()
    p = Progress("shard", stream=out, clock=clock, interval=0.0, tty=False)
    clock.now += 0.2
    p.update(1, 0)
    assert out.getvalue() == "shard: 1 sample, elapsed 0:00:00\n"  # no 0.0 MB/s, no total, singular
    clock.now += 0.3
    p.update(2, 4096)
    assert "MB/s" not in out.getvalue() and "B/s" not in out.getvalue() and "ETA" not in out.getvalue()
    quiet = io.StringIO()
    with Progress("shard", stream=quiet, clock=clock, interval=5.0, tty=False) as q:
        q.update(1, 10)
    assert quiet.getvalue() == ""  # under the interval: nothing at all, not even at close


def test_a_total_set_later_and_reports_from_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    clock, out = Clock(), io.StringIO()
    p = Progress("verify", unit="shard", stream=out, clock=clock, interval=1e9, tty=False)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: p.update(1, 2), range(1000)))
    assert (p.done, p.nbytes, p.total) == (1000, 2000, None)
    p.report(1000, 4000, 2000)
    clock.now += 10
    assert p.line() == "verify: 1,000/4,000 shards (25%), 2.0 KB, 200 B/s, elapsed 0:00:10, ETA 0:00:30"


def test_the_bar_on_a_terminal_shows_total_and_rate_after_a_second() -> None:
    clock, out = Clock(), io.StringIO()
    p = Progress("index", unit="shard", stream=out, clock=clock, tty=True)
    p.report(0, 4, 0)
    p.report(1, 4, 1_000_000)
    assert "0/4" in out.getvalue() and not p._bar.postfix  # the total at once; no MB/s before a second
    clock.now += 2
    p.report(2, 4, 4_000_000)
    p.close()
    assert "2/4" in out.getvalue() and "2.0 MB/s" in out.getvalue()


@pytest.mark.parametrize("size", [(30, 100), (0, 0)], ids=["sized", "no-size"])
def test_the_bar_on_a_real_pseudo_terminal(size: tuple[int, int]) -> None:
    """On a pty of 100 columns the bar follows its width; on one that reports 0 x 0 (a bare `docker -t`) it
    still shows (tqdm would draw a 0 x 0 bar, i.e. nothing)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    with os.fdopen(slave, "w", encoding="utf-8") as tty:
        p = Progress("index", unit="shard", stream=tty)
        p.report(0, 4, 0)
        p.report(3, 4, 0)
        p.close()
    # the kernel moves pty output to the master side asynchronously: read until it is all there
    out, deadline = "", time.monotonic() + 10
    while "3/4" not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                out += os.read(master, 1 << 16).decode()
            except OSError:  # EIO: the slave side is closed and everything was read
                break
    os.close(master)
    assert "3/4" in out and "index:" in out


def test_disabled_shows_nothing() -> None:
    out = io.StringIO()
    with Progress("x", stream=out, tty=True, enabled=False) as p:
        p.update(5, 5)
    assert out.getvalue() == ""


def test_plural_and_bytes() -> None:
    assert plural(1, "shard") == "1 shard" and plural(0, "shard") == "0 shards"
    assert plural(1234, "file") == "1,234 files"
    assert plural(2, "save", "saves") == "2 saves"
    assert human_bytes(999) == "999 B" and human_bytes(1500) == "1.5 KB" and human_bytes(2.5e12) == "2.5 TB"


def test_long_verbs_print_plain_progress_lines_when_stderr_is_not_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_mod, "INTERVAL_S", 0.0)  # a line at every step
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    res = CliRunner().invoke(cli, ["shard", str(src), str(tmp_path / "ds"), "--max-count", "2"])
    assert res.exit_code == 0, res.output
    assert "shard: 1/5 samples (20%)" in res.stderr and "shard: 5/5 samples (100%)" in res.stderr
    res = CliRunner().invoke(cli, ["verify", str(tmp_path / "ds")])
    assert res.exit_code == 0, res.output
    assert "verify: 0/3 shards (0%)" in res.stderr and "verify: 3/3 shards (100%)" in res.stderr
    samples = ({"__key__": f"{i}", "txt": "x"} for i in range(4))
    write_dataset(samples, str(tmp_path / "two"), spec=ShardSpec(max_count=2))
    res = CliRunner().invoke(cli, ["index", str(tmp_path / "two" / "data-{000000..000001}.tar"), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert "index: 2/2 shards (100%)" in res.stderr and "MB/s" not in res.stderr  # instant: no rate shown
