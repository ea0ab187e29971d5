"""The CLI's contract (issue 12): one ``Error:`` line, never a traceback without ``-vv``, and the
documented exit status: 0 ok, 1 the data / checkpoint is bad, 2 usage, 3 could not check.

Most cases go through click's CliRunner (in process: every subprocess pays the import of torch);
a few run the real entry point in a subprocess with a timeout, to see exactly what a user or a
script sees on stderr (no traceback printed by the interpreter, signals, a closed pipe).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from streamio.checkpoint.format import layout
from streamio.checkpoint.format import pointer as ptr
from streamio.cli.exits import EXIT_CODES, ExitCode, classify, one_line
from streamio.cli.main import cli
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import (
    BucketNotFoundError,
    CacheError,
    CacheTooSmallError,
    CheckpointConflictError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptDataError,
    DatasetError,
    IndexFormatError,
    IndexNotFoundError,
    ObjectNotFoundError,
    PlanError,
    ShardFormatError,
    SourceError,
    StateMismatchError,
    StorageError,
    StoragePermissionError,
    StorageUnreachableError,
    TransientStorageError,
    UnsupportedProtocolError,
    WriteConflictError,
)
from streamio.testing import FaultProxy, S3Endpoint

README = Path(__file__).resolve().parents[2] / "README.md"
DEEP = 100_000  # nesting levels: far past CPython's recursion limit


def streamio(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed entry point as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "streamio.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in process, as a CompletedProcess; an exception escaping click fails the test."""
    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exc_info
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def assert_one_line(res: subprocess.CompletedProcess[str], code: int, *names: str) -> str:
    """The exit status is ``code``, stderr ends in one ``Error:`` line naming ``names``, no traceback."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.stderr
    assert res.stderr.rstrip("\n").splitlines()[-1] == errors[0]
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contract") / "ds"
    write_dataset(
        ({"__key__": f"{i:03d}", "txt": f"sample {i}"} for i in range(6)), str(root), spec=ShardSpec(max_count=3),
    )
    return root


# ----------------------------------------------------------------------------- the mapping
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (CorruptDataError("x"), ExitCode.BAD),
        (DatasetError("x"), ExitCode.BAD),
        (IndexFormatError("x"), ExitCode.BAD),
        (ShardFormatError("x"), ExitCode.BAD),
        (CheckpointError("x"), ExitCode.BAD),
        (CheckpointFormatError("x"), ExitCode.BAD),
        (StateMismatchError("x"), ExitCode.BAD),
        (PlanError("x"), ExitCode.USAGE),
        (SourceError("x"), ExitCode.USAGE),
        (IndexNotFoundError("x"), ExitCode.UNCHECKED),
        (CheckpointNotFoundError("x"), ExitCode.UNCHECKED),
        (CheckpointConflictError("x"), ExitCode.UNCHECKED),
        (StorageError("x"), ExitCode.UNCHECKED),
        (ObjectNotFoundError("x"), ExitCode.UNCHECKED),
        (BucketNotFoundError("x"), ExitCode.UNCHECKED),
        (StoragePermissionError("x"), ExitCode.UNCHECKED),
        (TransientStorageError("x"), ExitCode.UNCHECKED),
        (StorageUnreachableError("x"), ExitCode.UNCHECKED),
        (UnsupportedProtocolError("x"), ExitCode.USAGE),
        (ConfigError("x"), ExitCode.USAGE),
        (WriteConflictError("x"), ExitCode.UNCHECKED),
        (CacheError("x"), ExitCode.UNCHECKED),
        (CacheTooSmallError("x"), ExitCode.UNCHECKED),
        (PermissionError(13, "denied"), ExitCode.UNCHECKED),
        (RecursionError("deep"), ExitCode.UNCHECKED),
        (RuntimeError("bug"), ExitCode.UNCHECKED),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(int(v)),
)
def test_exit_status_follows_the_error_tree(exc: BaseException, code: ExitCode) -> None:
    assert classify(exc) == code


def test_help_and_readme_document_the_codes_the_code_uses() -> None:
    res = run("--help")
    assert res.returncode == 0
    help_text = " ".join(res.stdout.split())
    table = re.search(r"Exit status: (.*)$", help_text)
    assert table, res.stdout
    for code, text in EXIT_CODES.items():
        assert f"{int(code)} {' '.join(text.split())}" in table.group(1)
    assert set(EXIT_CODES) == set(ExitCode)
    section = README.read_text(encoding="utf-8").split("### Exit codes", 1)[1].split("\n## ", 1)[0]
    readme_codes = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert readme_codes == {int(c) for c in ExitCode}
    for verb in (["verify"], ["ckpt", "verify"], ["plan"]):  # the verbs whose status is a verdict
        out = " ".join(run(*verb, "--help").stdout.split())
        assert "Exit status: 0 success" in out and "3 could not check" in out, verb
    for verb in (["shard"], ["index"], ["ls"], ["inspect"], ["ckpt", "ls"], ["ckpt", "inspect"], ["ckpt", "gc"]):
        out = " ".join(run(*verb, "--help").stdout.split())
        assert "Exit status: 0 ok, 1 the data is bad, 2 usage, 3 could not check" in out, verb


# ----------------------------------------------------------------------------- usage: 2
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["shard", "{src}", "{out}", "--max-size", "0"], ["--max-size", "'0'"]),
        (["shard", "{src}", "{out}", "--max-size", "0.1"], ["--max-size"]),
        (["shard", "{src}", "{out}", "--max-count", "-1"], ["--max-count"]),
        (["shard", "{src}", "{out}", "--seed", "-5"], ["--seed"]),
        (["shard", "{src}", "{out}", "--prefix", "../x"], ["--prefix", "'..'"]),
        (["shard", "{src}/missing.jsonl", "{out}"], ["missing.jsonl"]),
        (["shard", "{src}", "{ds}"], ["index.json", "--overwrite"]),
        (["verify", "{ds}", "--concurrency", "0"], ["--concurrency"]),
        (["ls", "{ds}", "-o", "endpoint_url"], ["'endpoint_url'", "KEY=VALUE"]),
        (["ls", "{ds}", "-o", "a=1", "-o", "a.b=2"], ["'a.b=2'"]),
        (["plan", "{ds}", "-R", "0"], ["--world-size"]),
        (["plan", "{ds}", "-R", "200", "--policy", "drop"], ["world_size=200", "policy='pad'"]),
        # every numeric option is bounded (issue 23): a huge value names the option, never overflows (was exit 3)
        (["plan", "{ds}", "-R", "2", "-B", str(10**21)], ["--batch-size"]),
        (["plan", "{ds}", "-R", "2", "-W", str(10**21)], ["--workers"]),
        (["plan", "{ds}", "-R", str(10**9)], ["--world-size"]),
        (["plan", "{ds}", "-R", "2", "--seed", str(2**64)], ["--seed"]),
        (["plan", "{ds}", "-R", "2", "--epoch", str(2**64)], ["--epoch"]),
        (["plan", "{ds}", "-R", "2", "--runs", str(10**21)], ["--runs"]),
        (["plan", "{ds}", "-R", "2", "--window", str(10**21)], ["--window"]),
        (["plan", "{ds}", "-R", "2", "--interleave", "5000"], ["--interleave"]),
        # ... and claimed sizes are checked against the dataset (6 samples) before planning
        (["plan", "{ds}", "-R", "5000"], ["--world-size 5,000", "at most 4,096 readers"]),
        (["plan", "{ds}", "-R", "64", "-W", "100"], ["--workers 100", "6,400 readers"]),
        (["plan", "{ds}:1", "-R", "2", "--epoch-samples", "601"], ["--epoch-samples", "at most 600"]),
        (["shard", "{src}", "{out}", "--max-size", "6TiB"], ["--max-size", "5 TiB"]),
        (["shard", "{src}", "{out}", "--max-count", str(10**21)], ["--max-count"]),
        (["shard", "{src}", "{out}", "--seed", str(2**64)], ["--seed"]),
        (["verify", "{ds}", "--concurrency", "100000"], ["--concurrency"]),
        (["index", "{ds}", "--concurrency", "100000"], ["--concurrency"]),
        (["ckpt", "gc", "{ds}", "--min-age", "-1"], ["--min-age"]),
    ],
)
def test_bad_option_values_are_usage_errors(tmp_path: Path, dataset: Path, args: list[str], names: list[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("x")
    res = run(*(a.format(src=src, out=tmp_path / "out", ds=dataset) for a in args))
    assert_one_line(res, 2, *names)
    assert not (tmp_path / "out").exists()


def test_unknown_protocol_is_a_usage_error_in_one_line_and_traceback_only_with_vv() -> None:
    quiet = streamio("inspect", "foo://bucket/x")
    assert_one_line(quiet, 2, "foo://bucket/x")
    loud = streamio("-vv", "inspect", "foo://bucket/x")
    assert loud.returncode == 2
    assert "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.rstrip("\n").splitlines()[-1] == quiet.stderr.rstrip("\n")


def test_a_bad_option_value_from_the_entry_point(tmp_path: Path) -> None:
    assert_one_line(streamio("shard", str(tmp_path), str(tmp_path / "out"), "--max-size", "0"), 2, "--max-size")


def test_missing_dataset_is_could_not_check(tmp_path: Path) -> None:
    for verb in ("verify", "inspect", "ls"):
        assert_one_line(run(verb, str(tmp_path / "nothing")), 3, f"{tmp_path}/nothing/index.json")
    assert_one_line(run("plan", str(tmp_path / "nothing"), "-R", "2"), 3, f"{tmp_path}/nothing/index.json")


def test_verify_against_an_unreachable_endpoint_is_3_not_1() -> None:
    res = run(
        "verify", "s3://bucket/ds", "-o", "endpoint_url=http://127.0.0.1:9", "-o", "anon=true",
        "-o", "key=AKIDSECRETLEAK",
    )
    assert_one_line(res, 3, "127.0.0.1:9")
    assert "AKIDSECRETLEAK" not in res.stderr


def test_verify_that_cannot_read_a_shard_is_3_not_a_bad_shard(s3: S3Endpoint) -> None:
    url = s3.url("ds")
    write_dataset(
        ({"__key__": f"{i}", "txt": f"s{i}"} for i in range(6)), url, s3.storage_options(), spec=ShardSpec(max_count=3),
    )
    with FaultProxy(s3.endpoint_url) as proxy:
        args = ["verify", url]
        for k, v in s3.storage_options(proxy.endpoint_url).items():
            args += ["-o", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
        ok = CliRunner().invoke(cli, args)
        assert ok.exit_code == 0, ok.output
        proxy.fail_next(1000, 403, "AccessDenied", method="GET", path_contains="data-000001")
        res = CliRunner().invoke(cli, args)
    assert res.exit_code == 3, res.output
    assert "shards are bad" not in res.output
    assert res.stderr.startswith("Error: ") and "data-000001.tar" in res.stderr and len(res.stderr.splitlines()) == 1


def test_ckpt_verbs_on_a_root_without_a_checkpoint_are_3(tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    assert_one_line(run("ckpt", "verify", root), 3, f"no checkpoint under {root}")
    assert_one_line(run("ckpt", "verify", root, "7"), 3, layout.manifest_path(7), "ckpt ls")
    assert_one_line(run("ckpt", "inspect", root), 3, f"no checkpoint under {root}")
    assert_one_line(run("ckpt", "inspect", root, "7"), 3, layout.manifest_path(7))


# ----------------------------------------------------------------------------- the data is bad: 1
def test_verify_of_a_corrupt_shard_is_1(tmp_path: Path, dataset: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in dataset.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    raw = bytearray((bad / "data-000001.tar").read_bytes())
    raw[raw.index(b"sample 4")] ^= 0xFF
    (bad / "data-000001.tar").write_bytes(bytes(raw))
    res = run("verify", str(bad))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "1 of 2 shards is bad" in res.stderr and "data-000001.tar" in res.stderr


def test_deeply_nested_index_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text("[" * DEEP + "]" * DEEP)
    assert_one_line(streamio("inspect", str(tmp_path)), 1, f"{tmp_path}/index.json")  # as users run it
    assert_one_line(run("verify", str(tmp_path)), 1, f"{tmp_path}/index.json")


def test_deeply_nested_manifest_and_pointer_are_bad_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / layout.step_dir(3)).mkdir(parents=True)
    (root / layout.manifest_path(3)).write_text("[" * DEEP + "]" * DEEP)
    assert_one_line(streamio("ckpt", "inspect", str(root), "3"), 1, layout.manifest_path(3))  # as users run it
    res = run("ckpt", "verify", str(root), "3")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"BAD {root}/{layout.manifest_path(3)}" in res.stderr
    (root / ptr.LATEST).write_text("{" * DEEP)
    res = run("ckpt", "verify", str(root))
    assert res.returncode == 1 and "Traceback" not in res.stderr and f"BAD {root}/{ptr.LATEST}" in res.stderr


def test_corrupt_pointer_without_steps_is_bad_not_missing(tmp_path: Path) -> None:
    (tmp_path / ptr.LATEST).write_text('{"format": "streamio.checkpoint.latest/1", "step": ')
    res = run("ckpt", "verify", str(tmp_path))
    assert res.returncode == 1 and "Traceback" not in res.stderr and f"BAD {tmp_path}/{ptr.LATEST}" in res.stderr


# ----------------------------------------------------------------------------- tracebacks, bugs, signals
def test_an_unexpected_exception_is_one_line_exit_3(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("something inside a dependency\nbroke on two lines")

    monkeypatch.setattr("streamio.data.locate.read_index_bytes", broken)
    res = CliRunner().invoke(cli, ["inspect", str(dataset)])
    assert res.exit_code == 3 and res.stdout == ""
    assert res.stderr == (
        "Error: unexpected RuntimeError: something inside a dependency broke on two lines "
        "(a bug in streamio or a dependency: run `streamio -vv ...` for the traceback and report it)\n"
    )
    res = CliRunner().invoke(cli, ["-vv", "inspect", str(dataset)])
    assert res.exit_code == 3 and "Traceback (most recent call last)" in res.stderr and "in broken" in res.stderr


def test_ctrl_c_is_130_without_a_traceback(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("streamio.data.write.verify.validate", interrupted)
    res = CliRunner().invoke(cli, ["verify", str(dataset)])
    assert res.exit_code == 130 and res.stderr == "Aborted: interrupted.\n"


@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted."), (signal.SIGTERM, 143, "(SIGTERM).")]
)
def test_sigint_and_sigterm_during_retries_stop_cleanly(sig: signal.Signals, code: int, said: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamio.cli.main", "-v", "verify", "s3://bucket/ds",
         "-o", "endpoint_url=http://127.0.0.1:9", "-o", "anon=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    try:
        proc.stderr.readline()  # -v logs each retry: the first line means the retry loop is running
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code and "Traceback" not in err and err.rstrip().endswith(said), err


def test_closed_stdout_is_141_and_silent(dataset: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamio.cli.main", "ls", str(dataset)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written (like `| head -0`)
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == b""


@pytest.mark.parametrize(
    "verb",
    [["ls", "{ds}"], ["ls", "{ds}", "--json"], ["inspect", "{ds}", "--json"], ["verify", "{ds}", "--json"],
     ["plan", "{ds}", "-R", "2", "--json"], ["index", "{ds}/data-*.tar", "--index-url", "{tmp}/i.json", "--json"],
     ["shard", "{src}", "{tmp}/out", "--json"]],
    ids=lambda v: " ".join(a for a in v if "{" not in a),
)
def test_no_stdout_at_all_is_141_not_0(dataset: Path, tmp_path: Path, verb: list[str]) -> None:
    """``streamio VERB --json >&-``: the document cannot be written, so the verb must not report success (issue 23)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x")
    args = [a.format(ds=dataset, tmp=tmp_path, src=tmp_path / "src") for a in verb]
    res = subprocess.run(
        ["sh", "-c", 'exec "$0" -m streamio.cli.main "$@" >&-', sys.executable, *args],
        capture_output=False, stderr=subprocess.PIPE, text=True, timeout=60,
    )
    assert res.returncode == 141 and res.stderr == "", (res.returncode, res.stderr)


def test_one_line_strips_userinfo_and_newlines() -> None:
    line = one_line(ValueError("GET https://alice:s3cr3t@host/b/k failed:\n  503"))
    assert "s3cr3t" not in line and "alice" not in line and "https://***@host/b/k failed: 503" in line
    assert "\n" not in one_line(CorruptDataError("a\nb")) and one_line(CorruptDataError("")) == "CorruptDataError"
