"""glibc ``malloc`` settings for DataLoader worker processes: keep freed sample memory for reuse.

A worker allocates and frees a sample's worth of memory for every sample (read chunks, member
``bytes``); with glibc's defaults the freed memory above 128 KiB at the top of the heap is given
back to the kernel at once and faulted in again, zeroed, for the next sample: measured on 2 CPUs,
~170,000 page faults and 0.4-0.6 CPU-seconds per delivered GB (a third of the reader's cost).
:func:`tune_worker_malloc` raises the trim and mmap thresholds so that memory stays with the
process and is reused: page faults fall to a few thousand per GB. The worker's resident memory
then stays at its peak (bounded by the prefetch budget and the shuffle window) instead of
oscillating below it.

Applied only inside DataLoader workers, which exist to run the dataset; the training process's
allocator is left as the user configured it. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["tune_worker_malloc"]

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # allocations below this come from the (reused) heap, not a fresh mmap
TRIM_THRESHOLD = 256 << 20  # free memory kept at the top of a heap before it is given back

_tuned_in: int | None = None  # the pid that applied the settings (a forked child must apply its own)


def tune_worker_malloc() -> bool:
    """Apply the settings above to this process once; True if they are in effect."""
    global _tuned_in
    if _tuned_in == os.getpid():
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.debug("mallopt refused the worker allocator settings; keeping the defaults")
        return False
    _tuned_in = os.getpid()
    return True
