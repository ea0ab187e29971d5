"""State dicts <-> raw tensor bytes + JSON, safe to load from an untrusted store.

Saving walks each state object's ``state_dict()`` tree. Tensors (and NumPy arrays) are pulled out
and replaced by references; everything else must be JSON-able through a small *tagged* encoding
(``{"$t": "tuple", "v": [...]}`` for tuples, ``"dict"`` items for non-string keys, ``"float"`` for
inf/nan, ``"bytes"`` as base64, ``torch.Size``, dtypes, devices, NumPy scalars, sets, and the
``_metadata`` of a module's ``OrderedDict``). Nothing is ever pickled, so loading runs no code
from storage: JSON is parsed, raw bytes are reinterpreted as a dtype named in the manifest and
checked against their CRC32C. A value that fits none of these raises
:class:`~streamio.errors.CheckpointError` naming its path, instead of being pickled silently.

Tensor bytes are copied into one reused host buffer per manager (:class:`HostBuffer`, pinned
when any tensor lives on CUDA), laid out 64-byte aligned; that copy is all the training loop
waits for. The buffer is then cut into parts (optionally zstd-compressed) by the uploader.

Restore decodes trees against a *template*, the live object's current ``state_dict()``: where
the template holds a tensor of the same shape and dtype the bytes are copied into it in place,
so e.g. a model's parameters and an optimizer's existing moments are overwritten, not replaced.
"""

from __future__ import annotations

import base64
import math
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from streamio.checkpoint.manifest import FileEntry, TensorEntry
from streamio.checksum import crc32c, format_checksum
from streamio.errors import CheckpointError, CheckpointFormatError, CorruptDataError

TAG = "$t"
ALIGN = 64

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in vars(torch).values()
    if isinstance(d, torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; :class:`CheckpointFormatError` for an unknown name."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise CheckpointFormatError(f"unknown tensor dtype {name!r} in the manifest: written by a newer torch/streamio?") from None


# ------------------------------------------------------------------------------- tree encoding
class TreeEncoder:
    """Encodes state trees to JSON-able values, collecting tensors under unique keys.

    Args:
        tensors: the dict that receives ``key -> tensor`` (shared across several encodes).
    """

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None) -> None:
        self.tensors: dict[str, torch.Tensor] = {} if tensors is None else tensors

    def encode(self, value: Any, path: str) -> Any:
        """JSON-able form of ``value``; ``path`` names it in keys and error messages."""
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            return {TAG: "float", "v": repr(value)}
        if isinstance(value, torch.Tensor):
            return {TAG: "tensor", "k": self._add(path, value)}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise CheckpointError(f"cannot save {path!r}: a NumPy array of Python objects; convert it to numbers or a list")
            return {TAG: "ndarray", "k": self._add(path, torch.from_numpy(np.ascontiguousarray(value)).clone())}
        if isinstance(value, np.generic):
            return {TAG: "npscalar", "dtype": str(value.dtype), "v": self.encode(value.item(), path)}
        if isinstance(value, torch.Size):
            return {TAG: "size", "v": list(value)}
        if isinstance(value, torch.dtype):
            return {TAG: "dtype", "v": dtype_name(value)}
        if isinstance(value, torch.device):
            return {TAG: "device", "v": str(value)}
        if isinstance(value, (bytes, bytearray)):
            return {TAG: "bytes", "v": base64.b64encode(bytes(value)).decode()}
        if isinstance(value, Mapping):
            return self._encode_mapping(value, path)
        if isinstance(value, tuple):
            return {TAG: "tuple", "v": [self.encode(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, (set, frozenset)):
            return {TAG: "set", "v": [self.encode(v, f"{path}/{i}") for i, v in enumerate(sorted(value, key=repr))]}
        raise CheckpointError(
            f"cannot save {path!r} of type {type(value).__name__}: checkpoint state must be tensors, arrays or "
            f"JSON-like values (nothing is pickled); give the object a state_dict() returning such values"
        )

    def _encode_mapping(self, value: Mapping[Any, Any], path: str) -> Any:
        plain = all(isinstance(k, str) for k in value) and TAG not in value
        meta = getattr(value, "_metadata", None) if isinstance(value, OrderedDict) else None
        if plain and meta is None:
            return {k: self.encode(v, f"{path}/{k}") for k, v in value.items()}
        doc: dict[str, Any] = {
            TAG: "dict",
            "items": [[self.encode(k, f"{path}/<key>"), self.encode(v, f"{path}/{k}")] for k, v in value.items()],
        }
        if meta is not None:
            doc["meta"] = self.encode(meta, f"{path}/<metadata>")
        return doc

    def _add(self, path: str, tensor: torch.Tensor) -> str:
        key, n = path, 1
        while key in self.tensors:
            n += 1
            key = f"{path}~{n}"
        self.tensors[key] = tensor.detach()
        return key


def decode_tree(
    tree: Any, tensors: Mapping[str, Any], template: Any = None, *, path: str = "",
    defer: list[tuple[VerifiedTensor, torch.Tensor]] | None = None,
) -> Any:
    """Inverse of :meth:`TreeEncoder.encode`.

    Args:
        tree: the JSON-able form.
        tensors: key -> :class:`VerifiedTensor` (or a CPU tensor).
        template: the live value at the same place, if any: a tensor of the same shape and dtype
            receives the loaded bytes in place and is returned instead of the loaded one.
        path: for error messages.
        defer: if given, in-place copies are appended here as ``(source, target)`` instead of
            being made (the caller runs them in parallel, see :func:`run_copies`).

    Raises:
        CheckpointFormatError: an unknown tag or a reference to a tensor that is not there.
    """
    if isinstance(tree, list):
        tpl = template if isinstance(template, (list, tuple)) else ()
        return [decode_tree(v, tensors, tpl[i] if i < len(tpl) else None, path=f"{path}/{i}", defer=defer) for i, v in enumerate(tree)]
    if not isinstance(tree, dict):
        return tree
    tag = tree.get(TAG)
    if tag is None:
        tpl = template if isinstance(template, Mapping) else {}
        return {k: decode_tree(v, tensors, tpl.get(k), path=f"{path}/{k}", defer=defer) for k, v in tree.items()}
    if tag in ("tensor", "ndarray"):
        key = tree.get("k")
        if key not in tensors:
            raise CheckpointFormatError(f"{path!r} refers to tensor {key!r} which the manifest does not list")
        loaded = tensors[key]
        if not isinstance(loaded, VerifiedTensor):
            loaded = VerifiedTensor(loaded.dtype, tuple(loaded.shape), [loaded.contiguous().view(-1).view(torch.uint8).numpy()] if loaded.numel() else [])
        if tag == "ndarray":
            return loaded.materialize().numpy()
        if (
            isinstance(template, torch.Tensor)
            and template.shape == loaded.shape
            and template.dtype == loaded.dtype
            and not template.is_inference()
        ):
            if defer is not None:
                defer.append((loaded, template.detach()))
            else:
                loaded.copy_into(template.detach())
            return template
        return loaded.materialize()
    if tag == "float":
        return float(tree["v"])
    if tag == "tuple":
        tpl = template if isinstance(template, (list, tuple)) else ()
        return tuple(decode_tree(v, tensors, tpl[i] if i < len(tpl) else None, path=f"{path}/{i}", defer=defer) for i, v in enumerate(tree["v"]))
    if tag == "dict":
        tpl = template if isinstance(template, Mapping) else {}
        out: dict[Any, Any] = OrderedDict() if "meta" in tree else {}
        for k_tree, v_tree in tree["items"]:
            k = decode_tree(k_tree, tensors, path=f"{path}/<key>")
            out[k] = decode_tree(v_tree, tensors, tpl.get(k) if _hashable(k) else None, path=f"{path}/{k}", defer=defer)
        if "meta" in tree:
            out._metadata = decode_tree(tree["meta"], tensors, path=f"{path}/<metadata>")  # type: ignore[attr-defined]
        return out
    if tag == "npscalar":
        return np.dtype(tree["dtype"]).type(decode_tree(tree["v"], tensors))
    if tag == "size":
        return torch.Size(tree["v"])
    if tag == "dtype":
        return dtype_from_name(tree["v"])
    if tag == "device":
        return torch.device(tree["v"])
    if tag == "bytes":
        return base64.b64decode(tree["v"])
    if tag == "set":
        return {decode_tree(v, tensors, path=path) for v in tree["v"]}
    raise CheckpointFormatError(f"unknown tag {tag!r} at {path!r} in the checkpoint: written by a newer streamio?")


def _hashable(k: Any) -> bool:
    try:
        hash(k)
    except TypeError:
        return False
    return True


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


def tensor_entries(layout: Layout, stream: np.ndarray, rank: int) -> dict[str, TensorEntry]:
    """Manifest entries (with CRC32C of each tensor's bytes) for a snapshotted stream."""
    return {
        s.key: TensorEntry(
            rank=rank,
            offset=s.offset,
            nbytes=s.nbytes,
            dtype=dtype_name(s.dtype),
            shape=s.shape,
            checksum=format_checksum(crc32c(readonly(stream[s.offset : s.offset + s.nbytes]))),  # type: ignore[arg-type]
        )
        for s in layout.slots
    }


def encode_part(raw: np.ndarray, compression: str | None, level: int = 3) -> tuple[bytes | memoryview, str]:
    """Stored bytes of one part and their checksum (zero-copy when uncompressed)."""
    if compression == "zstd":
        import zstandard

        data: bytes | memoryview = zstandard.ZstdCompressor(level=level).compress(readonly(raw))
        return data, format_checksum(crc32c(data))  # type: ignore[arg-type]
    if compression is not None:
        raise ValueError(f"unknown compression {compression!r}; use None or 'zstd'")
    return memoryview(raw), format_checksum(crc32c(readonly(raw)))  # type: ignore[arg-type]


def verify_file(data: bytes | memoryview, entry: FileEntry, url: str) -> None:
    """Raise :class:`CorruptDataError` unless ``data`` has the recorded size and checksum."""
    if len(data) != entry.size:
        raise CorruptDataError(f"{url} is {len(data)} bytes, the manifest says {entry.size}: the object is truncated or was replaced")
    got = format_checksum(crc32c(data))
    if got != entry.checksum:
        raise CorruptDataError(f"{url} has checksum {got}, the manifest says {entry.checksum}: the object is corrupt")


def decode_part(data: bytes | memoryview, entry: FileEntry, url: str) -> bytes | memoryview:
    """Raw bytes of a verified part (decompressed if needed, size checked)."""
    if entry.compression is None:
        raw = data
    elif entry.compression == "zstd":
        import zstandard

        try:
            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=entry.raw_size)
        except zstandard.ZstdError as exc:
            raise CorruptDataError(f"{url} does not decompress ({exc})") from exc
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
            raise CorruptDataError(f"rank {self._rank}'s parts under {self._url} do not cover bytes [{offset}, {end}): a part is missing from the manifest")
        return out

    def tensor(self, key: str, entry: TensorEntry, *, check: bool = True) -> VerifiedTensor:
        """``entry``'s bytes, CRC32C-checked (when ``check``), not yet copied anywhere."""
        dtype = dtype_from_name(entry.dtype)
        numel = math.prod(entry.shape)
        if numel * torch.empty((), dtype=dtype).element_size() != entry.nbytes:
            raise CheckpointFormatError(f"tensor {key!r} under {self._url} is {entry.nbytes} bytes, not {entry.dtype}{list(entry.shape)}")
        segs = self.segments(entry.offset, entry.nbytes) if entry.nbytes else []
        if check:
            value = 0
            for s in segs:
                value = crc32c(s, value)  # type: ignore[arg-type]
            if format_checksum(value) != entry.checksum:
                raise CorruptDataError(f"tensor {key!r} under {self._url} fails its checksum: the checkpoint is corrupt")
        return VerifiedTensor(dtype, tuple(entry.shape), segs)


class VerifiedTensor:
    """Verified raw bytes of one tensor, copied out only when loaded.

    Loading copies the bytes straight into the live tensor that receives them (one copy, no
    temporary), or into a fresh CPU tensor when there is none.
    """

    __slots__ = ("dtype", "shape", "_segs")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...], segs: list[np.ndarray]) -> None:
        self.dtype, self.shape, self._segs = dtype, torch.Size(shape), segs

    def materialize(self) -> torch.Tensor:
        """A fresh CPU tensor holding the bytes."""
        out = torch.empty(self.shape, dtype=self.dtype)
        self._fill(out)
        return out

    def copy_into(self, target: torch.Tensor) -> None:
        """Overwrite ``target`` (same shape and dtype, any device) with the bytes."""
        if target.device.type == "cpu" and target.is_contiguous() and not target.requires_grad:
            self._fill(target)
        else:
            with torch.no_grad():
                target.copy_(self.materialize())

    def _fill(self, out: torch.Tensor) -> None:
        if out.numel() == 0:
            return
        flat = out.view(-1).view(torch.uint8).numpy()
        pos = 0
        for s in self._segs:
            flat[pos : pos + len(s)] = s
            pos += len(s)


def run_copies(copies: Sequence[tuple[VerifiedTensor, torch.Tensor]], workers: int = 8) -> None:
    """Make deferred in-place copies on a few threads (NumPy's copy releases the GIL)."""
    if len(copies) < 2 or workers < 2:
        for src, dst in copies:
            src.copy_into(dst)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(workers, len(copies)), thread_name_prefix="streamio-ckpt-copy") as pool:
        list(pool.map(lambda c: c[0].copy_into(c[1]), copies))
