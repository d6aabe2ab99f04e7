"""Every public callable with parameters documents each of them in a numpydoc ``Parameters`` section, as the API
reference renders it: the names of ``streamfit.__all__`` and of the public modules (losses, optim, schedules,
penalties, sources, estimators, models, features, graph, testing, river, daemon, checkpoint, history,
report), classes by their constructor's signature, and the public methods of those classes (an override
without a docstring of its own excepted: its base's says what its parameters are).  Parsed with griffe's numpy
parser (the one mkdocstrings uses), on the docstring ``help()`` shows, which the API reference renders too
(``docs/_griffe_roles.py``).

``python tests/test_docs_parameters.py`` lists what is missing.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

griffe = pytest.importorskip("griffe", reason="the [docs] extra (mkdocstrings) brings griffe, the docstring parser")

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("streamfit", "streamfit.losses", "streamfit.optim", "streamfit.schedules", "streamfit.penalties",
           "streamfit.sources", "streamfit.estimators", "streamfit.models", "streamfit.features", "streamfit.graph",
           "streamfit.testing", "streamfit.river", "streamfit.daemon", "streamfit.checkpoint", "streamfit.history",
           "streamfit.report")


def public_callables(methods: bool = False) -> Iterator[tuple[str, Any]]:
    """(dotted name, object) of each public class and function once (under the first module listing it),
    enums left out (their signature is Enum's); with ``methods``, the public methods each class defines (an
    override without a docstring of its own left out: its base's documents it)."""
    seen: set[int] = set()
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or id(obj) in seen:
                continue
            if inspect.isclass(obj) and issubclass(obj, enum.Enum):
                continue
            seen.add(id(obj))
            if not getattr(obj, "_is_protocol", False):  # a Protocol is no constructor: its methods are the contract
                yield f"{module_name}.{name}", obj
            if methods and inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    func = getattr(value, "__func__", value)
                    if attr.startswith("_") or not inspect.isfunction(func):
                        continue
                    # an override without a docstring of its own keeps the contract its base documents
                    override = any(attr in vars(base) for base in obj.__mro__[1:] if base is not object)
                    if func.__doc__ or not override:
                        yield f"{module_name}.{name}.{attr}", func


def _record(obj: Any) -> bool:
    """A dataclass or a named tuple: its fields are its parameters."""
    named_tuple = inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")
    return dataclasses.is_dataclass(obj) or named_tuple


def signature_names(obj: Any) -> list[str]:
    try:  # a dataclass by its __init__ (StreamOptions' __new__ takes **kwargs to name a misspelt option)
        signature = inspect.signature(obj.__init__ if dataclasses.is_dataclass(obj) else obj)
    except (TypeError, ValueError):  # a builtin's
        return []
    return [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]


def documented_names(obj: Any) -> set[str] | None:
    """The names the docstring's Parameters (and Other Parameters) sections give, stars stripped; a
    record's Attributes count too (a dataclass's or named tuple's fields are its parameters); names given
    together (``a, b``) each count.  None: no such section."""
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    kinds = {"parameters", "other parameters"} | ({"attributes"} if _record(obj) else set())
    logging.getLogger("griffe").disabled = True  # "no type for parameter x": streamfit's types are the signature's
    try:
        sections = griffe.Docstring(doc, parser="numpy").parse()
    finally:
        logging.getLogger("griffe").disabled = False
    found = [s for s in sections if s.kind.value in kinds]
    if not found:
        return None
    return {name.strip().lstrip("*") for section in found for item in section.value for name in item.name.split(",")}


def missing(methods: bool = False) -> dict[str, str]:
    """Dotted name -> what its docstring lacks."""
    out = {}
    for name, obj in public_callables(methods):
        params = signature_names(obj)
        if not params:
            continue
        names = documented_names(obj)
        if names is None:
            out[name] = f"no Parameters section (parameters {params})"
        elif lacking := [p for p in params if p not in names]:
            out[name] = f"Parameters lacks {lacking}"
    return out


def test_every_public_callable_documents_each_parameter():
    gaps = missing(methods=True)
    assert not gaps, "\n".join(f"{name}: {what}" for name, what in gaps.items())


def test_the_check_sees_a_missing_parameter_and_a_missing_section():
    def documented(a: int, *, b: int = 0, **options: Any) -> None:
        """What.

        Parameters
        ----------
        a, b
            Two numbers.
        **options
            More.
        """

    def lacking(a: int, b: int) -> None:
        """What.

        Parameters
        ----------
        a
            A number.
        """

    def none(a: int) -> None:
        """What, no parameters section."""

    assert documented_names(documented) == {"a", "b", "options"}
    assert documented_names(lacking) == {"a"} and documented_names(none) is None
    assert len(list(public_callables())) > 60  # the walk sees the public face
    walked = dict(public_callables(methods=True))
    assert "streamfit.optim.Optimizer.update" in walked and "streamfit.Trainer.step" in walked
    assert "streamfit.optim.Adam.update" not in walked  # an override that keeps its base's docstring


def test_the_api_reference_renders_the_docstring_help_shows():
    """A docstring made or extended at import (OnnxRegressor's shared Parameters, MLPRegressor's
    ``__doc__ = ...``, FMClassifier's appended Parameters) is what griffe, and so mkdocstrings, renders."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from _griffe_roles import SphinxRoles
    finally:
        sys.path.remove(str(ROOT / "docs"))
    import streamfit

    package = griffe.load("streamfit", search_paths=[str(ROOT)], extensions=griffe.Extensions(SphinxRoles()))
    for path, name in [("estimators.regressor", "OnnxRegressor"), ("estimators.classifier", "OnnxClassifier"),
                       ("models.mlp", "MLPRegressor"), ("models.fm", "FMClassifier")]:
        rendered = package[f"{path}.{name}"].docstring
        assert rendered is not None, name
        sections = {s.kind.value: s for s in rendered.parse(parser="numpy")}
        rendered_names = {p.name for p in sections["parameters"].value}
        assert rendered_names == documented_names(getattr(streamfit, name)), name
    assert "{onnx estimator parameters}" not in (streamfit.OnnxRegressor.__doc__ or "")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for name, what in missing(methods=True).items():
        print(f"{name}: {what}")
