"""Token documents: a sample's 1-D integer ``.npy`` member, and its token count read from the header.

A token data set (docs/design.md "Token packing") is one whose samples are documents, each one
1-D array of token ids stored as ``.npy`` (little-endian uint16, uint32, int32 or int64). The
writer records each document's token count in the index (``shards[].tokens``) so that a packing
plan never opens a shard to count; this module reads that count from the member's header alone
(at most :data:`NPY_HEAD` bytes, the header bounded by numpy's ``max_header_size``), and checks a
decoded document against the count the index declared, naming the shard and sample.

Anything else (a 2-D array, floats, a big-endian or object dtype, a pickle, a truncated header) is
simply not a token document: :func:`npy_tokens` returns None, and no count is recorded for it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping

import numpy as np

from streamio.data.format import npy
from streamio.errors import ShardFormatError

__all__ = ["NPY_HEAD", "TOKEN_DTYPES", "check_document", "load_tokens", "npy_tokens", "token_fields"]

#: Bytes of a member read to find its header (numpy writes headers of 64 to a few hundred bytes).
NPY_HEAD = 16 * 1024
#: The token types a document may be stored as.
TOKEN_DTYPES = (np.dtype("<u2"), np.dtype("<u4"), np.dtype("<i4"), np.dtype("<i8"))


def npy_tokens(head: bytes, size: int) -> int | None:
    """Tokens in a ``.npy`` member of ``size`` bytes whose first bytes are ``head``; None if it is no token document.

    The count is the header's shape, and only when the payload is exactly that many items: a
    header that does not match the member's size is not a token document either.
    """
    try:
        found = npy.read_header(head)
    except ShardFormatError:
        return None
    if found.dtype not in TOKEN_DTYPES or len(found.shape) != 1:  # a 1-D array reads the same in either order
        return None
    if found.start + found.count * found.dtype.itemsize != size:
        return None
    return found.count


# what numpy writes for a 1-D array (``np.save``); anything else takes the checked parser of npy.py
_PLAIN_HEADER = re.compile(
    rb"\{'descr': '([<|][uif][1248])', 'fortran_order': (?:False|True), 'shape': \((\d+),\), \} *\n"
)


def load_tokens(raw: bytes) -> np.ndarray:
    """A ``.npy`` member's array, read-only, without copying its payload when numpy wrote a 1-D header.

    The common header is matched directly (numpy's reader evaluates it as Python literals: half
    the cost of a small document); any other goes through :func:`streamio.data.format.npy.parse`.

    Raises:
        ShardFormatError: not a ``.npy`` :func:`streamio.data.format.npy.parse` accepts (the caller names the
            shard and sample).
    """
    if raw[:6] == b"\x93NUMPY" and len(raw) >= 10:
        major = raw[6]
        size, start = (struct.unpack_from("<H", raw, 8)[0], 10) if major == 1 else (0, 0)
        if major in (2, 3) and len(raw) >= 12:
            size, start = struct.unpack_from("<I", raw, 8)[0], 12
        found = _PLAIN_HEADER.fullmatch(raw[start : start + size]) if 0 < size <= NPY_HEAD else None
        if found is not None:
            dtype, count = np.dtype(found.group(1).decode()), int(found.group(2))
            if start + size + count * dtype.itemsize == len(raw):
                return np.frombuffer(raw, dtype=dtype, count=count, offset=start + size)
    return npy.parse(raw)


def token_fields(members: Mapping[str, tuple[bytes, int]]) -> dict[str, int]:
    """The token count of each member (by field) that is a token document; ``members`` maps field to (head, size)."""
    out = {}
    for ext, (head, size) in members.items():
        if ext == "npy" or ext.endswith(".npy"):
            count = npy_tokens(head, size)
            if count is not None:
                out[ext] = count
    return out


def check_document(value: object, *, expected: int, shard: str, sample: int, member: str) -> np.ndarray:
    """``value`` (a decoded member) as a 1-D token array of ``expected`` tokens, or a :class:`ShardFormatError`.

    Raises:
        ShardFormatError: not a 1-D integer array, a uint64 one, or not as long as the index says; names the
            shard and sample.
    """
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
        got = f"{value.dtype}{value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ShardFormatError(
            f"shard {shard!r} sample {sample}: member {member!r} is {got}, not a 1-D integer token array; "
            f"give Pack(member=...) the field that holds each document's tokens"
        )
    if value.dtype.kind == "u" and value.dtype.itemsize == 8:
        raise ShardFormatError(
            f"shard {shard!r} sample {sample}: member {member!r} is uint64, whose ids above 2**63 - 1 would wrap "
            f"negative in the int64 sequences; store token ids as uint16, uint32, int32 or int64"
        )
    if len(value) != expected:
        raise ShardFormatError(
            f"shard {shard!r} sample {sample}: member {member!r} holds {len(value)} tokens, but the index says "
            f"{expected}; the index does not describe this shard: rebuild it (`streamio shard` again)"
        )
    return value
