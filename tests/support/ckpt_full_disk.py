"""Saves onto a filesystem that fills up: the child of test_checkpoint_failed_save.py's ENOSPC test.

    unshare -m sh -c 'mount -t tmpfs -o size=8m tmpfs DIR && exec python tests/support/ckpt_full_disk.py DIR'

With ``KeepLast(1)`` a 3 MiB state needs 6 MiB while a save commits. Step 1 is saved, a 2 MiB
file then leaves too little room for step 2, which fails part-way (ENOSPC); the file is removed
and steps 3 and 4 are saved. Prints one JSON object: what step 2's failure said, the bytes in use
before and after it, the objects and directories under the root after it and at the end, and
whether steps 3 and 4 were saved.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions
from streamio.storage import Store

STATE_FLOATS = 768 << 10  # 3 MiB
FILLER = 2 << 20


def used(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def tree(root: str) -> list[str]:
    """Every directory and file below ``root``, relative."""
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def main(mount: str) -> dict[str, Any]:
    root = os.path.join(mount, "ckpt")
    ckpt = CheckpointManager(root, retention=KeepLast(1), async_save=False,
                             options=SaveOptions(part_size=512 << 10, concurrency=2))
    ckpt.save(1, {"w": torch.randn(STATE_FLOATS)})
    filler = os.path.join(mount, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * FILLER)
    out: dict[str, Any] = {"before": used(mount)}
    try:
        ckpt.save(2, {"w": torch.randn(STATE_FLOATS)})
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["after"] = used(mount)
    out["objects_after"] = [o.path for o in Store(root).list()]
    out["tree_after"] = tree(root)
    os.remove(filler)
    out["later"] = []
    for step in (3, 4):
        try:
            ckpt.save(step, {"w": torch.randn(STATE_FLOATS)})
            out["later"].append(step)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out[f"error_{step}"] = f"{type(exc).__name__}: {exc}"
    out["tree_end"] = tree(root)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
