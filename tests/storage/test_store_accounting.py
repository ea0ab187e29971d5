"""The pure parts of store request accounting (streamio.storage.accounting): the op of a request,
the outcome of a status, and the ledger's promise that every attempt lands in exactly one outcome."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamio.metrics
from streamio.storage import accounting
from streamio.storage.accounting import OPS, OUTCOMES, Ledger

_QUERY_KEYS = ["list-type", "uploads", "uploadId", "partNumber", "versionId", "delete", "prefix", "x-id", "tagging"]


def _requests() -> dict[tuple[str, str], float]:
    found = streamio.metrics.snapshot()["streamio_store_requests_total"]
    out = {}
    for labels, value in found.items():
        op, outcome = (part.split("=", 1)[1].strip('"') for part in labels.split(","))
        out[(op, outcome)] = value
    return out


@given(st.integers(100, 599))
def test_every_status_has_one_outcome(status: int) -> None:
    got = accounting.outcome(status)
    assert got in OUTCOMES
    if status < 400 or status in (404, 412):
        assert got == "ok"
    elif status in (429, 503):
        assert got == "throttled"
    elif status >= 500 or status == 408:
        assert got == "retried"
    else:
        assert got == "failed"
    assert accounting.outcome(None) == "retried"  # no response: a reset or a timeout


@given(
    st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "get"]),
    st.lists(st.sampled_from(_QUERY_KEYS), unique=True, max_size=3),
    st.booleans(),
)
def test_s3_op_is_one_of_the_five_and_only_object_puts_carry_object_bytes(
    method: str, keys: list[str], copy: bool
) -> None:
    url = "http://h/bucket/key" + ("?" + "&".join(f"{k}=1" for k in keys) if keys else "")
    op, body = accounting.s3_op(method, url, copy=copy)
    assert op in OPS
    listing = {"list-type", "uploads", "uploadId", "prefix"} & set(keys)
    expected = {"HEAD": "head", "DELETE": "delete", "PUT": "put"}.get(method.upper())
    if method.upper() == "GET":
        expected = "list" if listing else "get"
    if method.upper() == "POST":
        expected = "delete" if "delete" in keys else "put"
    assert op == expected
    assert body == (method.upper() == "PUT" and not copy and set(keys) <= {"partNumber", "uploadId", "x-id"})


@pytest.mark.parametrize(
    ("method", "url", "op"),
    [
        ("GET", "http://h/download/storage/v1/b/bk/o/a%2Fb?alt=media", "get"),
        ("GET", "http://h/storage/v1/b/bk/o/a%2Fb", "head"),
        ("GET", "http://h/storage/v1/b/bk/o?prefix=a/&maxResults=1000", "list"),
        ("GET", "http://h/storage/v1/b/bk", "list"),
        ("POST", "http://h/upload/storage/v1/b/bk/o?uploadType=multipart", "put"),
        ("PUT", "http://h/upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=x", "put"),
        ("DELETE", "http://h/storage/v1/b/bk/o/a", "delete"),
        ("POST", "http://h/batch/storage/v1", "delete"),
    ],
)
def test_gcs_op_of_the_json_api(method: str, url: str, op: str) -> None:
    assert accounting.gcs_op(method, url) == op


# one retry loop: each attempt is a list of HTTP statuses (None: no response); the loop retries an
# attempt whose last request failed transiently, and ends with success or by giving up
_attempt = st.lists(st.sampled_from([200, 404, 412, 403, 500, 503, 429, None]), min_size=1, max_size=3)


@given(st.lists(_attempt, min_size=1, max_size=6), st.booleans(), st.booleans())
def test_ledger_counts_every_attempt_once_and_fails_at_most_one(
    attempts: list[list[int | None]], gives_up: bool, answer: bool
) -> None:
    streamio.metrics.reset()
    ledger = Ledger()
    for i, statuses in enumerate(attempts):
        last = i == len(attempts) - 1

        def one(statuses: list[int | None] = statuses, last: bool = last) -> None:
            for status in statuses:
                accounting.attempt("get", status)
            if not last or gives_up:
                raise ConnectionError("cut")

        try:
            ledger.run(one)
        except ConnectionError as exc:
            if last:
                ledger.gave_up(exc, answer=answer)
    ledger.close()
    expected: dict[tuple[str, str], float] = {}
    for i, statuses in enumerate(attempts):
        results = [accounting.outcome(s) for s in statuses]
        if i < len(attempts) - 1:  # retried: its last request was the failure
            results[-1] = "throttled" if results[-1] == "throttled" else "retried"
        elif gives_up:  # the last attempt of a request that fails, unless the store answered
            results[-1] = "ok" if answer and results[-1] == "ok" else "failed"
        for result in results:
            expected[("get", result)] = expected.get(("get", result), 0.0) + 1.0
    assert _requests() == expected
    assert sum(expected.values()) == sum(len(a) for a in attempts)  # every HTTP attempt once


def test_an_error_an_inner_loop_settled_is_not_settled_again() -> None:
    streamio.metrics.reset()
    inner, outer = Ledger(), Ledger()
    err = ConnectionError("a part spent its attempts")

    def part() -> None:
        accounting.attempt("put", 503)
        raise err

    def upload() -> None:
        try:
            inner.run(part)
        except ConnectionError as exc:
            inner.gave_up(exc, answer=False)
            accounting.attempt("delete", 204)  # the abort, in the outer loop's attempt
            raise

    with pytest.raises(ConnectionError):
        outer.run(upload)
    outer.gave_up(err, answer=False)
    assert _requests() == {("put", "failed"): 1.0, ("delete", "ok"): 1.0}


# ------------------------------------------------------------------ claims from outside: a child's report
@pytest.mark.parametrize(
    "forged",
    [
        [[["get", "ok"], -5]],  # a counter going down
        [[["get", "ok"], float("nan")]],
        [[["get", "ok"], 1e309]],  # inf once parsed
        [[["get", "ok"], True]],  # a bool where a number is expected
        [[["get", "ok"], "7"]],
        [[["get"], 1]],  # labels that are not the instrument's
    ],
    ids=["negative", "nan", "inf", "bool", "string", "labels"],
)
def test_a_forged_child_report_is_skipped_whole(
    forged: list, tmp_path: Any, caplog: pytest.LogCaptureFixture  # type: ignore[type-arg]
) -> None:
    from streamio.metrics import processes

    streamio.metrics.reset()
    processes._before_fork()  # the directory forked children report into (made before a first fork)
    assert processes._state.own_dir is not None
    path = os.path.join(processes._state.own_dir, "1-deadbeef.json")  # pid 1: not our child, "exited"
    doc = {"v": 1, "metrics": {
        "streamio_store_bytes_read_total": [[[], 10]],  # one honest line beside the forged one
        "streamio_store_requests_total": forged,
    }}
    with open(path, "w") as f:
        f.write(json.dumps(doc))
    snap = streamio.metrics.snapshot()
    assert snap["streamio_store_requests_total"] == {} and snap["streamio_store_bytes_read_total"] == 0
    assert "skipped a worker's report" in caplog.text
    streamio.metrics.reset()
