"""What every verb group shares: ``-o KEY=VALUE`` storage options and the bounds of numeric options.

Errors are not handled here: every verb runs under the ``streamio`` group, which applies the exit
contract of :mod:`streamio.cli.exits` to whatever escapes (one line, the status its class means).

Every numeric option is a :func:`bounded` integer: a value past its bound is a usage error naming
the option (exit 2) before anything is read, allocated or looped over on its word. The bounds are
far past any real job and far below what would overflow a C integer or take days.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click

#: Threads reading or scanning shards at once (``--concurrency``).
MAX_CONCURRENCY = 1024
#: Processes a verb starts on this machine (``--workers``).
MAX_WORKERS = 512
#: Seeds and epochs: int64, as resume states and numpy take them.
MAX_SEED = 2**63 - 1
#: Any other count (samples per shard, batch size, shuffle window): 2**40, a trillion.
MAX_COUNT = 1 << 40


#: The largest single object S3 and GCS store: 5 TiB.
MAX_OBJECT_BYTES = 5 << 40
_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "PIB": 1 << 50,
}


def parse_size(text: str, *, what: str = "a shard size limit", maximum: int = MAX_OBJECT_BYTES) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 1 << 30, ``"4096"`` -> 4096; 1 to ``maximum`` bytes."""
    m = re.fullmatch(r"\s*([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise click.BadParameter(f"{text!r} is not a size such as 256MB, 1GiB or 4096")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size < 1:
        raise click.BadParameter(f"{text!r} is {size} bytes; {what} must be at least 1 byte (e.g. 256MB)")
    if size > maximum:
        raise click.BadParameter(f"{text!r} is more than {_binary(maximum)}, the most {what} may be")
    return size


def _binary(n: int) -> str:
    """``5 << 40`` -> ``"5 TiB"`` (the largest binary unit that divides ``n``)."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


class Size(click.ParamType):
    """A byte size with a unit (``256MB``, ``1GiB``, ``4096``), parsed while the options are.

    Args:
        what: what the size is, for messages.
        maximum: the largest size accepted.
    """

    name = "size"

    def __init__(self, what: str, maximum: int) -> None:
        self.what, self.maximum = what, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value), what=self.what, maximum=self.maximum)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def bounded(low: int, high: int) -> click.IntRange:
    """An integer option type accepting ``low..high``; anything else is a usage error naming the option."""
    return click.IntRange(min=low, max=high)


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("a=1", "b.c=x")`` -> ``{"a": 1, "b": {"c": "x"}}``; a malformed pair is a usage error."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (KEY: names joined by dots)", param_hint="'-o'")
        try:
            parsed: Any = json.loads(value)
        except (ValueError, RecursionError):
            parsed = value
        node = out
        *parents, leaf = parts
        for depth, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise click.BadParameter(
                    f"{pair!r}: {'.'.join(parents[: depth + 1])} was already given a value, not a group of options",
                    param_hint="'-o'",
                )
        node[leaf] = parsed
    return out


def _storage_options_callback(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, Any]:
    return parse_storage_options(value)


storage_option = click.option(
    "-o", "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    callback=_storage_options_callback,
    help="fsspec storage option (repeatable; dotted keys nest, values parse as JSON when they can), "
    "e.g. -o endpoint_url=http://127.0.0.1:9000 -o client_kwargs.region_name=eu-west-1",
)
"""The ``-o KEY=VALUE`` option; the command receives ``storage_options`` as a parsed dict."""
