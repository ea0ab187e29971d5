"""A moto S3 server that checks credentials, for access-denied and "do workers authenticate" tests.

moto's authentication switch (``INITIAL_NO_AUTH_ACTION_COUNT``) is process-wide, so this server
runs in its own process and the session's moto server stays open. The first
:data:`SETUP_ACTIONS` requests go unchecked: they create the bucket and two IAM users, one
allowed ``s3:*`` and one with no policy (every S3 call -> 403 AccessDenied). Never send it an
unsigned request (``anon=True``): moto answers those with a 500 when auth is on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

SETUP_ACTIONS = 6
REGION = "us-east-1"


@dataclass(frozen=True)
class AuthS3:
    """Where the checking server listens, its bucket, and the two users' credentials."""

    endpoint_url: str
    bucket: str
    allowed: tuple[str, str] = field(repr=False)
    denied: tuple[str, str] = field(repr=False)

    def url(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    def options(self, key: str, secret: str) -> dict[str, Any]:
        return {
            "key": key, "secret": secret, "endpoint_url": self.endpoint_url, "client_kwargs": {"region_name": REGION},
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def auth_moto() -> Iterator[AuthS3]:
    """Start the checking server, set it up, yield it, stop it."""
    import boto3

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(SETUP_ACTIONS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()  # not an AWS action
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto with auth did not start on {endpoint}") from None
                time.sleep(0.1)
        setup = {"endpoint_url": endpoint, "region_name": REGION, "aws_access_key_id": "AKIASETUP0000000000",
                 "aws_secret_access_key": "setup"}
        bucket = "streamio-auth"
        boto3.client("s3", **setup).create_bucket(Bucket=bucket)
        iam = boto3.client("iam", **setup)
        keys = []
        for user, policy in (("allowed", True), ("denied", False)):
            iam.create_user(UserName=user)
            k = iam.create_access_key(UserName=user)["AccessKey"]
            keys.append((k["AccessKeyId"], k["SecretAccessKey"]))
            if policy:
                iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(
                    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        yield AuthS3(endpoint, bucket, keys[0], keys[1])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
