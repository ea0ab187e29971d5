"""``Stream``: one source of a :class:`~streamio.data.dataset.StreamingDataset` mixture.

A mixture is a list of sources, each an indexed dataset in any store with its own options, each
contributing a stated share of every epoch (:mod:`streamio.data.plan.mixture` says how shares
become sample counts; :mod:`streamio.data.plan.sequence` how the sources are interleaved and how a
source smaller or larger than its share is cycled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamio.data.format.index import DatasetIndex
from streamio.data.plan import Pack, PlanSource
from streamio.data.plan.tokenmix import TokenSource
from streamio.data.sharing import OpenGroup, open_sources
from streamio.errors import ConfigError, PlanError
from streamio.storage import Store
from streamio.storage.secrets import scrub as redact_url

__all__ = [
    "LoadedStream", "Stream", "describe_mixture", "describe_request", "load_streams", "packed_documents",
    "parse_source",
    "plan_sources",
]


@dataclass(frozen=True)
class Stream:
    """One source of a mixture.

    Args:
        url: the source's dataset prefix (holding ``index.json``), any store.
        weight: relative share of each epoch (a number > 0). The weighted sources share the epoch
            (or what ``samples`` sources leave of ``epoch_samples``) in proportion.
        samples: absolute samples per epoch (an int >= 1); more than the source holds repeats it.
        storage_options: options for this source's store (endpoint, credentials); the dataset's
            ``storage_options`` when None.

    With neither ``weight`` nor ``samples`` the source contributes its own size every epoch.
    """

    url: str
    weight: float | None = None
    samples: int | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ConfigError(f"Stream(url={self.url!r}): the url must be a non-empty string")
        if self.weight is not None and self.samples is not None:
            raise ConfigError(f"Stream({redact_url(self.url)!r}): give weight= or samples=, not both")


@dataclass(frozen=True)
class LoadedStream:
    """A source with its store and index loaded."""

    stream: Stream
    store: Store
    index: DatasetIndex

    def plan_source(self) -> PlanSource:
        """What the planner needs of this source."""
        return PlanSource(
            self.index.sample_counts(), weight=self.stream.weight, samples=self.stream.samples,
            fingerprint=self.index.fingerprint, name=f"source {redact_url(self.stream.url)!r}",
        )


def as_streams(url: str | Stream | Sequence[str | Stream]) -> list[Stream]:
    """The dataset argument as a list of :class:`Stream` (a plain URL list = concatenation)."""
    if isinstance(url, (str, Stream)):
        items: Sequence[str | Stream] = [url]
    elif isinstance(url, Sequence) and url:
        items = url
    else:
        raise ConfigError(
            f"StreamingDataset(url={url!r}): give a dataset URL, a streamio.Stream, or a non-empty list of them"
        )
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(Stream(item))
        elif isinstance(item, Stream):
            out.append(item)
        else:
            raise ConfigError(f"StreamingDataset: {item!r} is neither a URL string nor a streamio.Stream")
    return out


def load_streams(
    url: str | Stream | Sequence[str | Stream], storage_options: Mapping[str, Any] | None,
    group: OpenGroup | None = None,
) -> list[LoadedStream]:
    """Open every source's store and load its index (each with its own options), the sources in parallel.

    Under ``group`` (a job's ranks), rank 0 reads the indexes and the other ranks parse its bytes
    (:mod:`streamio.data.sharing`); without one, this process reads them.
    """
    streams = as_streams(url)
    requests = [(s.url, s.storage_options if s.storage_options is not None else storage_options) for s in streams]
    opened = open_sources(requests, group)
    return [LoadedStream(stream, store, index) for stream, (store, index) in zip(streams, opened, strict=True)]


def describe_request(url: str | Stream | Sequence[str | Stream]) -> str:
    """``StreamingDataset('s3://b/ds')`` or ``StreamingDataset(mixture of 2: 's3://a', 's3://b')``
    (URLs without credentials), for messages about opening ``url``."""
    urls = [redact_url(s.url) for s in as_streams(url)]
    if len(urls) == 1:
        return f"StreamingDataset({urls[0]!r})"
    return f"StreamingDataset(mixture of {len(urls)}: {', '.join(repr(u) for u in urls)})"


def plan_sources(sources: Sequence[LoadedStream], epoch_samples: int | None) -> list[PlanSource] | None:
    """The planner's sources of a mixture (or of one source with a stated share); None for one plain dataset."""
    one = sources[0].stream
    if len(sources) == 1 and one.weight is None and one.samples is None and epoch_samples is None:
        return None
    return [src.plan_source() for src in sources]


def packed_documents(
    sources: Sequence[LoadedStream], epoch_samples: int | None, pack: Pack | None
) -> list[np.ndarray] | list[TokenSource] | None:
    """What a packing plan takes: one data set's per-shard document token counts, or a mixture's
    :class:`~streamio.data.plan.tokenmix.TokenSource` list (``Stream(samples=)`` counts sequences,
    weights share tokens); None without packing.

    Raises:
        PlanError: ``pack`` is not a Pack.
        DatasetError: an index records no token counts for ``pack.member`` (it says how to get them).
    """
    if pack is None:
        return None
    if not isinstance(pack, Pack):
        raise PlanError(f"pack={pack!r} must be a streamio.Pack (or None).")
    counts = [[np.asarray(c, dtype=np.int64) for c in src.index.token_counts(pack.member)] for src in sources]
    if plan_sources(sources, epoch_samples) is None:
        return counts[0]
    return [
        TokenSource(c, weight=src.stream.weight, sequences=src.stream.samples, fingerprint=src.index.fingerprint,
                    name=f"source {redact_url(src.stream.url)!r}")
        for src, c in zip(sources, counts, strict=True)
    ]


def describe_mixture(sources: Sequence[LoadedStream], contributions: Sequence[int]) -> str:
    """``mixture of N, samples per epoch {url: count, ...}`` (URLs without credentials)."""
    parts = ", ".join(f"{redact_url(s.store.root_url)!r}: {c}" for s, c in zip(sources, contributions, strict=True))
    return f"mixture of {len(sources)}, samples per epoch {{{parts}}}"


def parse_source(text: str) -> tuple[str, float | None]:
    """``URL[:WEIGHT]`` (command lines) as ``(url, weight)``: the weight is what follows the last colon.

    ``s3://b/web:0.7`` is ``("s3://b/web", 0.7)``; ``s3://b/web`` and ``/data/x`` have no weight.

    Raises:
        ConfigError: a weight that is not a number > 0.
    """
    head, sep, tail = text.rpartition(":")
    if not sep or not head or tail.startswith("/"):
        return text.rstrip("/") or text, None
    try:
        weight = float(tail)
    except ValueError:
        return text.rstrip("/") or text, None
    if not weight > 0 or weight != weight or weight == float("inf"):
        raise ConfigError(f"{redact_url(text)!r}: the weight after the last ':' must be a number > 0")
    return head.rstrip("/") or head, weight
