"""State trees <-> JSON + tensor references, safe to decode from an untrusted store.

Saving walks each state object's ``state_dict()`` tree. Tensors (and NumPy arrays) are pulled out
and replaced by references; everything else must be JSON-able through a small *tagged* encoding
(``{"$t": "tuple", "v": [...]}`` for tuples, ``"dict"`` items for non-string keys, ``"float"`` for
inf/nan, ``"bytes"`` as base64, ``torch.Size``, dtypes, devices, NumPy scalars, sets, and the
``_metadata`` of a module's ``OrderedDict``). Nothing is ever pickled, so loading runs no code
from storage: JSON is parsed, raw bytes are reinterpreted as a dtype named in the manifest and
checked against their CRC32C. A value that fits none of these raises
:class:`~streamio.errors.CheckpointError` naming its path, instead of being pickled silently.

Restore decodes trees against a *template*, the live object's current ``state_dict()``: where
the template holds a tensor of the same shape and dtype the bytes are copied into it in place,
so e.g. a model's parameters and an optimizer's existing moments are overwritten, not replaced.
Those copies can be deferred (``defer=``, :mod:`.copies`) so that decoding touches nothing live: a tree read
from storage is checked field by field and fails as one
:class:`~streamio.errors.CheckpointFormatError` naming the place, before any copy is made.
"""

from __future__ import annotations

import base64
import math
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from streamio.checkpoint.tensors.copies import CopySource, LocalFill, VerifiedTensor
from streamio.errors import CheckpointError, CheckpointFormatError

TAG = "$t"

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
        raise CheckpointFormatError(
            f"unknown tensor dtype {name!r} in the manifest: written by a newer torch/streamio?"
        ) from None


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a ``DTensor`` (without importing DTensor: none exists unless its module
    was imported, and importing it costs about a second)."""
    cls = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return isinstance(cls, type) and isinstance(value, cls)


# ------------------------------------------------------------------------------- tree encoding
class TreeEncoder:
    """Encodes state trees to JSON-able values, collecting tensors under unique keys.

    Args:
        tensors: the dict that receives ``key -> tensor`` (shared across several encodes).
        sharded: the dict that receives ``key -> DTensor`` (``{"$t": "dtensor"}`` references);
            ``None``: a DTensor here is an error (per-rank state is not sharded).
    """

    def __init__(
        self, tensors: dict[str, torch.Tensor] | None = None, sharded: dict[str, torch.Tensor] | None = None
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = {} if tensors is None else tensors
        self.sharded = sharded

    def encode(self, value: Any, path: str) -> Any:
        """JSON-able form of ``value``; ``path`` names it in keys and error messages."""
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else {TAG: "float", "v": repr(value)}
        if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            return self._encode_array(value, path)
        if isinstance(value, (torch.Size, torch.dtype, torch.device, bytes, bytearray)):
            return _encode_atom(value)
        if isinstance(value, Mapping):
            return self._encode_mapping(value, path)
        if isinstance(value, list):
            return [self.encode(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, (tuple, set, frozenset)):
            items = value if isinstance(value, tuple) else sorted(value, key=repr)
            return {TAG: "tuple" if isinstance(value, tuple) else "set",
                    "v": [self.encode(v, f"{path}/{i}") for i, v in enumerate(items)]}
        raise CheckpointError(
            f"cannot save {path!r} of type {type(value).__name__}: checkpoint state must be tensors, arrays or "
            f"JSON-like values (nothing is pickled); give the object a state_dict() returning such values"
        )

    def _encode_array(self, value: torch.Tensor | np.ndarray | np.generic, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            if is_dtensor(value):
                if self.sharded is None:
                    raise CheckpointError(
                        f"cannot save {path!r}: a DTensor in per-rank state (SaveOptions.per_rank); sharded "
                        f"tensors belong to the model and optimizer state, which every rank saves together"
                    )
                return {TAG: "dtensor", "k": self._add(path, value, self.sharded)}
            return {TAG: "tensor", "k": self._add(path, value)}
        if isinstance(value, np.generic):
            return {TAG: "npscalar", "dtype": str(value.dtype), "v": self.encode(value.item(), path)}
        if value.dtype == object:
            raise CheckpointError(
                f"cannot save {path!r}: a NumPy array of Python objects; convert it to numbers or a list"
            )
        return {TAG: "ndarray", "k": self._add(path, torch.from_numpy(np.ascontiguousarray(value)).clone())}

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

    def _add(self, path: str, tensor: torch.Tensor, into: dict[str, torch.Tensor] | None = None) -> str:
        key, n = path, 1
        while key in self.tensors or (self.sharded is not None and key in self.sharded):
            n += 1
            key = f"{path}~{n}"
        (self.tensors if into is None else into)[key] = tensor.detach()
        return key


def _encode_atom(value: torch.Size | torch.dtype | torch.device | bytes | bytearray) -> dict[str, Any]:
    if isinstance(value, torch.Size):
        return {TAG: "size", "v": list(value)}
    if isinstance(value, torch.dtype):
        return {TAG: "dtype", "v": dtype_name(value)}
    if isinstance(value, torch.device):
        return {TAG: "device", "v": str(value)}
    return {TAG: "bytes", "v": base64.b64encode(bytes(value)).decode()}


def decode_tree(
    tree: Any, tensors: Mapping[str, Any], template: Any = None, *, path: str = "",
    defer: list[tuple[CopySource, torch.Tensor]] | None = None,
) -> Any:
    """Inverse of :meth:`TreeEncoder.encode`; never modifies ``template`` unless ``defer`` is None.

    ``tree`` comes from a stored manifest: every tagged value is checked (its fields, their
    types, the tensor it refers to), and whatever does not decode raises one error naming the
    place, never a bare ``KeyError`` / ``TypeError`` / ``RuntimeError`` half-way.

    Args:
        tree: the JSON-able form.
        tensors: key -> :class:`VerifiedTensor` (or a CPU tensor).
        template: the live value at the same place, if any: a tensor of the same shape and dtype
            receives the loaded bytes in place and is returned instead of the loaded one.
        path: for error messages.
        defer: if given, in-place copies are appended here as ``(source, target)`` instead of
            being made (the caller runs them in parallel, see :func:`run_copies`), so decoding
            touches no live tensor.

    Raises:
        CheckpointFormatError: an unknown tag, a malformed value, or a reference to a tensor
            that is not there.
    """
    if isinstance(tree, list):
        tpl = template if isinstance(template, (list, tuple)) else ()
        return [
            decode_tree(v, tensors, tpl[i] if i < len(tpl) else None, path=f"{path}/{i}", defer=defer)
            for i, v in enumerate(tree)
        ]
    if not isinstance(tree, dict):
        return tree
    tag = tree.get(TAG)
    if tag is None:
        tpl = template if isinstance(template, Mapping) else {}
        return {k: decode_tree(v, tensors, tpl.get(k), path=f"{path}/{k}", defer=defer) for k, v in tree.items()}
    if not isinstance(tag, str) or tag not in _DECODERS:
        raise CheckpointFormatError(f"unknown tag {tag!r} at {path!r} in the checkpoint: written by a newer streamio?")
    try:
        return _DECODERS[tag](tree, tensors, template, path, defer)
    except CheckpointFormatError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, OverflowError, RuntimeError) as exc:
        # RuntimeError: torch's (e.g. an invalid device string); ValueError includes base64's
        raise CheckpointFormatError(
            f"malformed {tag!r} value at {path!r} in the checkpoint ({type(exc).__name__}: {exc})"
        ) from exc


def _field(tree: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = tree[name]
    if not isinstance(value, kind):
        raise TypeError(f"field {name!r} is a {type(value).__name__}")
    return value


def _decode_tensor(tree: Any, tensors: Mapping[str, Any], template: Any, path: str, defer: Any) -> Any:
    key = _field(tree, "k", str)
    if key not in tensors:
        raise CheckpointFormatError(f"{path!r} refers to tensor {key!r} which the manifest does not list")
    loaded = tensors[key]
    if not isinstance(loaded, (VerifiedTensor, torch.Tensor)):
        raise CheckpointFormatError(f"{path!r} refers to {key!r} as a tensor, but the manifest saved it sharded")
    if not isinstance(loaded, VerifiedTensor):
        segs = [loaded.contiguous().view(-1).view(torch.uint8).numpy()] if loaded.numel() else []
        loaded = VerifiedTensor(loaded.dtype, tuple(loaded.shape), segs)
    if tree[TAG] == "ndarray":
        return loaded.materialize().numpy()
    if is_dtensor(template) and template.shape == loaded.shape and template.dtype == loaded.dtype:
        # a tensor saved whole (a plain module's), loaded into a DTensor: this rank's box of it
        fill, local = LocalFill(loaded, template), template.to_local().detach()
        if defer is not None:
            defer.append((fill, local))
        else:
            fill.copy_into(local)
        return template
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


def _decode_dtensor(tree: Any, tensors: Mapping[str, Any], template: Any, path: str, defer: Any) -> Any:
    """A sharded tensor: its source (restore's, :mod:`.resharding`) binds it to the live value
    at its place and plans the reads of the chunks this rank needs; the bytes come later."""
    key = _field(tree, "k", str)
    bind = getattr(tensors.get(key), "bind", None)
    if bind is None:
        raise CheckpointFormatError(f"{path!r} refers to sharded tensor {key!r} which the manifest does not list")
    return bind(template, path)


def _decode_float(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> float:
    return float(_field(tree, "v", str))


def _decode_tuple(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> tuple[Any, ...]:
    tpl = template if isinstance(template, (list, tuple)) else ()
    items = _field(tree, "v", list)
    return tuple(
        decode_tree(v, tensors, tpl[i] if i < len(tpl) else None, path=f"{path}/{i}", defer=defer)
        for i, v in enumerate(items)
    )


def _decode_dict(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> dict[Any, Any]:
    tpl = template if isinstance(template, Mapping) else {}
    out: dict[Any, Any] = OrderedDict() if "meta" in tree else {}
    for item in _field(tree, "items", list):
        if not isinstance(item, list) or len(item) != 2:
            raise TypeError("an item is not a [key, value] pair")
        k = decode_tree(item[0], tensors, path=f"{path}/<key>")
        out[k] = decode_tree(item[1], tensors, tpl.get(k) if _hashable(k) else None, path=f"{path}/{k}", defer=defer)
    if "meta" in tree:
        out._metadata = decode_tree(tree["meta"], tensors, path=f"{path}/<metadata>")  # type: ignore[attr-defined]
    return out


def _decode_npscalar(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> Any:
    dtype = np.dtype(_field(tree, "dtype", str))
    if dtype.kind not in _NP_SCALAR_KINDS:
        raise TypeError(f"NumPy dtype {dtype} is not a number, bool or string")
    return dtype.type(decode_tree(tree["v"], tensors, path=path))


def _decode_size(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> torch.Size:
    sizes = _field(tree, "v", list)
    # torch.Size keeps any int and fails only when used (repr, a shape): check int64 here
    if not all(isinstance(n, int) and not isinstance(n, bool) and -(1 << 63) <= n < 1 << 63 for n in sizes):
        raise ValueError(f"sizes must be 64-bit integers, got {sizes[:8]!r}")
    return torch.Size(sizes)


def _decode_dtype(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> torch.dtype:
    return dtype_from_name(_field(tree, "v", str))


def _decode_device(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> torch.device:
    return torch.device(_field(tree, "v", str))


def _decode_bytes(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> bytes:
    return base64.b64decode(_field(tree, "v", str), validate=True)


def _decode_set(tree: Any, tensors: Any, template: Any, path: str, defer: Any) -> set[Any]:
    return {decode_tree(v, tensors, path=path) for v in _field(tree, "v", list)}


_NP_SCALAR_KINDS = "biufcUS"  # bool, int, uint, float, complex, str, bytes: what encode() writes
_DECODERS = {
    "tensor": _decode_tensor, "ndarray": _decode_tensor, "dtensor": _decode_dtensor, "float": _decode_float,
    "tuple": _decode_tuple, "dict": _decode_dict, "npscalar": _decode_npscalar, "size": _decode_size,
    "dtype": _decode_dtype, "device": _decode_device, "bytes": _decode_bytes, "set": _decode_set,
}


def _hashable(k: Any) -> bool:
    try:
        hash(k)
    except TypeError:
        return False
    return True
