"""Raw tensor bytes: host snapshot, byte layout, parts, and reading tensors back verified.

Tensor bytes are copied into one reused host buffer per manager (:class:`HostBuffer`, pinned
when any tensor lives on CUDA), laid out 64-byte aligned; that copy is all the training loop
waits for. The buffer is then cut into parts (optionally zstd-compressed) by the uploader. On
restore every part is checked against its recorded size and CRC32C (:func:`verify_file`),
decompressed into at most the raw size the manifest declares (:func:`decode_part`), and tensors
are read out of the parts as :class:`~.copies.VerifiedTensor` views (:class:`StreamReader`).
A save's checksums (part, block, tensor) are combined from one pass over the bytes (:mod:`.crcs`).

The JSON half of a state (trees with tensor references) is :mod:`.tree`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from streamio.checkpoint.format.entries import FileEntry, TensorEntry
from streamio.checkpoint.tensors.copies import VerifiedTensor
from streamio.checkpoint.tensors.tree import dtype_from_name, dtype_name
from streamio.checksum import crc32c, format_checksum
from streamio.errors import CheckpointFormatError, ConfigError, CorruptDataError
from streamio.limits import zstd_decompress

ALIGN = 64


# ------------------------------------------------------------------------------- byte layout
@dataclass(frozen=True)
class Slot:
    """Where one tensor goes in a rank's byte stream."""

    key: str
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """The 64-byte aligned placement of a set of tensors in one byte stream."""

    slots: tuple[Slot, ...]
    total: int


def plan_layout(tensors: Sequence[tuple[str, torch.Tensor]]) -> Layout:
    """Place tensors one after another, each starting on a 64-byte boundary."""
    slots, pos = [], 0
    for key, t in tensors:
        nbytes = t.numel() * t.element_size()
        slots.append(Slot(key, pos, nbytes, t.dtype, tuple(t.shape)))
        pos += -(-nbytes // ALIGN) * ALIGN
    return Layout(tuple(slots), pos)


def assign_shares(sizes: Mapping[str, int], world_size: int, *, rank0: Collection[str] = ()) -> dict[str, int]:
    """Deterministically divide tensors among ranks so each uploads about the same bytes.

    Greedy largest-first onto the least-loaded rank (ties: lowest rank; keys break size ties),
    so every rank computes the same assignment from the same (replicated) shapes. Keys in
    ``rank0`` are always rank 0's (e.g. module buffers, which DDP only keeps equal by
    broadcasting rank 0's at each forward).
    """
    load = [0] * world_size
    owner: dict[str, int] = {}
    for key in rank0:
        if key in sizes:
            owner[key] = 0
            load[0] += sizes[key]
    for key in sorted((k for k in sizes if k not in owner), key=lambda k: (-sizes[k], k)):
        r = min(range(world_size), key=lambda i: (load[i], i))
        owner[key] = r
        load[r] += sizes[key]
    return owner


class HostBuffer:
    """One host buffer reused across saves (pinned when tensors live on CUDA).

    The snapshot copies every tensor into its slot; that copy is what ``save`` blocks on. The
    buffer grows when a larger state arrives and is otherwise reused, so the first-touch cost of
    fresh memory is paid once, not on every save.
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def snapshot(self, layout: Layout, tensors: Mapping[str, torch.Tensor]) -> np.ndarray:
        """Copy ``tensors`` into the buffer per ``layout``; returns a uint8 view of the bytes."""
        cuda = any(t.is_cuda for t in tensors.values())
        pin = cuda and torch.cuda.is_available()
        if self._buf is None or self._buf.numel() < layout.total or (pin and not self._buf.is_pinned()):
            self._buf = None  # release before allocating the larger one
            self._buf = torch.empty(max(layout.total, 1), dtype=torch.uint8, pin_memory=pin)
        buf = self._buf
        with torch.no_grad():
            for slot in layout.slots:
                if slot.nbytes == 0:
                    continue
                src = tensors[slot.key]
                dst = buf[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)
                dst.copy_(src, non_blocking=pin)
        if cuda:
            torch.cuda.synchronize()
        return buf.numpy()[: layout.total]

    @property
    def nbytes(self) -> int:
        return 0 if self._buf is None else self._buf.numel()


def readonly(arr: np.ndarray) -> np.ndarray:
    """A read-only view (what the CRC32C extension accepts without copying)."""
    v = arr.view()
    v.flags.writeable = False
    return v


def tensor_entries(slots: Sequence[Slot], rank: int, crc: Callable[[int, int], int]) -> dict[str, TensorEntry]:
    """Manifest entries of ``slots`` in a snapshotted stream, each with the CRC32C that
    ``crc(offset, nbytes)`` gives of its bytes (combined from the save's one pass, :mod:`.crcs`)."""
    return {
        s.key: TensorEntry(rank=rank, offset=s.offset, nbytes=s.nbytes, dtype=dtype_name(s.dtype), shape=s.shape,
                           checksum=format_checksum(crc(s.offset, s.nbytes)))
        for s in slots
    }


def block_checksums(raw: np.ndarray, block_size: int) -> tuple[str, ...]:
    """CRC32C of each ``block_size`` bytes of a raw part (the last block may be shorter): what a
    ranged read of a few rows of the part is verified against (:mod:`.fetch`). A save combines the
    same values from its one pass (:mod:`.crcs`); this computes them directly, block by block."""
    view = readonly(raw)
    return tuple(format_checksum(crc32c(view[i : i + block_size])) for i in range(0, len(view), block_size))  # type: ignore[arg-type]


def encode_part(raw: np.ndarray, compression: str | None, level: int = 3) -> bytes | memoryview:
    """Stored bytes of one part (zero-copy when uncompressed); the caller takes their checksum."""
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=level).compress(readonly(raw))
    if compression is not None:
        raise ConfigError(f"unknown compression {compression!r}; use None or 'zstd'")
    return memoryview(raw)


def verify_file(data: bytes | memoryview, entry: FileEntry, url: str) -> None:
    """Raise :class:`CorruptDataError` unless ``data`` has the recorded size and checksum."""
    if len(data) != entry.size:
        raise CorruptDataError(
            f"{url} is {len(data)} bytes, the manifest says {entry.size}: the object is truncated or was replaced"
        )
    got = format_checksum(crc32c(data))
    if got != entry.checksum:
        raise CorruptDataError(f"{url} has checksum {got}, the manifest says {entry.checksum}: the object is corrupt")


def decode_part(data: bytes | memoryview, entry: FileEntry, url: str) -> bytes | memoryview:
    """Raw bytes of a verified part (decompressed if needed, size checked).

    Decompression is bounded by the ``raw_size`` the manifest declares (streamed, never sized by
    what the zstd frame header claims): a frame that declares or inflates to more is corrupt.
    """
    if entry.compression is None:
        raw = data
    elif entry.compression == "zstd":
        raw = zstd_decompress(data, limit=entry.raw_size, what=url, error=CorruptDataError)
    else:
        raise CheckpointFormatError(f"{url} uses compression {entry.compression!r}, unknown to this streamio")
    if len(raw) != entry.raw_size:
        raise CorruptDataError(f"{url} holds {len(raw)} raw bytes, the manifest says {entry.raw_size}")
    return raw


class StreamReader:
    """Reads tensors out of one rank's verified, decoded parts (``start -> raw bytes``)."""

    def __init__(self, parts: Mapping[int, bytes | memoryview], rank: int, url: str) -> None:
        self._starts = sorted(parts)
        self._parts = parts
        self._rank = rank
        self._url = url

    def segments(self, offset: int, nbytes: int) -> list[np.ndarray]:
        """The raw bytes ``[offset, offset + nbytes)`` as read-only views, one per part touched."""
        out, pos, end = [], offset, offset + nbytes
        for start in self._starts:
            data = self._parts[start]
            stop = start + len(data)
            if stop <= pos or start >= end:
                continue
            if start > pos:
                break
            arr = np.frombuffer(data, dtype=np.uint8)
            out.append(arr[pos - start : min(end, stop) - start])
            pos = min(end, stop)
            if pos == end:
                break
        if pos != end:
            raise CorruptDataError(
                f"rank {self._rank}'s parts under {self._url} do not cover bytes [{offset}, {end}): "
                f"a part is missing from the manifest"
            )
        return out

    def tensor(self, key: str, entry: TensorEntry, *, check: bool = True) -> VerifiedTensor:
        """``entry``'s bytes, CRC32C-checked (when ``check``), not yet copied anywhere."""
        dtype = dtype_from_name(entry.dtype)
        numel = math.prod(entry.shape)
        if numel * torch.empty((), dtype=dtype).element_size() != entry.nbytes:
            raise CheckpointFormatError(
                f"tensor {key!r} under {self._url} is {entry.nbytes} bytes, not {entry.dtype}{list(entry.shape)}"
            )
        segs = self.segments(entry.offset, entry.nbytes) if entry.nbytes else []
        if check:
            value = 0
            for s in segs:
                value = crc32c(s, value)  # type: ignore[arg-type]
            if format_checksum(value) != entry.checksum:
                raise CorruptDataError(
                    f"tensor {key!r} under {self._url} fails its checksum: the checkpoint is corrupt"
                )
        return VerifiedTensor(dtype, tuple(entry.shape), segs)
