"""Keyed permutations: the same on every machine, process and numpy version.

A permutation of ``range(n)`` is keyed by a tuple of ints (``(seed, epoch, TAG_SHARDS)`` for the
shard order, ``(seed, epoch, TAG_WINDOW, stage, rank, worker, window)`` for a shuffle window). Sort
keys are SplitMix64 outputs of a counter seeded by BLAKE2b of the key tuple, computed in our own
numpy uint64 arithmetic, so no numpy release can change them (``Generator.permutation``'s stream
may change between releases, which would silently break saved resume states); no ``hash()`` is
involved. The low bits of each sort key carry the index, which makes every key distinct, so any
sort algorithm gives the same order. A 4,096-element permutation costs ~0.1 ms.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["TAG_REST", "TAG_ROUNDS", "TAG_SHARDS", "TAG_WINDOW", "permutation", "permutations"]

TAG_SHARDS = 1  # domain-separation tags inside permutation keys
TAG_WINDOW = 2
TAG_ROUNDS = 3
TAG_REST = 4

_I64 = np.int64
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _key_hash(key: Sequence[int]) -> int:
    """BLAKE2b (8 bytes, little endian) of the key tuple's ``repr``: the SplitMix64 seed."""
    digest = hashlib.blake2b(repr(tuple(int(k) for k in key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def permutations(keys: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """One uniform permutation of ``range(n)`` per int tuple in ``keys`` (one row each).

    Vectorised over rows, so re-planning thousands of workers' windows costs a few array
    operations.
    """
    rows = len(keys)
    if n <= 1:
        return np.zeros((rows, n), dtype=_I64)
    bases = np.array([_key_hash(key) for key in keys], dtype=np.uint64)
    x = np.arange(1, n + 1, dtype=np.uint64)[None, :] * _GOLDEN + bases[:, None]  # uint64 arrays wrap silently
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    shift = np.uint64((n - 1).bit_length())
    x = ((x >> shift) << shift) | np.arange(n, dtype=np.uint64)[None, :]
    x.sort(axis=1)
    return (x & ((np.uint64(1) << shift) - np.uint64(1))).astype(_I64)


def permutation(key: Sequence[int], n: int) -> np.ndarray:
    """A uniform permutation of ``range(n)`` keyed by the int tuple ``key`` (see :func:`permutations`)."""
    if n <= 1:
        return np.arange(n, dtype=_I64)
    perm: np.ndarray = permutations([key], n)[0]
    return perm
