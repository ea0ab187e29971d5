"""Maintenance of a checkpoint root: the API behind ``streamio ckpt ls | inspect | verify | gc | rm``.

None of it is needed to save or restore; each function reads the root fresh and reports by object
URL (docs/checkpoint-lifecycle.md: timelines, bad saves, retention, what ``gc`` removes):

* :func:`list_saves` / :func:`inspect_save`: every committed save with its place on the
  timeline and flags; everything but the tensor bytes of one (``inventory``, ``describe``);
* :func:`list_tiers`: the same with a local tier beside the root: which saves are local,
  durable or both (``tiers``);
* :func:`verify_checkpoint` / :func:`check_pointer` / :func:`verify_targets`: every byte of a
  save checked, and the pointer against its manifest (``verify``);
* :func:`collect_garbage`: what no current checkpoint needs, deleted (``gc``);
* :func:`plan_removal` / :func:`remove`: every save of a step removed, never leaving the pointer
  dangling (``removal``);
* :func:`plan_requests`: a save's and a restore's requests and time bounds on paper, for a
  state size and world size (``requests``: ``streamio ckpt plan``);
* :func:`pointer_url`: where the pointer is, for messages.

Importing this package loads neither torch nor the training stack (``verify`` imports torch when
it checks tensors). The map of these modules: docs/design.md "Layout and the direction of
dependencies".
"""

from __future__ import annotations

from streamio.checkpoint.admin.gc import GarbageReport, collect_garbage
from streamio.checkpoint.admin.inventory import default_step, inspect_save, list_saves
from streamio.checkpoint.admin.removal import Removal, plan_removal, remove
from streamio.checkpoint.admin.requests import GCS, S3, Plan, StoreLimits, plan_requests
from streamio.checkpoint.admin.tiers import list_tiers
from streamio.checkpoint.admin.verify import VerifyTarget, check_pointer, verify_checkpoint, verify_targets
from streamio.checkpoint.root import pointer_url

__all__ = [
    "GCS",
    "S3",
    "Plan",
    "StoreLimits",
    "GarbageReport",
    "Removal",
    "VerifyTarget",
    "check_pointer",
    "collect_garbage",
    "default_step",
    "inspect_save",
    "list_saves",
    "list_tiers",
    "plan_removal",
    "plan_requests",
    "pointer_url",
    "remove",
    "verify_checkpoint",
    "verify_targets",
]
