"""What a streamio dataset is on storage: its shard and layout values, names and limits.

A dataset is a prefix holding WebDataset shards (``data-000000.tar`` or ``.tar.zst``) and an
``index.json`` written last (docs/design.md "Dataset format"). This module holds the values and
rules that every other data module agrees on, and imports none of them:

* :class:`ShardInfo` (one shard as the index records it) and :class:`SampleLayout` (where each
  of its samples lies, each sample's CRC32C, and the largest decompressed sample);
* the naming rules: how a member name splits into a sample key and a field
  (:func:`split_name`, the WebDataset way), which member names are safe to read
  (:func:`unsafe_reason`), which paths may be named in an index (:func:`shard_path_problem`),
  which objects are shards (:func:`is_shard`) and where a layout sidecar goes
  (:func:`sidecar_path`);
* :data:`MAX_SAMPLE_BYTES`, the default bound of one sample when no index declares its size.

Why a module of its own: the tar reader needs the layout value and the index needs the tar
reader's name rules. With both here the reader (:mod:`streamio.data.format.tar`,
:mod:`streamio.data.format.samples`) and the index (:mod:`streamio.data.format.index`) depend on this module
and not on each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: The ``format`` of every ``index.json`` this streamio writes and reads.
FORMAT = "streamio.dataset/1"
#: The index object at the root of a dataset.
INDEX_NAME = "index.json"
#: Where the layout sidecars of a large dataset live, below its root.
LAYOUT_DIR = "_layout"
#: The marker a write puts first and removes last (:mod:`streamio.data.write.publish`): shards it claims
#: that no index names are the leftovers of a write that did not finish.
WRITING_NAME = "_writing.json"
#: Default bound of one sample's tar records (decompressed) when no index declares it: 1 GiB.
MAX_SAMPLE_BYTES = 1 << 30
#: The longest shard or sidecar path an index may name.
MAX_PATH_CHARS = 1024
#: Shard suffixes and the compression each means.
SHARD_SUFFIXES = {".tar": None, ".tar.zst": "zstd"}
#: gzip'd tar shards (common among webdataset users): a source for ``streamio shard``, never part of a
#: dataset (a gzip stream has no random access: a reader could not start at a sample's offset).
GZIP_SUFFIXES = (".tar.gz", ".tgz")
#: The first two bytes of every gzip stream.
GZIP_MAGIC = b"\x1f\x8b"

_WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


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

    @property
    def compression(self) -> str | None:
        """``"zstd"`` for ``.tar.zst`` shards, None for ``.tar``."""
        return shard_compression(self.path)


@dataclass(frozen=True)
class SampleLayout:
    """Where each sample of one shard lies, and its checksum.

    Attributes:
        offsets: ``samples + 1`` byte offsets; sample ``i`` is ``[offsets[i], offsets[i+1])`` of the
            shard object (its tar members, or its zstd frame in a ``.tar.zst``).
        checksums: CRC32C (int) of each sample's byte range.
        max_sample_bytes: for ``.tar.zst`` shards, the largest sample's tar records after
            decompression: the output limit a reader decompresses a sample with (None: not recorded,
            readers use :data:`MAX_SAMPLE_BYTES`).
    """

    offsets: tuple[int, ...]
    checksums: tuple[int, ...]
    max_sample_bytes: int | None = None

    def byte_range(self, first: int, stop: int) -> tuple[int, int]:
        """``[start, end)`` bytes of samples ``first .. stop-1`` (one ranged GET)."""
        return self.offsets[first], self.offsets[stop]


def shard_compression(path: str) -> str | None:
    """``"zstd"`` for a ``.zst`` shard path, None otherwise (the suffix is the only record of it)."""
    return "zstd" if path.endswith(".zst") else None


def is_shard(path: str) -> bool:
    """Whether ``path`` names a shard (``.tar`` or ``.tar.zst``)."""
    return path.endswith(tuple(SHARD_SUFFIXES))


def is_gzip_shard(path: str) -> bool:
    """Whether ``path`` names a gzip'd tar shard (``.tar.gz``, ``.tgz``)."""
    return path.endswith(GZIP_SUFFIXES)


def gzip_advice(glob: str) -> str:
    """What to say about gzip'd tar shards: why they are not read, and how to convert those ``glob`` names."""
    return (
        f"streamio reads .tar and .tar.zst shards, not gzip'd ones (a gzip stream has no random access: a reader "
        f"could not start at a sample). Convert them once with `streamio shard '{glob}' DEST` "
        f"(add --compress zstd to keep them small)"
    )


def gzip_glob(root: str, found: list[str]) -> str:
    """A glob naming the gzip'd shards ``found`` below ``root`` (by the suffix of the first)."""
    suffix = next(s for s in GZIP_SUFFIXES if found[0].endswith(s))
    return f"{root.rstrip('/')}/*{suffix}"


def sidecar_path(shard_path: str) -> str:
    """Where the layout of ``shard_path`` goes when it is not inline."""
    return f"{LAYOUT_DIR}/{shard_path}.bin"


def split_name(name: str) -> tuple[str, str] | None:
    """``"dir/key.ext.gz"`` -> ``("dir/key", "ext.gz")``, the WebDataset way; None without an extension."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1:
        return (name[:dot], name[dot + 1 :]) if dot < len(name) - 1 else None
    match = _WDS_SPLIT.match(name)  # a basename starting with a dot: do exactly what webdataset does
    return (match.group(1), match.group(2)) if match and match.group(2) else None


def unsafe_reason(name: str) -> str | None:
    """Why a member name must not be used (absolute, ``..``, empty component, NUL), or None."""
    if not name:
        return "it is empty"
    if "\0" in name:
        return "it contains a NUL byte"
    if name.startswith("/"):
        return "it is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "it has a '..' component"
    if any(p in ("", ".") for p in parts):
        return "it has an empty or '.' path component"
    return None


def shard_path_problem(path: Any) -> str | None:
    """Why ``path`` may not name an object below the dataset root, or None.

    A plain relative name: a string of 1-1024 characters, ``/``-separated segments, none empty,
    ``.`` or ``..``, not absolute, no URL scheme or drive (``s3:``, ``C:``, ``a::b``), no
    backslash, NUL or control character. It refuses what can leave the root on some backend and
    nothing else: foreign WebDataset shards carry all sorts of names, so it is not an allow-list.
    """
    if not isinstance(path, str):
        return f"it is a {type(path).__name__}, not a string"
    if not 0 < len(path) <= MAX_PATH_CHARS:
        return f"its length {len(path)} is outside 1..{MAX_PATH_CHARS}"
    if "\\" in path:
        return "it has a backslash"
    if "::" in path or _SCHEME.match(path):
        return "it starts with a URL scheme or a drive"
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        return "it has a control character"
    return unsafe_reason(path)
