"""``streamio ckpt verify``: every byte of a save checked, and the pointer against its manifest.

* :func:`verify_checkpoint` reads every file a manifest lists and checks every size and CRC32C,
  of the files and of every tensor (a restore checks files and tensor spans only);
* :func:`check_pointer` checks ``latest.json`` against the manifest it names;
* :func:`verify_targets`: which saves ``verify`` checks (a step, the pointer's, or all of them).

None of them is needed to save or restore. They read storage fresh and report what they find by
object URL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streamio.checkpoint import root
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.root import committed_saves, read_manifest, read_pointer, resolve_save
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError, CorruptDataError
from streamio.storage import Store

__all__ = ["VerifyTarget", "check_pointer", "verify_checkpoint", "verify_targets"]


@dataclass(frozen=True)
class VerifyTarget:
    """A save ``streamio ckpt verify`` checks.

    Attributes:
        step: its step.
        path: its save directory; ``None``: the one :func:`~..root.resolve_save` picks.
    """

    step: int
    path: str | None = None

    @property
    def directory(self) -> str:
        """The save directory as reports name it (the step's own when ``path`` is not given)."""
        return self.path or layout.step_dir(self.step)

    @property
    def suffixed(self) -> bool:
        """Whether it is a save of another timeline (a directory suffixed with its save id)."""
        return bool(self.path) and self.path != layout.step_dir(self.step)


def verify_targets(store: Store, step: int | None, *, all_steps: bool = False) -> tuple[list[VerifyTarget], list[str]]:
    """The saves ``verify`` checks, and the problems of the pointer found on the way.

    ``step`` alone: that step (its save :func:`~..root.resolve_save` picks). Else the pointer
    is checked (:func:`check_pointer`) and the save it names is the target if the pointer is
    sound; ``all_steps``: every committed save.

    Raises:
        CheckpointNotFoundError: ``step`` has no manifest, or the root holds no checkpoint and no
            pointer: there is nothing to check.
    """
    if step is not None and not all_steps:
        _require_step(store, step)
        return [VerifyTarget(step)], []
    pointed, problems = check_pointer(store)
    committed = committed_saves(store) if all_steps or pointed is None else []
    if pointed is None and not committed and not root.has_pointer(store):
        raise CheckpointNotFoundError(f"no checkpoint under {store.root_url}: {'; '.join(problems)}")
    if all_steps:
        return [VerifyTarget(c.step, c.path) for c in committed], problems
    return ([VerifyTarget(pointed)] if pointed is not None and not problems else []), problems


def _require_step(store: Store, step: int) -> None:
    """Raise CheckpointNotFoundError when ``step`` has no manifest: then there is nothing to check."""
    if not root.has_manifest(store, layout.step_dir(step)) and not any(s.step == step for s in committed_saves(store)):
        raise CheckpointNotFoundError(
            f"{store.url(layout.manifest_path(step))} does not exist: step {step} was never committed under "
            f"{store.root_url} or was deleted; `streamio ckpt ls {store.root_url}` lists the committed steps"
        )


def verify_checkpoint(
    store: Store, step: int, *, path: str | None = None, concurrency: int = 8,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[str]:
    """Every problem with a save of ``step`` (each naming the object at fault); empty when it verifies.

    Reads every file the manifest lists, checks sizes and CRC32C (and each block's, where parts
    carry block checksums: saves with sharded state), and every tensor's CRC32C.
    Files are read one after another: ``concurrency`` is not used yet (kept for its callers).

    Args:
        path: the save directory; default: the one :func:`~.root.resolve_save` picks.
        progress: ``progress(done, total, nbytes)``: files read of ``total`` and their bytes so far.
    """
    # torch (for the tensors' checks) is imported here, not at module level: `ckpt ls/gc/rm` and
    # the CLI's start-up stay free of it
    from streamio.checkpoint.tensors.fetch import verify_blocks
    from streamio.checkpoint.tensors.serialize import StreamReader, decode_part, verify_file

    sdir = path if path is not None else resolve_save(store, step)
    try:
        manifest = read_manifest(store, step, path=sdir)
    except CheckpointError as exc:
        return [str(exc)]
    problems: list[str] = []
    parts: dict[int, dict[int, bytes | memoryview]] = {}
    report = progress or (lambda done, total, nbytes: None)
    report(0, len(manifest.files), 0)
    nbytes = 0
    place = manifest.place(sdir)
    for done, f in enumerate(manifest.files, 1):
        url = store.url(place.path(f.rank, f.path))
        try:
            data = store.read_view(place.path(f.rank, f.path))
            verify_file(data, f, url)
            parts.setdefault(f.rank, {})[f.start] = raw = decode_part(data, f, url)
            if f.blocks:  # what ranged reads of sharded state are verified against
                verify_blocks(raw, f, 0, url)
        except FileNotFoundError:
            problems.append(f"{url} is missing")
        except CorruptDataError as exc:
            problems.append(str(exc))
        nbytes += f.size
        report(done, len(manifest.files), nbytes)
    if problems:
        return problems
    for section in [manifest.replicated, *manifest.per_rank]:
        for key, e in section.tensors.items():
            try:
                StreamReader(parts.get(e.rank, {}), e.rank, store.url(sdir)).tensor(key, e)
            except (CorruptDataError, CheckpointFormatError) as exc:
                problems.append(str(exc))
    return problems


def check_pointer(store: Store) -> tuple[int | None, list[str]]:
    """The step ``latest.json`` names and what is wrong with the pointer itself (if anything)."""
    url = root.pointer_url(store)
    try:
        pointer = read_pointer(store)
    except ManifestError as exc:
        return None, [f"{url} is corrupt: {exc}"]
    if pointer is None:
        return None, [f"{url} does not exist: no checkpoint was ever committed here (or it was deleted)"]
    manifest_url = store.url(layout.manifest_at(pointer.path))
    try:
        digest = root.manifest_digest(store, pointer.path)
    except FileNotFoundError:
        return pointer.step, [f"{url} names step {pointer.step} but {manifest_url} does not exist"]
    except ManifestError as exc:
        return pointer.step, [f"{url} names step {pointer.step} but its manifest is unusable: {exc}"]
    if digest != pointer.manifest_checksum:
        return pointer.step, [f"{url} names step {pointer.step} with manifest checksum {pointer.manifest_checksum}, "
                              f"but {manifest_url} has {digest}"]
    return pointer.step, []
