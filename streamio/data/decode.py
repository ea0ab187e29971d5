"""Decoding sample members (``bytes``) into Python objects, safely.

A sample from a shard is ``{"__key__": ..., "jpg": b"...", "cls": b"3", ...}``. ``decode`` turns the
member bytes into values by extension (the part after the last dot, as WebDataset does):

* ``txt``/``text`` -> ``str`` (UTF-8); ``json`` -> parsed JSON; ``cls``/``idx``/``index`` -> ``int``
* ``npy`` -> ``numpy.ndarray`` read by :mod:`streamio.data.format.npy`: its header checked (a known
  dtype without Python objects, a shape of the bytes the member holds) before any array exists,
  never unpickled (numpy's own loader would allocate the declared shape first)
* ``pt``/``pth`` -> tensors loaded with ``torch.load(weights_only=True)`` (never arbitrary pickles)
* ``jpg``/``jpeg``/``png``/``webp``/``bmp`` -> ``PIL.Image.Image`` when Pillow is installed
* anything else stays ``bytes``.

No decoder ever unpickles: a shard is untrusted input.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

from streamio.data.format import npy
from streamio.errors import DatasetError, ShardFormatError

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
    return npy.parse(data).copy(order="K")  # a writable array of its own, in its order, as numpy.load returns


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
                error = ShardFormatError if isinstance(exc, ShardFormatError) else DatasetError
                raise error(
                    f"cannot decode member {name!r} of {_where(sample)}: {exc}. Pass decode=None to get raw "
                    f"bytes, or a decoder of your own for {name!r}."
                ) from exc
        return out


def _where(sample: Sample) -> str:
    """``sample 'key' (number 3) of shard 'url'``: what names a sample in a decoding error."""
    number = f" (number {sample['__index__']})" if "__index__" in sample else ""
    return f"sample {sample.get('__key__')!r}{number} of shard {sample.get('__url__', '?')!r}"
