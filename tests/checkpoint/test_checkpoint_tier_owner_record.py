"""A local tier's owner record and the root identity it holds (streamio/checkpoint/owner.py,
format/notes.py): one identity per root whatever its spelling, never a credential in it; the
record parsed in bounded time or refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.notes import OwnerRecord, owner_from_bytes, owner_to_bytes
from streamio.checkpoint.owner import root_identity


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("s3://bucket/runs/exp1", "s3://bucket//runs/./exp1/"),
        ("s3://bucket/runs/exp1", "s3a://key:secret@bucket/runs/exp1?X-Amz-Signature=abc#x"),
        ("gs://bucket/exp", "gcs://bucket/exp"),
    ],
)
def test_one_root_has_one_identity_and_no_credential_in_it(a: str, b: str) -> None:
    assert root_identity(a) == root_identity(b)
    assert "secret" not in root_identity(b) and "Signature" not in root_identity(b)


def test_a_local_root_is_its_resolved_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    want = f"file://{(tmp_path / 'real').resolve()}"
    assert {root_identity("real"), root_identity(f"file://{tmp_path}/link/"), root_identity(str(tmp_path / "real"))} \
        == {want}
    assert root_identity("s3://bucket/runs/exp1") != root_identity("s3://bucket/runs/exp2")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512) | st.text(max_size=300).map(str.encode))
def test_an_owner_record_parses_or_is_refused_in_bounded_time(data: bytes) -> None:
    try:
        record = owner_from_bytes(data, "owner.json")
    except ManifestError:
        return
    assert isinstance(record.root, str) and 0 < len(record.root) <= 4096


@given(st.text(min_size=1, max_size=200), st.text(max_size=40))
def test_an_owner_record_round_trips(root: str, recorded: str) -> None:
    assert owner_from_bytes(owner_to_bytes(OwnerRecord(root, recorded)), "owner.json") == OwnerRecord(root, recorded)


def test_an_owner_record_too_large_is_refused() -> None:
    with pytest.raises(ManifestError, match="root must be 1..4096 characters"):
        owner_from_bytes(owner_to_bytes(OwnerRecord("s3://b/" + "x" * 5000)), "owner.json")
