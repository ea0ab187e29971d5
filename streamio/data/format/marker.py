"""The write marker (``_writing.json``): which write a prefix's unindexed shards belong to.

A write (:mod:`streamio.data.write.publish`) puts the marker before its first shard and removes it after
its index is committed, so shards that a marker claims and no index names are the leftovers of a
write that did not finish. This module owns the document: :func:`encode_marker` is the only place
that writes its JSON and :func:`read_marker` the only place that reads it; readers
(:mod:`streamio.data.locate`, ``build_index``) ask it to refuse or explain leftovers, writers to
start and clean up. The names a write's shards take are :class:`Generation`'s.

A marker is read back from storage someone else can write: it is size-limited, parsed with
:func:`streamio.limits.load_json`, and trusted for any cleanup only when every field is one this
streamio writes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from streamio.data.format.layout import WRITING_NAME
from streamio.errors import IndexFormatError, ObjectTooLargeError
from streamio.limits import load_json
from streamio.storage import Store

__all__ = ["Generation", "encode_marker", "read_marker"]

_MARKER_FORMAT = "streamio.write/1"
_MAX_MARKER_BYTES = 64 << 10


@dataclass(frozen=True)
class Generation:
    """One write into a prefix: the names its shards take.

    Attributes:
        prefix: the shard name prefix (``ShardSpec.prefix``).
        tag: ``""`` (plain names) or 8 hex digits (``{prefix}-{tag}-000000.tar``).
        started: when the write began (UTC, ISO 8601), for messages.
    """

    prefix: str
    tag: str
    started: str

    @property
    def stem(self) -> str:
        """What every shard name of this write starts with: ``data-`` or ``data-1a2b3c4d-``."""
        return f"{self.prefix}-{self.tag}-" if self.tag else f"{self.prefix}-"

    @property
    def pattern(self) -> str:
        """A glob of this write's shards, for messages."""
        return f"{self.stem}*.tar*"

    def owns(self, path: str) -> bool:
        """Whether ``path`` is one of this write's shards, their layout sidecars, or (a partitioned
        write) one of its partition summaries."""
        return _names(self.prefix, self.tag).match(path) is not None


def _names(prefix: str, tag: str) -> re.Pattern[str]:
    stem = re.escape(f"{prefix}-{tag}-" if tag else f"{prefix}-")
    # a partitioned write (streamio.data.write.parts) adds the partition and the attempt:
    # data-p000003-1a2b3c4d-000000.tar (data-p000003-000000.tar in streamio 0.2), and keeps each
    # partition's summary in _parts/data-p000003.json until its commit
    shards = rf"(?:_layout/)?{stem}(?:p[0-9]{{6,}}-(?:[0-9a-f]{{8}}-)?)?[0-9]{{6,}}\.tar(?:\.zst)?(?:\.bin)?"
    return re.compile(rf"^(?:{shards}|_parts/{stem}p[0-9]{{6,}}\.json)$")


def encode_marker(generation: Generation) -> bytes:
    """The marker document of ``generation``, as a write puts it."""
    doc = {"format": _MARKER_FORMAT, "prefix": generation.prefix, "tag": generation.tag, "started": generation.started}
    return json.dumps(doc).encode()


def read_marker(store: Store) -> Generation | None:
    """The write a prefix's marker records, or None without one.

    Raises:
        IndexFormatError: a marker that is not one this streamio wrote (it is then not trusted
            for any cleanup).
    """
    try:
        data = store.read(WRITING_NAME, max_bytes=_MAX_MARKER_BYTES)
    except FileNotFoundError:
        return None
    except ObjectTooLargeError as exc:
        raise IndexFormatError(f"the write marker {exc}") from exc
    doc = load_json(data, what=store.url(WRITING_NAME), error=IndexFormatError, max_bytes=_MAX_MARKER_BYTES)
    fields = doc if isinstance(doc, dict) else {}
    found = Generation(fields.get("prefix"), fields.get("tag"), str(fields.get("started", "?")))  # type: ignore[arg-type]
    if (
        fields.get("format") != _MARKER_FORMAT or not isinstance(found.prefix, str) or "/" in found.prefix
        or not isinstance(found.tag, str) or not re.fullmatch(r"(?:[0-9a-f]{8})?", found.tag)
    ):
        raise IndexFormatError(
            f"{store.url(WRITING_NAME)} is not a {_MARKER_FORMAT} marker: remove it by hand once you know what wrote it"
        )
    return found
