"""A griffe extension for the API reference: Sphinx roles in docstrings (:class:`~a.b.C`, :meth:`step`) as code.

streamfit's docstrings are numpydoc with Sphinx cross-reference roles; mkdocstrings renders Markdown, where a
role would show as raw text. Each role becomes inline code of its target's last part (``~``) or whole name.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|obj|exc|const|ref|doc|term):`(~?)([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    if "<" in target and target.endswith(">"):  # :ref:`text <target>`
        target = target[: target.index("<")].strip()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads, before mkdocstrings parses its sections."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = _ROLE.sub(_as_code, obj.docstring.value)
            obj.docstring.value = value.replace("``", "`")
