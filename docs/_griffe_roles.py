"""A griffe extension for the API reference: docstrings written for doctest and Sphinx, rendered as Markdown.

streamfit's docstrings are numpydoc with Sphinx cross-reference roles and bare doctest examples; mkdocstrings
renders Markdown, where a role would show as raw text and a ``>>>`` line as a block quote. Each role becomes
inline code of its target's last part (``~``) or whole name; each run of doctest lines (and its expected output,
up to a blank line) becomes a fenced ``pycon`` block, as it reads in ``help()``.

griffe reads docstrings from the source; a module-level class or function whose ``__doc__`` is made or
extended at import (``streamfit/estimators/_docstrings.py``'s shared Parameters, ``models/mlp.py``'s
``__doc__ = ...``, ``models/fm.py``'s appended Parameters) is rendered with the docstring ``help()`` shows.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|obj|exc|const|ref|doc|term):`(~?)([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    if "<" in target and target.endswith(">"):  # :ref:`text <target>`
        target = target[: target.index("<")].strip()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>") and not (out and out[-1].lstrip().startswith("```")):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def runtime_docstring(obj: Any) -> str | None:
    """The imported object's ``__doc__`` (cleaned) if it differs from the source's docstring, else None; only
    for classes and functions of a module (whose import is cheap and whose ``__doc__`` is theirs)."""
    if not (obj.is_class or obj.is_function) or not obj.parent.is_module:
        return None
    try:
        found = getattr(importlib.import_module(obj.parent.path), obj.name)
    except (ImportError, AttributeError):
        return None
    doc = inspect.getdoc(found) if inspect.isclass(found) or inspect.isfunction(found) else None
    if not doc or (obj.docstring is not None and obj.docstring.value.strip() == doc.strip()):
        return None
    return doc


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads, before mkdocstrings parses its sections (the
    runtime docstring where it differs from the source's)."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        doc = runtime_docstring(obj)
        if doc is not None:
            if obj.docstring is None:
                obj.docstring = griffe.Docstring(doc, parent=obj)
            else:
                obj.docstring.value = doc
        if obj.docstring is not None:
            value = re.sub(r"(?<!`)``(?!`)", "`", _ROLE.sub(_as_code, obj.docstring.value))  # RST literals
            obj.docstring.value = _fence_doctests(value)
