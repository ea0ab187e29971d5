"""The ``.npy`` member format, read as untrusted input: its header parsed and checked, its payload never unpickled.

A shard's ``.npy`` member is ``\\x93NUMPY``, a version, a header length, a header (a Python
literal ``{'descr': ..., 'fortran_order': ..., 'shape': ...}``) and the payload. ``numpy.load``
trusts the header: it allocates the declared shape before it reads (a 100-byte member declaring
``(10**14,)`` raises ``MemoryError``), and an unknown ``descr`` raises ``TypeError``. Here the
header is parsed within :data:`MAX_HEADER` bytes (``ast.literal_eval``, as numpy does), every
field is checked, and the declared size must be exactly the payload held, before any array exists:

* ``descr`` is a dtype numpy knows, with no Python objects in it (they would need a pickle);
* ``shape`` is a tuple of at most :data:`MAX_DIMS` integers >= 0, ``fortran_order`` a bool;
* ``prod(shape) * itemsize`` equals the bytes after the header.

The array is then a read-only view of the member's bytes (:func:`parse`; an empty one is made
empty), so nothing is allocated on the header's word. Every refusal is a
:class:`~streamio.errors.ShardFormatError` saying what is wrong with the member; it cannot know
which member it is, so the callers (the decoder, the token packer) raise it again naming the
shard, sample and member.
"""

from __future__ import annotations

import ast
import math
import struct
from typing import Any, NamedTuple

import numpy as np

from streamio.errors import ShardFormatError

__all__ = ["MAX_DIMS", "MAX_HEADER", "NpyHeader", "parse", "read_header"]

#: Most bytes of a header (numpy writes 64 to a few hundred; its own reader's limit is 10,000).
MAX_HEADER = 16 * 1024
#: Most dimensions a shape may have (numpy's own limit).
MAX_DIMS = 32
_MAGIC = b"\x93NUMPY"
_KEYS = {"descr", "fortran_order", "shape"}


class NpyHeader(NamedTuple):
    """A checked ``.npy`` header: the payload starts at ``start`` and holds exactly ``count`` items."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    start: int

    @property
    def count(self) -> int:
        """Items the shape declares."""
        return math.prod(self.shape)


def _length(raw: bytes) -> tuple[int, int, str]:
    """``(header length, where it starts, its encoding)`` from the magic and version."""
    if len(raw) < 10 or raw[:6] != _MAGIC:
        raise ShardFormatError(f"it does not start with the .npy magic {_MAGIC!r} and a version: {raw[:10]!r}")
    major, minor = raw[6], raw[7]
    if (major, minor) == (1, 0):
        return struct.unpack_from("<H", raw, 8)[0], 10, "latin1"
    if (major, minor) in ((2, 0), (3, 0)) and len(raw) >= 12:
        return struct.unpack_from("<I", raw, 8)[0], 12, "latin1" if major == 2 else "utf8"
    raise ShardFormatError(f".npy version {major}.{minor} is not 1.0, 2.0 or 3.0 (or the member ends in its preamble)")


def _literal(text: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ShardFormatError(f"its header is not a Python literal: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, dict) or set(value) != _KEYS:
        keys = sorted(map(repr, value)) if isinstance(value, dict) else type(value).__name__
        raise ShardFormatError(f"its header is {keys}, not a dict of exactly 'descr', 'fortran_order' and 'shape'")
    return value


def _dtype(descr: Any) -> np.dtype[Any]:
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        raise ShardFormatError(f"its descr {_short(descr)} is not a numpy dtype ({type(exc).__name__}: {exc})") from exc
    if dtype.hasobject:
        raise ShardFormatError(f"its dtype {dtype} holds Python objects: they need a pickle, and none is unpickled")
    return dtype


def read_header(raw: bytes) -> NpyHeader:
    """The checked header of the ``.npy`` bytes ``raw`` (which may be only the member's first bytes).

    Raises:
        ShardFormatError: no magic, an unknown version, a header over :data:`MAX_HEADER` bytes or cut off,
            not a literal dict of the three keys, an unknown or object dtype, a shape that is not
            a tuple of at most :data:`MAX_DIMS` integers >= 0.
    """
    size, start, encoding = _length(raw)
    if size > MAX_HEADER:
        raise ShardFormatError(f"its header declares {size} bytes, more than the {MAX_HEADER} a .npy header may have")
    if len(raw) < start + size:
        raise ShardFormatError(f"it ends inside its {size}-byte header (it holds {len(raw)} bytes)")
    try:
        text = raw[start : start + size].decode(encoding)
    except UnicodeDecodeError as exc:
        raise ShardFormatError(f"its header is not {encoding} text: {exc}") from exc
    fields = _literal(text)
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not isinstance(fortran, bool):
        raise ShardFormatError(f"its fortran_order is {_short(fortran)}, not True or False")
    if (
        not isinstance(shape, tuple) or len(shape) > MAX_DIMS
        or not all(type(n) is int and n >= 0 for n in shape)
    ):
        raise ShardFormatError(f"its shape {_short(shape)} is not a tuple of at most {MAX_DIMS} integers >= 0")
    return NpyHeader(_dtype(fields["descr"]), shape, fortran, start + size)


def parse(raw: bytes) -> np.ndarray:
    """The array of the ``.npy`` member ``raw``: a read-only view of its bytes, after :func:`read_header`.

    Raises:
        ShardFormatError: a header :func:`read_header` refuses, or a declared size that is not the payload held.
    """
    head = read_header(raw)
    declared, held = head.count * head.dtype.itemsize, len(raw) - head.start
    if declared != held:
        raise ShardFormatError(
            f"its header declares {_short(declared)} bytes of {head.dtype} {_short(head.shape)}, it holds {held}: "
            f"the member is damaged or hostile"
        )
    if head.count and not head.dtype.itemsize:
        raise ShardFormatError(f"its dtype {head.dtype} has items of 0 bytes: {_short(head.count)} of them hold none")
    order = "F" if head.fortran_order else "C"
    try:
        if not head.count:  # nothing to view (numpy cannot view items of 0 bytes): an empty array costs nothing
            return np.empty(head.shape, dtype=head.dtype, order=order)
        flat = np.frombuffer(raw, dtype=head.dtype, count=head.count, offset=head.start)
        return flat.reshape(head.shape, order=order)
    except ValueError as exc:
        raise ShardFormatError(f"numpy cannot make {head.dtype} {_short(head.shape)} of it: {exc}") from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"
