"""``select``: a sample's members by name, the first present of alternatives (``"jpg;png"``).

A WebDataset-style data set often holds one kind of member under several extensions: some
samples ``.jpg``, others ``.png``. Code that reads ``sample["jpg"]`` (or ``collate_samples``, which
stacks each member across a batch) then fails on the first ``.png``. webdataset answers with
``to_tuple("jpg;png", "cls")``: each field names alternatives, separated by ``;``, and takes the
first the sample has. :func:`select` is that, as a ``transform=`` of
:class:`~streamio.data.dataset.StreamingDataset`::

    ds = StreamingDataset(url, decode="auto", transform=streamio.select("jpg;png;jpeg", "cls"))
    # each sample: (image, label)
    ds = StreamingDataset(url, transform=streamio.select(image="jpg;png;jpeg", label="cls"))
    # each sample: {"image": ..., "label": ..., "__key__": ..., ...}: collate_samples stacks it

A spec that no sample could ever match is refused when the selector is made: one with no name, or
a name holding a space or a comma (``"jpg; png"``, ``"jpg,png"``, ``" "``), which is a separator
mistaken, never a member. A sample with none of a field's alternatives raises
:class:`~streamio.errors.MissingMemberError` naming the sample, the field, and the members it has.
The selector is a small picklable value, so it crosses into DataLoader workers (fork or spawn).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamio.errors import ConfigError, MissingMemberError

__all__ = ["Selector", "members_of", "select"]


def members_of(sample: Mapping[str, Any]) -> list[str]:
    """The member names of ``sample`` (its ``__meta__`` fields left out), sorted."""
    return sorted(k for k in sample if not k.startswith("__"))


def _parse(spec: object, where: str) -> tuple[str, ...]:
    syntax = 'member names, alternatives separated by ";" without spaces ("jpg;png")'
    if not isinstance(spec, str) or not spec.strip(";"):
        raise ConfigError(f"select({where}={spec!r}): give {syntax}")
    names = tuple(n for n in spec.split(";") if n)
    for name in names:
        if any(c.isspace() or c == "," for c in name):
            raise ConfigError(
                f"select({where}={spec!r}): {name!r} holds a space or a comma, which a member name never does "
                f"(a sample would never have it): give {syntax}"
            )
    if any(n.startswith("__") for n in names):
        raise ConfigError(f"select({where}={spec!r}): {spec!r} names a __meta__ field; those are kept as they are")
    return names


class Selector:
    """Picks fields out of a sample (made by :func:`select`; see the module docstring).

    Attributes:
        fields: ``(output name or None, alternatives)`` per field, in order; names are None for a
            tuple selector.
    """

    def __init__(self, fields: tuple[tuple[str | None, tuple[str, ...]], ...]) -> None:
        self.fields = fields

    def __repr__(self) -> str:
        parts = [(f"{name}=" if name else "") + repr(";".join(alts)) for name, alts in self.fields]
        return f"select({', '.join(parts)})"

    def _pick(self, sample: Mapping[str, Any], name: str | None, alternatives: tuple[str, ...]) -> Any:
        for member in alternatives:
            if member in sample:
                return sample[member]
        what = f"field {name!r} ({';'.join(alternatives)})" if name else f"field {';'.join(alternatives)!r}"
        raise MissingMemberError(
            f"sample {sample.get('__key__')!r} of {sample.get('__url__', '?')} has none of the members of {what}; "
            f"it has {members_of(sample)}. Add the one to use to the alternatives "
            f"({';'.join(alternatives)};<name>), or check the data set"
        )

    def __call__(self, sample: Mapping[str, Any]) -> Any:
        if self.fields and self.fields[0][0] is None:
            return tuple(self._pick(sample, None, alts) for _, alts in self.fields)
        out = {k: v for k, v in sample.items() if k.startswith("__")}
        for name, alts in self.fields:
            out[name] = self._pick(sample, name, alts)  # type: ignore[index]
        return out


def select(*fields: str, **named: str) -> Selector:
    """A transform that picks members of each sample, the first present of ``;``-separated names.

    Args:
        fields: one spec per element of the tuple returned (``"jpg;png"``, ``"cls"``), as
            webdataset's ``to_tuple``.
        named: or output name -> spec: the result is a dict of those names, plus the sample's
            ``__key__``/``__url__``/... fields (what ``collate_samples`` keeps as lists).

    Returns:
        a picklable callable ``sample -> tuple | dict`` for ``StreamingDataset(transform=...)``.

    Raises:
        ConfigError: no field, both forms at once, a spec with no member name, or a name holding a
            space or a comma (``"jpg; png"``: the separator is ``;`` alone).
    """
    if bool(fields) == bool(named):
        raise ConfigError(
            "select() takes member specs either as positional arguments (a tuple per sample: "
            "select('jpg;png', 'cls')) or as keywords (a dict: select(image='jpg;png', label='cls')), one form, "
            "at least one field"
        )
    if fields:
        return Selector(tuple((None, _parse(spec, f"#{i}")) for i, spec in enumerate(fields)))
    return Selector(tuple((name, _parse(spec, name)) for name, spec in named.items()))
