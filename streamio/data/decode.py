"""Decoding sample members (``bytes``) into Python objects, safely.

A sample from a shard is ``{"__key__": ..., "jpg": b"...", "cls": b"3", ...}``. ``decode`` turns the
member bytes into values by extension (the part after the last dot, as WebDataset does):

* ``txt``/``text`` -> ``str`` (UTF-8); ``json`` -> parsed JSON; ``cls``/``idx``/``index`` -> ``int``
* ``npy`` -> ``numpy.ndarray`` loaded with ``allow_pickle=False``, after checking that the member
  holds the bytes its header declares (numpy would allocate the declared shape first)
* ``pt``/``pth`` -> tensors loaded with ``torch.load(weights_only=True)`` (never arbitrary pickles)
* ``jpg``/``jpeg``/``png``/``webp``/``bmp`` -> ``PIL.Image.Image`` when Pillow is installed
* anything else stays ``bytes``.

No decoder ever unpickles: a shard is untrusted input.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from streamio.errors import DatasetError

Sample = dict[str, Any]
Decoder = Callable[[bytes], Any]
DecodeSpec = None | str | Callable[[Sample], Sample] | Mapping[str, Decoder]


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(data)


def _int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _npy(data: bytes) -> Any:
    import numpy as np
    from numpy.lib import format as npy

    f = io.BytesIO(data)
    version = npy.read_magic(f)
    if version in ((1, 0), (2, 0)):  # numpy allocates the declared shape before it reads: check it first
        read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read_header(f)
        declared, held = math.prod(shape) * dtype.itemsize, len(data) - f.tell()
        if declared > held:
            raise ValueError(f"its header declares {declared} bytes of {dtype} {shape}, it holds {held}")
        f.seek(0)
    return np.load(f, allow_pickle=False)


def _torch(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _image(data: bytes) -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the user's environment
        raise DatasetError("decoding images needs Pillow: pip install pillow, or decode images yourself") from exc
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


BUILTIN_DECODERS: Mapping[str, Decoder] = {
    "txt": _text,
    "text": _text,
    "json": _json,
    "cls": _int,
    "idx": _int,
    "index": _int,
    "npy": _npy,
    "pt": _torch,
    "pth": _torch,
    "jpg": _image,
    "jpeg": _image,
    "png": _image,
    "webp": _image,
    "bmp": _image,
}


def make_decoder(spec: DecodeSpec) -> Callable[[Sample], Sample]:
    """Turn the user's ``decode=`` argument into a function ``sample -> sample``.

    Args:
        spec: ``None`` (members stay bytes), ``"auto"`` (the built-in decoders above), a mapping
            of extension -> ``bytes -> value`` (merged over the built-ins), or a callable taking and
            returning the whole sample.

    Raises:
        ValueError: for any other value.
    """
    if spec is None:
        return _identity
    if callable(spec):
        return spec
    if spec == "auto":
        return _ByExtension(BUILTIN_DECODERS)
    if isinstance(spec, Mapping):
        return _ByExtension({**BUILTIN_DECODERS, **spec})
    raise ValueError(f"decode={spec!r} is not None, 'auto', a mapping of extension -> decoder, or a callable")


def _identity(sample: Sample) -> Sample:
    return sample


class _ByExtension:
    """Decode each member by its extension; picklable (it crosses into DataLoader workers)."""

    def __init__(self, decoders: Mapping[str, Decoder]) -> None:
        self.decoders = dict(decoders)

    def __call__(self, sample: Sample) -> Sample:
        out: Sample = {}
        for name, value in sample.items():
            if name.startswith("__") or not isinstance(value, (bytes, bytearray, memoryview)):
                out[name] = value
                continue
            decoder = self.decoders.get(name.rsplit(".", 1)[-1].lower())
            if decoder is None:
                out[name] = value
                continue
            try:
                out[name] = decoder(bytes(value))
            except Exception as exc:
                raise DatasetError(
                    f"cannot decode member {name!r} of sample {sample.get('__key__')!r} in "
                    f"{sample.get('__url__', '?')}: {exc}. Pass decode=None to get raw bytes, or a "
                    f"decoder of your own for {name!r}."
                ) from exc
        return out
