"""``AsyncCheckpointIO``: Lightning's own background saves, with removals queued behind them.

Lightning's ``AsyncCheckpointIO`` wraps any plugin: ``save_checkpoint`` clones every tensor on the
caller's thread (what the training loop waits for) and hands the save to one writer thread; a
failed save is raised by the next save or by ``teardown`` at the end of ``fit``. Wrapping
:class:`~.plugin.CheckpointIO` needs nothing more, with one exception: Lightning runs
``remove_checkpoint`` at once on the caller's thread. ``ModelCheckpoint`` removes a path (top-k,
the previous ``last``) right after it *asked* for a later save, so the path's own save may still be
queued or running in the writer thread: the removal finds nothing or half a save, the save then
commits, and the checkpoint is left behind for good (with any plugin: Lightning's ``torch.save``
file reappears the same way). Here the removal is queued on the same writer thread, after every
save asked for before it, so a path is removed after its save, as in a synchronous run.

Call order, as Lightning drives it: ``save_checkpoint`` (queued) -> ``remove_checkpoint`` (queued
behind) -> ... -> ``teardown`` (waits for all; raises the first failure).
"""

from __future__ import annotations

from typing import Any

from streamio.lightning.requirement import require

__all__ = ["AsyncCheckpointIO"]

_LightningAsyncCheckpointIO: Any = require("lightning.pytorch.plugins.io").AsyncCheckpointIO


class AsyncCheckpointIO(_LightningAsyncCheckpointIO):  # type: ignore[misc]
    """``lightning.pytorch.plugins.io.AsyncCheckpointIO`` whose removals run after the saves before them.

    Example::

        trainer = L.Trainer(plugins=[AsyncCheckpointIO(CheckpointIO())], callbacks=[ModelCheckpoint(...)])

    Args:
        checkpoint_io: the plugin that saves (a :class:`~.plugin.CheckpointIO`, or any Lightning plugin).
    """

    def remove_checkpoint(self, path: Any) -> None:
        """Queue the removal of ``path`` behind the saves asked for before it.

        Raises:
            Exception: the failure of an earlier save or removal in the writer thread (as Lightning's
                ``save_checkpoint`` does); this removal's own failure is raised by the next call or
                ``teardown``.
        """
        self._ensure_setup()

        def remove() -> None:
            try:
                self.checkpoint_io.remove_checkpoint(path)
            except BaseException as exc:  # noqa: BLE001 - kept, and raised on the caller's thread, as Lightning does
                self._error = exc

        self._executor.submit(remove)
        if self._error:
            raise self._error
