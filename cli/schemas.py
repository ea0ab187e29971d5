"""The ``--json`` output of every verb: the flag, one schema per verb written down once, the printing.

Each verb prints one JSON document on stdout with ``--json`` (progress and errors stay on
stderr), with the keys listed here; the dataset verbs (``shard``, ``index``, ``inspect``) build
theirs with :func:`summary`. The same table feeds the verb's ``--help`` (the epilog) and
docs/cli.md, and the tests check every verb's output against it and the docs against it, so the
three cannot drift apart. Keys may be added in later versions; none listed here is removed
without a new major version. URLs in the output never hold a password (userinfo shows as
``***``).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the library is imported inside each verb: `streamio --help` does not load it
    from streamio.data.format.index import DatasetIndex
    from streamio.storage import Store

__all__ = ["SCHEMAS", "Schema", "echo_json", "json_help", "json_option", "summary"]


@dataclass(frozen=True)
class Schema:
    """The ``--json`` document of one verb.

    Attributes:
        shape: ``"object"``, or ``"array"`` (of objects with the keys, one per row).
        keys: key -> what it holds; a key marked ``(optional)`` may be absent.
        row: what one element of an array is (for arrays).
    """

    shape: str
    keys: dict[str, str]
    row: str = ""

    def required(self) -> list[str]:
        """The keys every document (or row) holds."""
        return [k for k, v in self.keys.items() if not v.startswith("(optional)")]


_DATASET = {
    "url": "where the shards are (the root their paths are relative to)",
    "index_url": "the index.json read or written",
    "shards": "number of shards",
    "samples": "number of samples",
    "bytes": "total bytes of the shards",
    "keys": "member extensions seen, sorted (e.g. [\"cls\", \"jpg\"])",
    "compression": "\"zstd\", null (plain .tar) or \"mixed\"",
    "fingerprint": "\"sha256:...\" of the shard list (what a resume state checks)",
}

SCHEMAS: dict[str, Schema] = {
    "shard": Schema("object", dict(_DATASET)),
    "index": Schema("object", dict(_DATASET)),
    "inspect": Schema("object", dict(_DATASET)),
    "ls": Schema("array", {
        "path": "shard path, relative to the dataset's url",
        "samples": "samples in the shard",
        "bytes": "size of the shard",
        "checksum": "\"crc32c:...\" of the whole shard",
        "compression": "\"zstd\" or null",
    }, row="one shard, in dataset order"),
    "verify": Schema("object", {
        "url": "where the shards are",
        "index_url": "the index.json checked against",
        "checked": "number of shards checked",
        "deep": "true: every byte was re-read; false (--quick): sizes only",
        "ok": "true when no shard is bad (exit status 0)",
        "bad": "[{\"path\", \"reason\"}] for each bad shard (exit status 1)",
    }),
    "plan": Schema("object", {
        "url": "the dataset (null for a mixture: see sources)",
        "fingerprint": "the index's fingerprint (null for a mixture)",
        "sources": "[{\"url\", \"weight\", \"shards\", \"samples\", \"samples_per_epoch\"}], one per URL",
        "shards": "number of shards (all sources)",
        "samples": "samples in the epoch",
        "epoch": "--epoch",
        "seed": "--seed",
        "policy": "\"pad\" or \"drop\"",
        "shuffle": "{\"shards\": bool, \"window\": int, \"interleave\": int}",
        "world_size": "ranks",
        "num_workers": "DataLoader workers per rank",
        "batch_size": "batch size",
        "samples_per_rank": "samples each rank yields",
        "batches_per_rank": "batches each rank yields",
        "last_batch": "samples in each rank's last batch",
        "padding": "samples repeated to even out the ranks (pad)",
        "dropped": "samples left out this epoch (drop)",
        "ranks": "[{\"rank\", \"samples\", \"batches\", \"per_source\": [samples of each source], \"shards\", "
        "\"runs\": [[path, first, end], ...]}] (a mixture's paths are SOURCE:PATH)",
        "checks": "{\"exactly_once\": bool, \"equal_work\": bool}",
        "problems": "what a failed check found (exit status 1 when not empty)",
    }),
    "ckpt ls": Schema("array", {
        "step": "the step",
        "path": "its save directory, relative to ROOT",
        "latest": "whether latest.json names it",
        "place": "\"current\", \"ahead\", \"abandoned\" or \"unknown\" (its timeline); \"local\" with --local "
                 "for a save only the local tier holds",
        "bad": "why a restore rejected it, or null",
        "tier": "(optional) with --local: \"durable\", \"local\" or \"both\"",
        "local_ranks": "(optional) with --local: the ranks whose local copy it is",
        "local_latest": "(optional) with --local: whether a rank's local latest.json names it",
        "bytes": "(optional) total bytes (absent when its manifest cannot be read)",
        "files": "(optional) number of files",
        "world_size": "(optional) ranks that saved it",
        "created": "(optional) ISO-8601 time of the commit",
        "metrics": "(optional) the metrics saved with it",
        "timeline": "(optional) its timeline id",
        "error": "(optional) why its manifest cannot be read",
    }, row="one committed checkpoint, oldest first"),
    "ckpt plan": Schema("object", {
        "world": "ranks",
        "state_bytes": "the checkpoint's size",
        "part_bytes": "the size of each part",
        "objects_per_rank": "parts each rank writes",
        "save_requests": "write requests of one save (parts, multipart requests, markers, manifest, pointer)",
        "save_bytes_per_node": "bytes each node uploads",
        "save_s": "lower bound of the save's time, seconds",
        "save_bound": "\"request rate\" or \"node bandwidth\": what sets save_s",
        "restore_requests": "read requests of one restore",
        "restore_store_bytes": "bytes the store serves",
        "restore_bytes_per_node": "bytes each node downloads",
        "restore_s": "lower bound of the restore's time, seconds",
        "restore_bound": "\"request rate\" or \"node bandwidth\": what sets restore_s",
        "key_prefixes": "the key prefixes a save's objects are spread over",
        "save_s_spread": "lower bound of the save's time once the store serves each key prefix at its rate",
        "restore_s_spread": "lower bound of the restore's time once the store serves each key prefix at its rate",
        "store": "the limits assumed",
    }),
    "ckpt inspect": Schema("object", {
        "step": "the step",
        "path": "its save directory, relative to ROOT",
        "world_size": "ranks that saved it",
        "created": "ISO-8601 time of the commit",
        "metrics": "the metrics saved with it",
        "software": "versions of the software that saved it",
        "timeline": "{\"id\", \"parent\", \"place\", \"history\", ...}",
        "bad": "why a restore rejected it, or null",
        "retention": "the root's recorded retention policy, or null",
        "state": "its non-tensor state (replicated)",
        "per_rank": "each rank's own non-tensor state",
        "bytes": "total bytes",
        "files": "number of files",
        "key_prefixes": "the key prefixes its ranks' parts are spread over (1: all in its save directory)",
        "tensors": "[{\"section\", \"key\", \"dtype\", \"shape\", \"nbytes\", \"rank\"}]",
    }),
    "ckpt verify": Schema("object", {
        "root": "the checkpoint root",
        "ok": "true when nothing is wrong (exit status 0)",
        "steps": "[{\"step\", \"path\", \"ok\", \"problems\"}] for each checkpoint verified",
        "problems": "every problem found, latest.json's included (exit status 1 when not empty)",
    }),
    "ckpt gc": Schema("object", {
        "root": "the checkpoint root",
        "dry_run": "true: nothing was deleted",
        "deleted": "URLs of the objects deleted (or that would be)",
        "bytes": "their total size",
        "multipart_uploads": "incomplete uploads aborted (or that would be)",
        "kept": "saves kept although garbage, each with why",
    }),
    "ckpt rm": Schema("object", {
        "root": "the checkpoint root",
        "step": "the step removed",
        "dry_run": "true: nothing was changed",
        "pointer": "{\"step\", \"url\"} latest.json was moved to, or null",
        "saves": "number of save directories of the step",
        "deleted": "URLs of the objects deleted (or that would be)",
    }),
}


def json_help(verb: str) -> str:
    """The ``--json`` paragraph of ``verb``'s ``--help`` (``\\b`` keeps click from re-wrapping it)."""
    schema = SCHEMAS[verb]
    width = max(len(k) for k in schema.keys) + 2
    head = (f"With --json: a JSON array, {schema.row}, each with:" if schema.shape == "array"
            else "With --json: one JSON object with:")
    rows = "\n".join(
        textwrap.fill(text, width=78, initial_indent=f"  {key:<{width}}", subsequent_indent=" " * (width + 2))
        for key, text in schema.keys.items()
    )
    return f"\b\n{head}\n{rows}"


json_option = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout (keys below).")
"""The ``--json`` flag; the verb's schema (:func:`json_help`) is in its ``--help`` epilog."""


def echo_json(doc: Any) -> None:
    """Print ``doc`` as the verb's one line of JSON on stdout."""
    click.echo(json.dumps(doc))


def summary(store: Store, index: DatasetIndex, index_url: str) -> dict[str, Any]:
    """The ``shard`` / ``index`` / ``inspect`` document (``SCHEMAS``): where, how much, what."""
    return {
        "url": store.root_url,
        "index_url": index_url,
        "shards": len(index.shards),
        "samples": index.samples,
        "bytes": sum(s.bytes for s in index.shards),
        "keys": list(index.keys),
        "compression": index.compression,
        "fingerprint": index.fingerprint,
    }
