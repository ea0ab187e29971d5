"""The README quick start's wait for the local S3 server (issue 34): it spun for ever when the server
failed to start (an invalid bucket name). It runs here as the README has it, in bash, with real
processes; the server checks bucket names against S3's rules and names the bucket and the rule."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamio.testing.serve import main, s3_bucket_rule_broken

README = Path(__file__).resolve().parents[2] / "README.md"


def _step_1() -> str:
    """Step 1 of the README's quick start: start the server, wait for s3.env, source it."""
    block = README.read_text().split("<!-- --8<-- [start:quickstart] -->", 1)[1]
    lines = block.split("# 1.", 1)[1].split("# 2.", 1)[0].splitlines()[1:]
    script = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "--bucket demo" in script and "until " in script, script
    return script


def _run(script: str, cwd: Path, timeout: float = 60) -> tuple[str, str]:
    """``script`` in bash (its own process group, killed whole if it outlives ``timeout``): stdout, stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still waiting after {timeout} s: {out!r} {err!r}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("bucket", "rule"), [
    ("ab", "is 3 to 63 characters long, not 2"),  # moto refuses it too: the wait once spun for ever
    ("My_Bucket", "has only lower-case letters, digits, '.' and '-', not 'BM_'"),  # moto once made it
])
def test_the_readme_wait_ends_when_the_server_fails_on_an_invalid_bucket(
    tmp_path: Path, bucket: str, rule: str,
) -> None:
    script = _step_1().replace("--bucket demo", f"--bucket {bucket}")
    out, err = _run(script + "\necho sourced: $?; wait $SERVER; echo server: $?", tmp_path, timeout=30)
    assert "sourced: 1" in out and "server: 1" in out, (out, err)
    assert f"Error: refused bucket {bucket!r}: an S3 bucket name {rule}; pick another --bucket" in err
    assert not (tmp_path / "s3.env").exists()


@pytest.mark.timeout(120)
def test_the_readme_wait_sources_the_env_of_a_server_that_started(tmp_path: Path) -> None:
    out, err = _run(_step_1() + '\necho "endpoint=$AWS_ENDPOINT_URL_S3"; kill $SERVER; wait $SERVER; echo server: $?',
                    tmp_path)
    assert re.search(r"endpoint=http://127\.0\.0\.1:\d+", out), (out, err)
    assert "server: 0" in out and not (tmp_path / "s3.env").exists()  # stopped by SIGTERM, file removed


@pytest.mark.parametrize(("name", "rule"), [
    ("Demo", "has only lower-case letters, digits, '.' and '-', not 'D'"),
    ("my_bucket", "has only lower-case letters, digits, '.' and '-', not '_'"),
    ("ab", "is 3 to 63 characters long, not 2"),
    ("a" * 64, "is 3 to 63 characters long, not 64"),
    ("x" * 1_000_000, "is 3 to 63 characters long, not 1000000"),
    ("", "is 3 to 63 characters long, not 0"),
    ("-demo", "begins and ends with a letter or digit"),
    ("demo.", "begins and ends with a letter or digit"),
    ("my..bucket", "never has two periods in a row"),
    ("192.168.5.4", "is never an IP address"),
    ("xn--demo", "never begins with xn--, sthree-, amzn-s3-demo-"),
    ("demo-s3alias", "never ends with -s3alias, --ol-s3, .mrap, --x-s3, --table-s3"),
    ("démo", "has only lower-case letters, digits, '.' and '-', not 'é'"),
])
def test_a_name_s3_refuses_names_the_rule(name: str, rule: str) -> None:
    assert s3_bucket_rule_broken(name) == f"an S3 bucket name {rule}"


@pytest.mark.parametrize("name", ["demo", "my-bucket", "my.bucket.name", "1.2.3", "a1b", "x" * 63])
def test_a_valid_name_passes(name: str) -> None:
    assert s3_bucket_rule_broken(name) is None


def test_an_invalid_bucket_exits_1_before_a_server_starts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    env_file = tmp_path / "s3.env"
    assert main(["s3", "--bucket", "demo", "--bucket", "Demo", "--env-file", str(env_file)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Error: refused bucket 'Demo': an S3 bucket name has only lower-case" in err
    assert "serving" not in err and not env_file.exists()
