"""fsspec's in-process ``memory://`` filesystem: conditional puts under one process-wide lock.

The filesystem is a dict shared by every instance in the process, so one lock around compare +
write makes create-only and compare-and-swap exact among the threads of this process (the only
ones that can see it). Version: CRC32C of the content plus its length (the filesystem keeps no
generation of its own).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from streamio.checksum import crc32c
from streamio.storage.backends.base import PutRequest, conflict
from streamio.storage.backends.generic import GenericBackend

_LOCK = threading.Lock()


def memory_version(data: bytes) -> str:
    """The version token of an in-memory object: ``crc32c-length``."""
    return f"{crc32c(data):08x}-{len(data)}"


class MemoryBackend(GenericBackend):
    """``memory://`` (see the module docstring)."""

    def version_of(self, entry: Mapping[str, Any]) -> str | None:
        return memory_version(self.fs.cat_file(entry["name"]))

    def put(self, full: str, url: str, data: memoryview, request: PutRequest) -> str:
        with _LOCK:
            try:
                found: str | None = memory_version(self.fs.cat_file(full))
            except FileNotFoundError:
                found = None
            if request.mode == "create" and found is not None:
                raise conflict(url, None, found)
            if request.if_match is not None and found != request.if_match:
                raise conflict(url, request.if_match, found)
            content = bytes(data)
            self.fs.pipe_file(full, content)
            return memory_version(content)
