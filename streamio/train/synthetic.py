"""The bundled demo dataset: a deterministic, learnable synthetic classification task.

No download and no file to ship: the same ``seed`` gives the same bytes on every machine (NumPy's
``default_rng`` with a structured seed: a tuple, not arithmetic). Each sample is a 32-dimensional point from one of
8 overlapping Gaussian clusters pushed through a fixed random nonlinearity, so a small MLP's loss
starts at ``ln 8 = 2.08`` and visibly falls, without reaching zero in a few hundred steps.

Two views of the same data:

* :func:`make_arrays` -> ``(x, y)`` arrays, for training straight from memory;
* :func:`iter_samples` -> WebDataset-style sample dicts (``{"__key__", "npy", "cls"}``) for
  ``streamio.data.write.writer.write_dataset``, i.e. what the demo shards into object storage.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np

from streamio.errors import ConfigError

DIM = 32
NUM_CLASSES = 8
_SPLITS = {"train": 1, "val": 2}


def make_arrays(n: int, *, seed: int = 0, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``split`` as ``(x float32 [n, DIM], y int64 [n])``, deterministic in ``seed``.

    Raises:
        ValueError: ``split`` is not ``train`` or ``val``.
    """
    if split not in _SPLITS:
        raise ConfigError(f"split {split!r} is not one of {sorted(_SPLITS)}")
    task = np.random.default_rng([seed, 0xDA7A])  # the task itself: same for both splits
    centers = task.normal(0.0, 1.0, (NUM_CLASSES, DIM))
    mix = task.normal(0.0, 1.0 / np.sqrt(DIM), (DIM, DIM))
    draw = np.random.default_rng([seed, _SPLITS[split]])
    y = draw.integers(0, NUM_CLASSES, n)
    z = centers[y] + draw.normal(0.0, 1.1, (n, DIM))
    x = np.tanh(z @ mix) * 2.0
    return x.astype(np.float32), y.astype(np.int64)


def encode_npy(array: np.ndarray) -> bytes:
    """``array`` as ``.npy`` bytes (read back with ``allow_pickle=False``)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def iter_samples(n: int, *, seed: int = 0, split: str = "train") -> Iterator[dict[str, object]]:
    """The same samples as :func:`make_arrays`, as WebDataset sample dicts ``{"__key__", "npy", "cls"}``."""
    x, y = make_arrays(n, seed=seed, split=split)
    for i in range(n):
        yield {"__key__": f"{split}-{i:07d}", "npy": encode_npy(x[i]), "cls": str(int(y[i])).encode()}
