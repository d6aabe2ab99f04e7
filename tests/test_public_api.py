"""The public face: every exported name says where users import it from, README and docs/ import only public names,
and the re-exports keep every docstring example collected exactly once."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import streamfit

ROOT = Path(streamfit.__file__).parent
README = ROOT.parent / "README.md"


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


def _modules(public_only: bool) -> list[str]:
    names = ["streamfit"] + [m.name for m in pkgutil.walk_packages(streamfit.__path__, "streamfit.")]
    return [n for n in names if not (public_only and _private(n))]


def test_every_public_name_has_a_public_module_it_is_importable_from():
    wrong = []
    for module_name in _modules(public_only=True):
        module = importlib.import_module(module_name)
        assert hasattr(module, "__all__"), f"{module_name} has no __all__"
        for name in module.__all__:
            obj = getattr(module, name)  # every listed name exists (lazy ones resolve)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            home = obj.__module__
            if _private(home) or getattr(importlib.import_module(home), name, None) is not obj:
                wrong.append(f"{module_name}.{name}: __module__ {home!r}")
    assert not wrong, "\n".join(wrong)


def test_the_extension_api_event_types_and_daemon_helpers_are_public():
    from streamfit.daemon import DivergenceGuard, Metrics
    from streamfit.graph import GraphBuilder
    from streamfit.testing import linear_model, mlp_model, two_input_model

    assert (GraphBuilder.__module__, mlp_model.__module__) == ("streamfit.graph", "streamfit.testing")
    assert {"DivergenceGuard", "Metrics"} <= set(streamfit.daemon.__all__)
    assert (DivergenceGuard.__module__, Metrics.__module__) == ("streamfit.daemon.guard", "streamfit.daemon.health")
    for name in ("BatchEvent", "MetricsEvent", "StreamSummary", "LoopState", "Skipped", "Span", "Trainer"):
        assert name in streamfit.__all__ and getattr(streamfit, name).__module__ == "streamfit", name
    assert linear_model(2).graph.input[0].name == "X" and two_input_model(3, 10).graph.input[1].name == "ids"


def test_readme_and_docs_examples_import_only_public_names():
    pages = [README, *sorted((ROOT.parent / "docs").rglob("*.md"))]
    found, private = "", {}
    for page in pages:
        code = "\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
        found += code
        names = set(re.findall(r"\bstreamfit(?:\.\w+)*\._\w+", code))
        if names:
            private[page.relative_to(ROOT.parent).as_posix()] = sorted(names)
    assert "import mlp_model" in found and "import two_input_model" in found  # the examples are there
    assert not private, private


def _docstrings_with_examples() -> set[str]:
    """The text of every module/class/function docstring in streamfit/ with a ``>>>`` example, by parsing
    the sources (functions nested in functions excepted: doctest does not look there either)."""
    found = set()

    def visit(node: ast.AST, path: str) -> None:
        doc = ast.get_docstring(node, clean=False) if isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if doc and ">>>" in doc:
            found.add(doc[:200])  # a prefix: some classes extend their __doc__ at import
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for child in node.body:  # type: ignore[attr-defined]
                visit(child, path)

    for path in ROOT.rglob("*.py"):
        visit(ast.parse(path.read_text()), str(path))
    return found


def test_every_docstring_example_is_collected_exactly_once():
    finder = doctest.DocTestFinder(exclude_empty=True)
    collected: list[str] = []  # by text: a class's examples may be collected from the module re-exporting it
    for module_name in _modules(public_only=False):
        module = importlib.import_module(module_name)
        # docstrings without examples are found too (as empty tests): only those with examples count
        collected += [(test.docstring or "")[:200] for test in finder.find(module) if test.examples]
    expected = _docstrings_with_examples()
    twice = sorted({d[:60] for d in collected if collected.count(d) > 1})
    assert not twice, f"collected twice: {twice}"
    missing = sorted(d[:60] for d in expected - set(collected))
    assert not missing, f"never collected: {missing}"
    assert len(expected) > 70


def test_public_docstring_examples_import_only_public_names():
    """help() teaches what users should write: no public name's example imports a private module (Trainer,
    OnnxRegressor and OnnxClassifier imported streamfit._engine.testing)."""
    import inspect

    private = {}
    for name in streamfit.__all__:
        obj = getattr(streamfit, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        docs = {name: obj.__doc__ or ""}
        if inspect.isclass(obj):
            docs.update({f"{name}.{m}": getattr(v, "__doc__", "") or "" for m, v in vars(obj).items()
                         if not m.startswith("_") or m == "__init__"})
        for where, doc in docs.items():
            hits = [line.strip() for line in doc.splitlines()
                    if line.strip().startswith((">>>", "...")) and re.search(r"\bstreamfit(?:\.\w+)*\._\w+", line)]
            if hits:
                private[where] = hits
    assert not private, private
