"""``--json`` on every verb: each prints one JSON document with exactly the keys cli/schemas.py lists, and
the verb's ``--help`` and docs/cli.md document them (and every verb, option and exit status); URLs come
out without their password; human output says "1 shard", not "1 shards"."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import click
import pytest
import torch
from click.testing import CliRunner

from streamio.checkpoint import CheckpointManager, KeepLast
from streamio.cli.exits import EXIT_CODES
from streamio.cli.main import cli
from streamio.cli.schemas import SCHEMAS
from streamio.data.write.writer import ShardSpec, write_dataset

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def run(*args: str, code: int = 0) -> Any:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    return json.loads(res.stdout)


def check(verb: str, doc: Any) -> None:
    """``doc`` has the shape and exactly the keys the schema of ``verb`` documents."""
    schema = SCHEMAS[verb]
    rows = doc if schema.shape == "array" else [doc]
    assert isinstance(doc, list if schema.shape == "array" else dict) and rows, (verb, doc)
    for row in rows:
        assert set(schema.required()) <= set(row) <= set(schema.keys), (verb, sorted(row), sorted(schema.keys))


def _commands(group: click.Group = cli, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out |= _commands(cmd, f"{prefix}{name} ")
        else:
            out[f"{prefix}{name}"] = cmd
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("json") / "ds"
    write_dataset(({"__key__": f"{i:03d}", "txt": f"s{i}"} for i in range(7)), str(root), spec=ShardSpec(max_count=3))
    return str(root)


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("json") / "ckpt")
    model = torch.nn.Linear(4, 2)
    with CheckpointManager(root, retention=KeepLast(5), async_save=False) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"model": model}, metrics={"loss": 1.0 / step})
    return root


def test_every_verb_has_a_schema_and_a_documented_json_flag() -> None:
    commands = _commands()
    assert set(commands) == set(SCHEMAS)
    for verb, cmd in commands.items():
        assert any("--json" in p.opts for p in cmd.params), verb
        text = CliRunner().invoke(cli, [*verb.split(), "--help"]).stdout
        assert "With --json:" in text, verb
        for key in SCHEMAS[verb].keys:
            assert re.search(rf"^ +{re.escape(key)} ", text.split("With --json:", 1)[1], re.M), (verb, key)


def test_docs_list_every_verb_option_key_and_exit_status() -> None:
    docs = DOCS.read_text()
    for verb, cmd in _commands().items():
        assert f"### `streamio {verb}" in docs and f"### `streamio {verb} --json`" in docs, verb
        for param in cmd.params:
            if isinstance(param, click.Option):
                assert any(f"`{opt}" in docs for opt in param.opts), (verb, param.opts)
        section = docs.split(f"### `streamio {verb} --json`", 1)[1].split("###", 1)[0]
        for key in SCHEMAS[verb].keys:
            assert f"| `{key}` |" in section, (verb, key)
    for code in EXIT_CODES:
        assert f"| {int(code)} |" in docs


def test_dataset_verbs(dataset: str, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    check("shard", shard := run("shard", str(tmp_path / "in.jsonl"), str(tmp_path / "j"), "--json"))
    assert shard["samples"] == 2 and shard["keys"] == ["json"] and shard["index_url"] == f"{tmp_path}/j/index.json"
    check("index", index := run("index", dataset, "--index-url", str(tmp_path / "idx"), "--json"))
    assert index["url"] == dataset and index["index_url"] == f"{tmp_path}/idx/index.json" and index["shards"] == 3
    check("ls", run("ls", dataset, "--json"))
    for url in (dataset, str(tmp_path / "idx"), f"{dataset}/data-{{000000..000002}}.tar"):
        check("inspect", doc := run("inspect", url, "--json"))
        assert doc["url"] in (dataset, f"file://{dataset}") and doc["samples"] == 7  # as the index at idx records it
        check("verify", ok := run("verify", url, "--json"))
        assert ok["ok"] and ok["checked"] == 3 and ok["deep"]
    check("plan", run("plan", dataset, "-R", "2", "--json"))


def test_verify_json_of_a_bad_dataset(dataset: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in Path(dataset).iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "data-000001.tar").unlink()
    check("verify", doc := run("verify", str(bad), "--json", code=1))
    assert not doc["ok"] and doc["bad"] == [{"path": "data-000001.tar", "reason": "missing: the object does not exist"}]


def test_checkpoint_verbs(ckpt_root: str, tmp_path: Path) -> None:
    check("ckpt ls", rows := run("ckpt", "ls", ckpt_root, "--json"))
    assert [r["step"] for r in rows] == [1, 2, 3]
    check("ckpt inspect", run("ckpt", "inspect", ckpt_root, "--json"))
    check("ckpt verify", doc := run("ckpt", "verify", ckpt_root, "--all", "--json"))
    assert doc["ok"] and [s["step"] for s in doc["steps"]] == [1, 2, 3] and doc["problems"] == []
    check("ckpt gc", gc := run("ckpt", "gc", ckpt_root, "--dry-run", "--json"))
    assert gc["dry_run"] and gc["deleted"] == []
    check("ckpt rm", rm := run("ckpt", "rm", ckpt_root, "1", "--dry-run", "--json"))
    assert rm["step"] == 1 and rm["saves"] == 1 and rm["pointer"] is None and rm["deleted"]
    assert all(u.startswith(ckpt_root) for u in rm["deleted"])
    bad = next(Path(ckpt_root).glob("step-*3*/rank-*/*.bin"), None) or next(Path(ckpt_root).rglob("part*"))
    bad.write_bytes(bad.read_bytes()[:-1])
    check("ckpt verify", doc := run("ckpt", "verify", ckpt_root, "3", "--json", code=1))
    assert not doc["ok"] and doc["steps"][0]["problems"] and doc["problems"] == doc["steps"][0]["problems"]


def test_human_output_has_headers_and_singulars(tmp_path: Path, ckpt_root: str) -> None:
    write_dataset([{"__key__": "a", "txt": "x"}], str(tmp_path / "one"))
    res = CliRunner().invoke(cli, ["verify", str(tmp_path / "one")])
    assert res.stdout == f"{tmp_path}/one: 1 shard OK (sizes, checksums, sample counts)\n"
    res = CliRunner().invoke(cli, ["ls", str(tmp_path / "one")])
    assert res.stdout.splitlines()[0].split() == ["PATH", "SAMPLES", "BYTES", "CHECKSUM"]
    (tmp_path / "in.jsonl").write_text('{"a": 1}\n')
    res = CliRunner().invoke(cli, ["shard", str(tmp_path / "in.jsonl"), str(tmp_path / "j")])
    assert res.stdout.startswith(f"{tmp_path}/j: 1 shard, 1 sample, ")
    assert "note: the shards are" in res.stderr and "--compress zstd" in res.stderr  # 9 bytes became 2 KB
    lines = CliRunner().invoke(cli, ["ckpt", "ls", ckpt_root]).stdout.splitlines()
    assert lines[0].split() == ["STEP", "SIZE", "FILES", "WORLD", "CREATED", "METRICS"]
    assert len(lines) == 4 and " 1 file " in lines[1] and lines[3].startswith("*")


def test_urls_are_printed_without_their_password() -> None:
    url = f"memory://user:hunter2pw@host/{uuid.uuid4().hex}"
    write_dataset(({"__key__": f"{i}", "txt": "x"} for i in range(4)), url, spec=ShardSpec(max_count=2))
    shown = url.replace("user:hunter2pw@", "***@")
    for args in (["ls", url], ["inspect", url], ["verify", url], ["verify", url, "--json"], ["inspect", url, "--json"],
                 ["plan", url, "-R", "2"], ["plan", url, "-R", "2", "--json"], ["inspect", f"{url}/index.json"],
                 ["verify", f"{url}/data-{{000000..000001}}.tar", "--json"], ["shard", f"{url}/*.tar", f"{url}-2"],
                 ["index", url, "--index-url", "memory://elsewhere"], ["verify", f"{url}-missing"]):
        res = CliRunner().invoke(cli, args)
        assert "hunter2pw" not in res.stdout + res.stderr, (args, res.stdout, res.stderr)
        assert args[0] == "ls" or shown in res.stdout + res.stderr, (args, res.stdout, res.stderr)
