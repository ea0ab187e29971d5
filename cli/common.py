"""What every verb group shares: ``-o KEY=VALUE`` storage options and one-line error exits."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from streamio.errors import StreamioError

F = TypeVar("F", bound=Callable[..., Any])

storage_option = click.option(
    "-o", "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option (repeatable; dotted keys nest, values parse as JSON when they can), "
    "e.g. -o endpoint_url=http://127.0.0.1:9000 -o client_kwargs.region_name=eu-west-1",
)


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("a=1", "b.c=x")`` -> ``{"a": 1, "b": {"c": "x"}}``; a pair without ``=`` is a usage error."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--storage-option")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = parsed
    return out


def friendly(fn: F) -> F:
    """Turn streamio errors into a one-line message and exit status 1 (no traceback for users)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StreamioError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]
