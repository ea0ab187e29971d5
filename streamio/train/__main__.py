"""``python -m streamio.train``: one rank of the reference trainer (launch several with torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m streamio.train \\
        --ckpt-url s3://bucket/ckpt --ckpt-every 20

Each rank ends with ``destroy_process_group()``, flushes its output and leaves with ``os._exit``:
after DDP has run, a normal interpreter exit sometimes aborts a rank ("terminate called without an
active exception"), which would turn a finished run into a failed one (docs/design.md "Measured behaviour").
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from streamio.distributed import leave, rank_and_world
from streamio.storage.secrets import guard_handlers
from streamio.train.config import parse_args
from streamio.train.distributed import setup_distributed, teardown_distributed
from streamio.train.loop import Trainer

log = logging.getLogger("streamio.train")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; return its exit status."""
    cfg = parse_args(argv)
    rank, _ = rank_and_world()
    logging.basicConfig(
        level=logging.WARNING,  # third-party INFO (botocore's "Found credentials ...") stays quiet
        stream=sys.stdout,
        format=f"[rank {rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("streamio").setLevel(logging.INFO)
    guard_handlers()
    d = setup_distributed(cfg)
    try:
        trainer = Trainer(cfg, d)
        try:
            trainer.run()
        finally:
            trainer.close()
    except Exception:
        log.exception("rank %d failed", d.rank)
        return 1
    finally:
        teardown_distributed(d)
    return 0


if __name__ == "__main__":
    leave(main())
