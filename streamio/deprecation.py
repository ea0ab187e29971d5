"""Keywords that moved into option objects in streamio 0.2.0, and names that moved, still accepted until 0.3.0.

The 0.2.0 restructure grouped rarely changed settings into frozen values (and made
``CheckpointManager.restore``'s ``step`` keyword-only: :func:`keyword_only`):
``StreamingDataset(policy=, cache=, prefetch=, handler=)`` became
``options=DatasetOptions(...)``, and ``write_dataset`` / ``DatasetWriter``'s ``max_bytes=``,
``max_count=``, ``compression=``, ``level=`` and ``prefix=`` became ``spec=ShardSpec(...)``. Code
written for 0.1 keeps working for one release: :func:`fold_moved` builds the new value from the old
keywords and warns (``DeprecationWarning``, pointing at the caller) with the new spelling. The old
and the new spelling together, or a keyword that never existed, is an
:class:`~streamio.errors.ArgumentError` (a ``TypeError``, as Python's own for a wrong keyword).
"""

from __future__ import annotations

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
) -> T | None:
    """``given``, or the value ``make(**moved)`` when keywords were passed the 0.1 way.

    Args:
        owner: the callable the keywords were passed to, for messages (``"StreamingDataset"``).
        moved: the keywords its ``**moved`` caught.
        into: the keyword that holds them now (``"options"``).
        given: the value passed as ``into`` (None when it was not).
        make: builds that value from the moved keywords (``DatasetOptions``).
        fields: the keywords that moved into it.

    Raises:
        ArgumentError: a keyword that is not one of ``fields`` (a typo), or the moved keywords
            given together with ``into``.
    """
    if not moved:
        return given
    unknown = [k for k in moved if k not in fields]
    if unknown:
        raise ArgumentError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    old = ", ".join(f"{k}=" for k in moved)
    new = f"{into}={make.__name__}({', '.join(f'{k}=...' for k in moved)})"
    if given is not None:
        raise ArgumentError(
            f"{owner}() got {old} and {into}= together: {old} moved into {into}= in streamio {_SINCE}; "
            f"pass {new} only"
        )
    warnings.warn(
        f"{owner}({old}...) is deprecated since streamio {_SINCE} and will be removed in {REMOVED_IN}: pass {new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return make(**moved)


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

