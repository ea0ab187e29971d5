"""Keywords that moved into option objects, and names that moved, still accepted for one minor release.

The 0.2.0 restructure grouped rarely changed settings into frozen values (and made
``CheckpointManager.restore``'s ``step`` keyword-only: :func:`keyword_only`):
``StreamingDataset(policy=, cache=, prefetch=, handler=)`` became
``options=DatasetOptions(...)``, and ``write_dataset`` / ``DatasetWriter``'s ``max_bytes=``,
``max_count=``, ``compression=``, ``level=`` and ``prefix=`` became ``spec=ShardSpec(...)``, and
``StreamingDataset(epoch_samples=)`` and ``iter_samples(start_offset=, first_sample=,
num_samples=)`` followed (into ``DatasetOptions`` and ``SampleSpan``). Code written for the release
before keeps working for one release: :func:`fold_moved` builds the new value from the old
keywords and warns (``DeprecationWarning``, pointing at the caller) with the new spelling. A
keyword that never existed is an :class:`~streamio.errors.ArgumentError` (a ``TypeError``, as
Python's own for a wrong keyword), and so is the old and the new spelling together where the new
one came with the move (0.1 had no ``options=``); where it existed before (``options=`` beside
``epoch_samples=``), the old keyword is folded into the value given unless that value sets it too.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from streamio.errors import ArgumentError

__all__ = ["REMOVED_IN", "fold_moved", "keyword_only", "moved_name"]

REMOVED_IN = "0.3.0"
_SINCE = "0.2.0"
T = TypeVar("T")


def fold_moved(
    owner: str,
    moved: Mapping[str, Any],
    *,
    into: str,
    given: T | None,
    make: Callable[..., T],
    fields: tuple[str, ...],
    since: str = _SINCE,
    alongside: bool = False,
) -> T | None:
    """``given``, or the value ``make(**moved)`` when keywords were passed the way of the release before ``since``.

    Args:
        owner: the callable the keywords were passed to, for messages (``"StreamingDataset"``).
        moved: the keywords its ``**moved`` caught.
        into: the keyword that holds them now (``"options"``).
        given: the value passed as ``into`` (None when it was not).
        make: builds that value from the moved keywords (``DatasetOptions``, a frozen dataclass).
        fields: the keywords that moved into it.
        since: the release they moved in; they are removed in the next minor one.
        alongside: ``into`` existed before the move, so code of the release before may pass both:
            the moved keywords are folded into ``given`` (unless it sets them too).

    Raises:
        ArgumentError: a keyword that is not one of ``fields`` (a typo), or the moved keywords
            given together with ``into`` where it is new, or where it sets them too.
    """
    if not moved:
        return given
    unknown = [k for k in moved if k not in fields]
    if unknown:
        raise ArgumentError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    old = ", ".join(f"{k}=" for k in moved)
    new = f"{into}={make.__name__}({', '.join(f'{k}=...' for k in moved)})"
    if given is not None and (not alongside or _sets(given, moved)):
        raise ArgumentError(
            f"{owner}() got {old} and {into}= together: {old} moved into {into}= in streamio {since}; "
            f"pass {new} only"
        )
    warnings.warn(
        f"{owner}({old}...) is deprecated since streamio {since} and will be removed in {_next_minor(since)}: "
        f"pass {new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return make(**moved) if given is None else dataclasses.replace(given, **moved)  # type: ignore[type-var]


def _sets(value: Any, names: Mapping[str, Any]) -> bool:
    """Whether the dataclass ``value`` sets any of ``names`` to something other than its default."""
    defaults = {f.name: f.default for f in dataclasses.fields(value)}
    return any(getattr(value, k) != defaults[k] for k in names)


def _next_minor(version: str) -> str:
    major, minor, _ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


def keyword_only(owner: str, name: str, args: tuple[Any, ...], given: T | None) -> T | None:
    """``given``, or the one positional argument ``args`` holds for the keyword-only ``name``
    (0.1 took it positionally), with a ``DeprecationWarning`` naming ``name=``.

    Raises:
        ArgumentError: more than one positional argument, or it and ``name=`` together.
    """
    if not args:
        return given
    if len(args) > 1 or given is not None:
        raise ArgumentError(
            f"{owner}() takes {name}= once, as a keyword (it is keyword-only since streamio {_SINCE}); "
            f"got {len(args)} positional argument(s){' and ' + name + '=' if given is not None else ''}"
        )
    warnings.warn(
        f"{owner}(..., {args[0]!r}) positionally is deprecated since streamio {_SINCE} and will be removed in "
        f"{REMOVED_IN}: pass {name}={args[0]!r}",
        DeprecationWarning,
        stacklevel=3,
    )
    return args[0]  # type: ignore[no-any-return]


def moved_name(old: str, new: str, value: T) -> T:
    """``value`` (the object a public name ``old`` gives now), with a ``DeprecationWarning`` naming
    where it lives (``new``); for a module's ``__getattr__`` (PEP 562), so each use warns, pointing at
    the user's line."""
    warnings.warn(
        f"{old} is deprecated and will be removed in {REMOVED_IN}: import {new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return value

