"""Child process of tests/data/test_cache_refusals.py: reads a dataset through a cache the system refuses.

``python cache_refusals.py DATASET CACHE_DIR POLICY [FSIZE]``: with ``FSIZE`` the process caps the
size of the files it may write (RLIMIT_FSIZE) first; the test may also start it as another user.
Prints one JSON line: the sample keys read (sorted), the error (class and message) if the read
failed, and what the cache logged.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import warnings

warnings.simplefilter("ignore")

from streamio import CacheConfig, DatasetOptions, StreamingDataset  # noqa: E402


def main() -> None:
    url, cache, policy = sys.argv[1:4]
    if len(sys.argv) > 4:
        limit = int(sys.argv[4])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    os.environ.update(RANK="0", WORLD_SIZE="1")
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    logging.getLogger("streamio.data.cache").addHandler(Keep(logging.WARNING))
    options = DatasetOptions(cache=CacheConfig(cache, max_bytes=1 << 30, on_error=policy))  # type: ignore[arg-type]
    keys, error = [], None
    try:
        keys = sorted(s["__key__"] for s in StreamingDataset(url, shuffle=False, options=options))
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        error = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    print(json.dumps({"keys": keys, "error": error, "logged": logged}))


if __name__ == "__main__":
    main()
