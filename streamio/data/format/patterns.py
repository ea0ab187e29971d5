"""Which shards a URL or pattern names: brace / glob expansion against one listing.

``streamio index s3://b/ds/shard-{000000..000099}.tar`` and ``streamio shard 's3://b/in/*.tar' ...``
name shards by pattern. :func:`split_pattern` cuts such a URL into the root a
:class:`~streamio.storage.Store` is opened at and the pattern below it; :func:`expand_patterns`
turns patterns into shard paths. Braces are expanded here (s3fs's glob does not expand them);
glob characters are matched against one fresh listing, so a pattern costs one LIST whatever its
size.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import braceexpand

from streamio.data.format.layout import LAYOUT_DIR, is_gzip_shard, is_shard
from streamio.storage import Store

__all__ = ["expand_patterns", "gzip_shards", "split_pattern"]


def expand_patterns(store: Store, patterns: str | Sequence[str] | None) -> list[str]:
    """Shard paths (relative to ``store``) named by brace / glob patterns, in pattern order.

    ``None`` means every ``.tar`` / ``.tar.zst`` below the root. Braces are expanded here (s3fs's glob
    does not); glob characters are matched against one fresh listing.
    """
    if patterns is None:
        return [o.path for o in store.list() if is_shard(o.path) and not o.path.startswith(LAYOUT_DIR + "/")]
    if isinstance(patterns, str):
        patterns = [patterns]
    listing: list[str] | None = None
    out: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        for expanded in braceexpand.braceexpand(pattern):
            if any(c in expanded for c in "*?["):
                if listing is None:
                    listing = [o.path for o in store.list()]
                matches = sorted(p for p in listing if fnmatch.fnmatchcase(p, expanded))
            else:
                matches = [expanded]
            for m in matches:
                if m not in seen:
                    seen.add(m)
                    out.append(m)
    return out


def gzip_shards(store: Store) -> list[str]:
    """The gzip'd tar shards (``.tar.gz``, ``.tgz``) below the root, from one fresh listing: what a
    prefix holding no ``.tar`` shards may hold instead (messages say how to convert them)."""
    return [o.path for o in store.list() if is_gzip_shard(o.path)]


def split_pattern(url: str) -> tuple[str, str | None]:
    """``"s3://b/ds/shard-{000..009}.tar"`` -> ``("s3://b/ds", "shard-{000..009}.tar")``; no pattern -> ``(url, None)``.

    The root is everything before the first path component holding ``{``, ``*``, ``?`` or ``[``;
    a URL naming one ``.tar`` / ``.tar.zst`` (or gzip'd ``.tar.gz``) splits into its directory and its name.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    parts = rest.split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in "{*?["):
            root = "/".join(parts[:i]) or ("/" if rest.startswith("/") else ".")
            return (f"{scheme}://{root}" if sep else root), "/".join(parts[i:])
    if is_shard(parts[-1]) or is_gzip_shard(parts[-1]):  # one shard named outright
        root = "/".join(parts[:-1]) or ("/" if rest.startswith("/") else ".")
        return (f"{scheme}://{root}" if sep else root), parts[-1]
    return url, None
