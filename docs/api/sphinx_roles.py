"""A Griffe extension for the docs build: Sphinx cross-reference roles in docstrings become code.

streamio's docstrings name other objects the Sphinx way (``:class:`~streamio.Store```), which
mkdocstrings renders as Markdown, roles and all. This shows each as the code span Sphinx would
show: ``~a.b.C`` as ``C``, ``a.b.C`` as itself, ``title <target>`` as ``title``. It only rewrites
text: links between documented objects come from Markdown references (``[Store][streamio.Store]``),
which a strict build checks.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:mod|class|meth|func|attr|data|exc|obj|const|ref|doc):`(~?)([^`<]+?)\s*(?:<([^>`]+)>)?`")


def _code(match: re.Match[str]) -> str:
    tilde, text, target = match.groups()
    if target is not None:
        return f"`{text}`"
    return f"`{text.rsplit('.', 1)[-1] if tilde else text}`"


def strip_roles(text: str) -> str:
    """``:class:`~a.b.C``` -> ```C```, and so on for every Sphinx role."""
    return ROLE.sub(_code, text)


class SphinxRoles(Extension):
    """Rewrite the roles of every docstring once the object tree is loaded."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = strip_roles(obj.docstring.value)
