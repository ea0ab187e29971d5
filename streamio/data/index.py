"""The dataset index (``index.json``): schema and data model.

Placeholder for the shards-and-index issue, which adds load / validate / write / build. The
names below are the interface other modules (plan CLI, cache, dataset) code against.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT = "streamio.dataset/1"
INDEX_NAME = "index.json"


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the index records it.

    Attributes:
        path: path of the shard relative to the dataset root (``data-000000.tar``).
        bytes: exact size of the shard object.
        samples: number of samples in it.
        checksum: ``"crc32c:..."`` of the whole shard object.
    """

    path: str
    bytes: int
    samples: int
    checksum: str


@dataclass(frozen=True)
class SampleLayout:
    """Where each sample of one shard lies, and its checksum.

    Attributes:
        offsets: ``samples + 1`` byte offsets; sample ``i`` is ``[offsets[i], offsets[i+1])`` of the
            shard object (its tar members, or its zstd frame in a ``.tar.zst``).
        checksums: CRC32C (int) of each sample's byte range.
    """

    offsets: tuple[int, ...]
    checksums: tuple[int, ...]
