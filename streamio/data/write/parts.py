"""One dataset written by many tasks: partitions become shards and a summary each, one commit makes the index.

What an engine (Ray Data, Spark, Dask, a process pool) needs to write one streamio dataset from
many tasks, with no engine of its own (``streamio.ray`` is the Ray adapter; docs/design.md
"Writing a dataset from many tasks" has the Spark and process-pool recipes):

1. **Begin, once** (:meth:`PartitionedWrite.begin`, on the driver): the write's marker is put and
   the names its shards take are chosen as for any write (:mod:`streamio.data.write.publish`
   steps 1 and 2). The returned value is small, frozen and picklable: ship it to the tasks.
2. **One task per partition** (:meth:`PartitionedWrite.write_part`): a partition's samples are
   packed into shards (:class:`~streamio.data.write.packer.ShardPacker`) named by the partition's
   id and the attempt, ``{prefix}-p{part:06d}-{attempt}-{i:06d}.tar`` (``attempt``: 8 random hex
   digits per call), then its summary (shards, offsets, checksums, keys) is put **create-only** at
   ``_parts/{prefix}-p{part:06d}.json``. No attempt ever writes a name another attempt wrote, so
   the shards a summary names keep the bytes it records whatever a retried, speculative or zombie
   attempt of the same partition does; one that finds its partition's summary already there (an
   earlier attempt finished) writes nothing. The summary is the partition's commit: a partition
   without one did not finish.
3. **Commit, once** (:meth:`PartitionedWrite.commit`, on the driver, after every task): the
   summaries are read in partition-id order (the dataset's shard order depends only on the ids,
   not on which task finished first) and each is checked against one fresh listing before
   anything is written or deleted: it is its own partition's (its ``part``), it names only shards
   of its partition and of one attempt, numbered from 0 in order, and each of them is stored with
   the size it records. A summary that fails (copied from another partition, forged, naming a
   shard that is missing or of another size) refuses the commit, which then deletes nothing. The
   summaries are merged into one index, and ``index.json`` is put in one conditional PUT
   (create-only, or compare-and-swap on the dataset being replaced with ``overwrite=True``). Then
   the summaries, every shard of this write that no summary names (the attempts that lost, or
   stopped half-way) and the marker are deleted.

A partition's samples must be the same on every attempt (Ray blocks, Spark partitions of a
deterministic plan are): an attempt that finds a summary written meanwhile with other contents is
refused (its shards, under its own names, are removed by the commit).
Until the commit, readers see the dataset that was there before, if any; a write that never
commits leaves shards that the marker claims, removed by the next write with ``overwrite=True``.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamio.data.format.index import INLINE_LIMIT, DatasetIndex, index_document, make_index
from streamio.data.format.index_schema import check_document, short
from streamio.data.format.layout import WRITING_NAME, SampleLayout, ShardInfo
from streamio.data.format.marker import Generation, read_marker
from streamio.data.write import publish
from streamio.data.write.packer import ShardPacker, ShardSpec
from streamio.errors import ConfigError, DatasetError, IndexFormatError, StorageError, WriteConflictError
from streamio.limits import MAX_JSON_BYTES, load_json
from streamio.storage import Store

__all__ = ["PART_FORMAT", "PartSummary", "PartitionedWrite"]

log = logging.getLogger(__name__)

#: The ``format`` of a partition's summary (an index document of the partition's shards).
PART_FORMAT = "streamio.part/1"
PARTS_DIR = "_parts"
_MAX_PART = 10**9


@dataclass(frozen=True)
class PartSummary:
    """What one partition stored (what :meth:`PartitionedWrite.write_part` returns; picklable).

    Attributes:
        part: the partition's id.
        shards: how many shards it made.
        samples: how many samples they hold.
        bytes: their bytes.
    """

    part: int
    shards: int
    samples: int
    bytes: int


@dataclass(frozen=True)
class PartitionedWrite:
    """A dataset being written by many tasks, one partition each; see the module docstring.

    Call order: :meth:`begin` once (driver), :meth:`write_part` once per partition (any process,
    any machine, retried at will), :meth:`commit` once after every partition (driver).

    Example (any engine; here a process pool)::

        write = PartitionedWrite.begin("s3://bucket/ds", spec=ShardSpec(max_count=1000))
        with ProcessPoolExecutor() as pool:
            list(pool.map(write.write_part, range(len(chunks)), chunks))
        index = write.commit()

    Attributes:
        url: the dataset root.
        spec: how shards are cut, named and compressed.
        generation: the names this write's shards take (chosen by :meth:`begin`).
        previous: the dataset this write replaces (what its commit must find).
        storage_options: fsspec options for ``url``. They travel with this value to the tasks
            (pickled in memory by the engine) and are never written anywhere nor shown in its repr.
        inline_limit: datasets up to this many samples keep their offsets inside ``index.json``.
    """

    url: str
    spec: ShardSpec
    generation: Generation
    previous: publish.Previous
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    inline_limit: int = INLINE_LIMIT

    @classmethod
    def begin(
        cls, url: str, *, spec: ShardSpec | None = None, storage_options: Mapping[str, Any] | None = None,
        overwrite: bool = False, inline_limit: int = INLINE_LIMIT,
    ) -> PartitionedWrite:
        """Start a partitioned write at ``url``: put the marker, choose the names (driver, once).

        Raises:
            DatasetError: ``url`` holds a dataset or the leftovers of a write that did not finish,
                and ``overwrite`` is False; or another write started there meanwhile.
        """
        spec = ShardSpec() if spec is None else spec
        store = Store(url, storage_options)
        generation, previous = publish.begin(store, spec.prefix, overwrite=overwrite)
        return cls(store.root_url, spec, generation, previous, storage_options, inline_limit)

    def store(self) -> Store:
        """A :class:`Store` for :attr:`url` (made where it is used: stores are not shipped between processes)."""
        return Store(self.url, self.storage_options)

    def shard_path(self, part: int, shard: int, attempt: str = "") -> str:
        """The name of shard ``shard`` of partition ``part`` written by ``attempt`` (8 hex digits; ``""``:
        the name streamio 0.2 gave): ``{prefix}-[{tag}-]p{part:06d}-[{attempt}-]{shard:06d}.tar[.zst]``."""
        tag = f"{self.generation.tag}-p{part:06d}" if self.generation.tag else f"p{part:06d}"
        return self.spec.shard_path(shard, f"{tag}-{attempt}" if attempt else tag)

    def summary_path(self, part: int) -> str:
        """Where partition ``part``'s summary goes: ``_parts/{prefix}-[{tag}-]p{part:06d}.json``."""
        return f"{PARTS_DIR}/{self.generation.stem}p{part:06d}.json"

    def write_part(self, part: int, samples: Iterable[Mapping[str, Any]], *, max_pending: int = 2) -> PartSummary:
        """Pack partition ``part``'s samples into shards, then put its summary create-only (any task).

        A partition with no sample stores no shard, only its (empty) summary.

        Raises:
            ConfigError: ``part`` is not an int in ``[0, 10**9)``.
            DatasetError: an invalid sample (named); another attempt of this partition stored a
                summary with other contents meanwhile (its samples differ between attempts); or the
                write is no longer open (committed, or replaced by another write: a zombie task),
                its shards then removed.
        """
        _check_part(part)
        store = self.store()
        done = self._read_summary(store, part)
        if done is not None:  # an earlier attempt finished: nothing to write again
            log.info("partition %d of %s was already written (a retried task): skipped", part, self.url)
            return _summarize(part, done[1])
        self._refuse_closed(store, part, ())
        attempt = secrets.token_hex(4)  # names no other attempt writes: a loser never touches a winner's bytes
        packer = ShardPacker(store, self.spec, lambda i: self.shard_path(part, i, attempt), max_pending=max_pending)
        packer.write_all(samples)
        self._refuse_closed(store, part, packer.shards)
        index = make_index(packer.shards, packer.layouts, packer.keys, packer.tokens)
        try:
            store.put(self.summary_path(part), _encode(index, store, part), mode="create")
        except WriteConflictError as exc:
            other = self._read_summary(store, part)
            if other is None or _contents(other[1]) != _contents(index):
                raise DatasetError(
                    f"partition {part} of {self.url} was written by two attempts with different samples "
                    f"({store.url(self.summary_path(part))}): a partition's samples must be the same on every attempt. "
                    f"Make the pipeline deterministic, then write the dataset again with overwrite=True."
                ) from exc
        return _summarize(part, index)

    def commit(self, parts: Iterable[int] | None = None) -> DatasetIndex:
        """Merge the partitions' summaries, in id order, into ``index.json`` (driver, once, after every task).

        Args:
            parts: the partitions that make the dataset (e.g. the ids the tasks returned); None:
                every partition whose summary is stored.

        Returns:
            The dataset's index.

        Raises:
            DatasetError: a partition named in ``parts`` has no summary (its task did not finish);
                a summary names a shard that is not stored, or not with the size it records; no
                partition holds a sample; or the index changed since :meth:`begin` (another write
                committed). Nothing is deleted.
            IndexFormatError: a summary is not one this streamio wrote for its partition (another
                partition's, or naming shards that are not its partition's). Nothing is deleted.
        """
        store = self.store()
        sizes = {o.path: o.size for o in store.list()}
        listing = list(sizes)
        stored = self._stored_parts(listing)
        if parts is not None:
            parts = list(parts)
            for part in parts:
                _check_part(part)
        wanted = sorted(set(stored if parts is None else parts))
        missing = [p for p in wanted if p not in stored]
        if missing:
            raise DatasetError(
                f"partition(s) {missing[:10]} of {self.url} have no summary "
                f"({store.url(self.summary_path(missing[0]))}): their tasks did not finish. Run them again "
                f"(write_part), then commit."
            )
        shards: list[ShardInfo] = []
        layouts: dict[int, SampleLayout] = {}
        tokens: dict[int, dict[str, tuple[int, ...]]] = {}
        keys: set[str] = set()
        for part in wanted:
            found = self._read_summary(store, part)
            if found is None:
                raise DatasetError(f"the summary of partition {part} of {self.url} vanished while committing: "
                                   f"is another commit of this write running?")
            summary = found[1]
            self._check_summary(part, found[0], summary, sizes, store.url(self.summary_path(part)))
            for i, shard in enumerate(summary.shards):
                layouts[len(shards)] = summary.layout(i, store)
                tokens[len(shards)] = summary.shard_tokens(i)
                shards.append(shard)
            keys.update(summary.keys)
        if not shards:
            publish.discard(store)
            raise DatasetError(f"no samples were written to {self.url}: every partition was empty")
        index = make_index(shards, layouts, keys, tokens)
        named = {s.path for s in shards}
        leftovers = [p for p in listing if self.generation.owns(p) and p not in named]
        publish.commit(store, self.generation, self.previous, index, self.inline_limit, leftovers=leftovers)
        if store.is_local:  # an object store has no directories; a local one keeps the emptied _parts/
            try:
                store.fs.rmdir(store.url(PARTS_DIR))
            except OSError:  # not empty: another partitioned write's summaries
                pass
        return index

    def _refuse_closed(self, store: Store, part: int, written: Iterable[ShardInfo]) -> None:
        """Stop a task of a write that is no longer open (its marker is gone: committed, or replaced),
        removing the shards it stored (names no other attempt has): no commit would ever remove them."""
        try:
            marker = read_marker(store)
        except IndexFormatError:  # not a marker of ours: not this write's either
            marker = None
        if marker == self.generation:
            return
        for shard in written:
            try:
                store.delete(shard.path)
            except StorageError as exc:
                log.warning("could not remove %s (%s): remove it by hand", store.url(shard.path), exc)
        raise DatasetError(
            f"partition {part} of {self.url}: this write ({self.generation.pattern}, started "
            f"{self.generation.started}) is no longer open: it was committed, or another write replaced it "
            f"({store.url(WRITING_NAME)} is gone or another write's). Nothing of this task was kept. Is it a task "
            f"that outlived its job?"
        )

    def _check_summary(self, part: int, stated: Any, summary: DatasetIndex, sizes: Mapping[str, int], url: str) -> None:
        """Refuse a summary that names anything but its own partition's shards, each stored with its size.

        A summary is read back from storage any task (or anyone) can write: the commit deletes what
        the index does not name, so one that named another partition's shards (a copy) would drop
        this partition's, and one naming a shard twice would make an index no reader can open.
        """
        if type(stated) is not int or stated != part:
            raise IndexFormatError(
                f"{url} is the summary of partition {short(stated)}, not of partition {part}: it was copied or "
                f"forged. Nothing was committed or deleted; remove it and run partition {part} again (write_part)."
            )
        attempt = self._attempt_of(part, summary.shards[0].path) if summary.shards else ""
        for i, shard in enumerate(summary.shards):
            if shard.path != self.shard_path(part, i, attempt):
                raise IndexFormatError(
                    f"{url} names {shard.path!r} as shard {i} of partition {part}; this write names it "
                    f"{self.shard_path(part, i, attempt or '<attempt>')!r} (one attempt's shards of its own partition, "
                    f"in order). "
                    f"It was copied or forged: nothing was committed or deleted. Remove it and run partition {part} "
                    f"again (write_part)."
                )
            if sizes.get(shard.path) != shard.bytes:
                found = "is not stored" if shard.path not in sizes else f"has {sizes[shard.path]:,} bytes"
                raise DatasetError(
                    f"{url} names {shard.path!r} of {shard.bytes:,} bytes, which {found}: nothing was committed or "
                    f"deleted. Remove the summary and run partition {part} again (write_part)."
                )

    def _attempt_of(self, part: int, path: str) -> str:
        """The attempt whose shard 0 of partition ``part`` is named ``path`` (``""``: none found in it)."""
        plain = self.shard_path(part, 0)
        stem = plain[: plain.rindex("-") + 1]  # {prefix}-[{tag}-]p{part:06d}-
        attempt = path[len(stem) : len(stem) + 8]
        return attempt if path.startswith(stem) and re.fullmatch(r"[0-9a-f]{8}", attempt) else ""

    def _stored_parts(self, listing: Iterable[str]) -> set[int]:
        pattern = re.compile(rf"^{PARTS_DIR}/{re.escape(self.generation.stem)}p([0-9]{{6,}})\.json$")
        return {int(m.group(1)) for m in map(pattern.match, listing) if m}

    def _read_summary(self, store: Store, part: int) -> tuple[Any, DatasetIndex] | None:
        """Partition ``part``'s summary: ``(the partition it says it is, its shards)``, or None."""
        path = self.summary_path(part)
        try:
            data = store.read(path, max_bytes=MAX_JSON_BYTES)
        except FileNotFoundError:
            return None
        return _decode(data, store.url(path))


def _check_part(part: Any) -> None:
    if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part < _MAX_PART:
        raise ConfigError(f"a partition id must be an int in [0, {_MAX_PART:,}), not {part!r}")


def _summarize(part: int, index: DatasetIndex) -> PartSummary:
    return PartSummary(part, len(index.shards), index.samples, sum(s.bytes for s in index.shards))


def _encode(index: DatasetIndex, store: Store, part: int) -> bytes:
    doc, _ = index_document(index, store, inline_limit=sys.maxsize)  # every layout inline: no sidecar
    doc["format"] = PART_FORMAT
    doc["part"] = part
    return json.dumps(doc, separators=(",", ":")).encode()


def _contents(index: DatasetIndex) -> list[tuple[int, int, str]]:
    """What two attempts of one partition agree on when their samples are the same (not the names)."""
    return [(s.bytes, s.samples, s.checksum) for s in index.shards]


def _decode(data: bytes, url: str) -> tuple[Any, DatasetIndex]:
    raw = load_json(data, what=url, error=IndexFormatError)
    doc = check_document(raw, url, fmt=PART_FORMAT)
    layouts: dict[int, SampleLayout] = {}
    for i, entry in enumerate(doc.shards):
        if entry.offsets is None or entry.crcs is None:
            raise IndexFormatError(
                f"{url}: shard {entry.path!r} has no inline offsets; a partition summary holds them all"
            )
        layouts[i] = SampleLayout(entry.offsets, entry.crcs, entry.max_sample_bytes)
    tokens = {i: entry.tokens for i, entry in enumerate(doc.shards) if entry.tokens}
    index = make_index([ShardInfo(e.path, e.bytes, e.samples, e.checksum) for e in doc.shards], layouts, doc.keys,
                       tokens)
    return raw.get("part"), index
