"""What every verb group shares: ``-o KEY=VALUE`` storage options and the bounds of numeric options.

Errors are not handled here: every verb runs under the ``streamio`` group, which applies the exit
contract of :mod:`streamio.cli.exits` to whatever escapes (one line, the status its class means).

Every numeric option is a :func:`bounded` integer: a value past its bound is a usage error naming
the option (exit 2) before anything is read, allocated or looped over on its word. The bounds are
far past any real job and far below what would overflow a C integer or take days.
"""

from __future__ import annotations

import json
from typing import Any

import click

#: Threads reading or scanning shards at once (``--concurrency``).
MAX_CONCURRENCY = 1024
#: Seeds and epochs: int64, as resume states and numpy take them.
MAX_SEED = 2**63 - 1
#: Any other count (samples per shard, batch size, shuffle window): 2**40, a trillion.
MAX_COUNT = 1 << 40


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
