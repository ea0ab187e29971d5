"""Scrubbing text is linear on any input, and no credential reaches a log, whatever its source.

Two failures of the hostile probe on 2038801: the URL-userinfo regex backtracked quadratically on
long runs of letters (a server's 1 MiB error body took minutes to scrub, 8 MiB never ended), and
with credentials from the environment ``streamio -vv`` printed botocore's request dump with
``X-Amz-Security-Token`` (keys given as options were scrubbed; the environment's were unknown).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.storage import Store
from streamio.storage.secrets import environment_secrets, has_userinfo, redact_credentials, scrub, strip_userinfo
from streamio.testing import S3Endpoint

SESSION_TOKEN = "env-session-token-Q7w2e9"  # noqa: S105 - test credentials
SECRET_KEY = "env-secret-key-Lp03xZ"  # noqa: S105


def _reference_strip(text: str) -> str:
    """What strip_userinfo means, written the slow, obvious way (quadratic: small inputs only)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("://", i):
            j = i + 3
            while j < len(text) and text[j] not in "/@'\"<>" and not text[j].isspace():
                j += 1
            if j < len(text) and text[j] == "@":
                out.append("://***@")
                i = j + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


@given(st.text(alphabet=st.sampled_from(list("ab:/@ \"'<>x1.-\n")), max_size=80))
def test_strip_userinfo_is_the_reference(text: str) -> None:
    assert strip_userinfo(text) == _reference_strip(text)
    assert strip_userinfo(strip_userinfo(text)) == strip_userinfo(text)


_USERINFO_CHARS = st.characters(blacklist_characters="/@'\"<>", blacklist_categories=("Zs", "Zl", "Zp", "Cc"))


@given(st.text(alphabet=_USERINFO_CHARS, min_size=1), st.sampled_from(["s3", "https", "gs", "x+y.z-1"]))
def test_every_userinfo_is_masked(password: str, scheme: str) -> None:
    text = f"failed: GET {scheme}://user:{password}@host/key (retrying)"
    assert has_userinfo(text)
    assert strip_userinfo(text) == f"failed: GET {scheme}://***@host/key (retrying)"


@pytest.mark.parametrize(
    "text",
    [
        "a" * (8 << 20),  # the probe's input: minutes per MiB before
        "a://" * (2 << 20),
        "://@" * (2 << 20),
        "a://" + "b" * (8 << 20),
        ("authorization:" + "c" * 64) * (1 << 17),
        "x-amz-security-token: '" * (1 << 18),
    ],
    ids=["letters", "schemes", "empty-userinfo", "long-userinfo", "headers", "open-quotes"],
)
def test_scrubbing_is_linear(text: str) -> None:
    began = time.perf_counter()
    scrub(text)
    has_userinfo(text)
    redact_credentials(text)
    assert time.perf_counter() - began < 5.0  # ~0.1-1.5 s here for 6-8 MiB; quadratic would be hours


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("{'X-Amz-Date': b'20261201T232616Z', 'X-Amz-Security-Token': b'TOK123456', 'Host': b'h'}", "TOK123456"),
        ("host:127.0.0.1\nx-amz-security-token:TOK123456\nx-amz-date:20261201", "TOK123456"),
        ("'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAKEY12345/20261201/us-east-1/s3/aws4_request, "
         "SignedHeaders=host'", "AKIAKEY12345"),
        ("<AssumeRoleResult><Credentials><SecretAccessKey>sec/ret+KEY=</SecretAccessKey>"
         "<SessionToken>TOK123456</SessionToken></Credentials>", "sec/ret+KEY="),
        ('{"access_token": "ya29.TOK123456", "expires_in": 3599, "refresh_token": "1//RT123456"}', "ya29.TOK123456"),
        ("GET /b/k?X-Amz-Credential=AKIAKEY12345%2F2026&X-Amz-Security-Token=TOK123456 HTTP/1.1", "TOK123456"),
        ("Authorization: Bearer ya29.TOK123456\r\nHost: storage.googleapis.com", "ya29.TOK123456"),
        ("('Authorization', 'Bearer ya29.TOK123456')", "ya29.TOK123456"),
    ],
    ids=["header-dict", "canonical-request", "sigv4", "sts-xml", "oauth-json", "presigned", "bearer", "tuple"],
)
def test_credentials_are_redacted_by_the_names_they_travel_under(text: str, secret: str) -> None:
    clean = redact_credentials(text)
    assert secret not in clean and "***" in clean
    assert scrub(text) == clean or secret not in scrub(text)


def test_environment_credentials_are_known_to_scrub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh12345")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a name with TOKEN in it, not a secret: too short
    assert {SESSION_TOKEN, "hf_abcdefgh12345"} <= set(environment_secrets())
    assert "false" not in environment_secrets()
    assert scrub(f"signed with {SESSION_TOKEN} and hf_abcdefgh12345") == "signed with *** and ***"


@pytest.mark.slow
def test_debug_logs_of_the_cli_never_show_environment_credentials(s3: S3Endpoint, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``streamio -vv`` with credentials from the environment: botocore dumps every request's
    headers (session token, key id) at DEBUG; none of it may reach stderr."""
    Store(s3.url("ds"), s3.storage_options()).put("index.json", b"{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env.update(
        AWS_ENDPOINT_URL=s3.endpoint_url, AWS_ACCESS_KEY_ID=s3.key, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_SESSION_TOKEN=SESSION_TOKEN, AWS_DEFAULT_REGION=s3.region,
    )
    out = subprocess.run(
        [sys.executable, "-m", "streamio.cli.main", "-vv", "ls", s3.url("ds")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    logs = out.stdout + out.stderr
    assert "Security-Token" in logs or "security-token" in logs, logs[-2000:]  # the dump is there...
    for secret in (SESSION_TOKEN, SECRET_KEY, s3.key):
        assert secret not in logs  # ...without the credentials
