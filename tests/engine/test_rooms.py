"""The engine's rooms: imports run one way (model preparation -> gradient building -> step strategies -> the
Trainer), no import circles (function-level imports included), and onnxruntime's private API in one module."""

from __future__ import annotations

import ast
import pathlib

import streamfit._engine

ENGINE = pathlib.Path(streamfit._engine.__file__).parent
PKG = "streamfit._engine"
#: each room and the rooms its modules may import (a room may import itself; the top: the Trainer, the artifact)
MAY_IMPORT = {
    "common": {"common"},
    "prepare": {"common", "prepare"},
    "gradient": {"common", "prepare", "gradient"},
    "runtime": {"common", "prepare", "runtime"},
    "steps": {"common", "prepare", "gradient", "runtime", "steps"},
    "top": {"common", "prepare", "gradient", "runtime", "steps", "top"},
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE).with_suffix("").parts
        name = ".".join((PKG,) + (parts[:-1] if parts[-1] == "__init__" else parts))
        out[name] = path
    return out


def _room(module: str) -> str:
    """The room of an engine module: its subpackage (``streamfit._engine.steps.fused`` -> ``steps``), or the top."""
    first = module[len(PKG) + 1:].split(".")[0]
    return first if first in MAY_IMPORT and first != "top" else "top"


def _imports(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Every engine module each module imports, at module or function level."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found.update(t for t in targets if t in modules and t != name and t != PKG)
        edges[name] = found
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return groups


def test_imports_run_one_way() -> None:
    edges = _imports(_modules())
    wrong = sorted(f"{a} imports {b}" for a, targets in edges.items() for b in targets
                   if _room(b) not in MAY_IMPORT[_room(a)])
    assert not wrong, wrong


def test_no_import_circles() -> None:
    assert _cycles(_imports(_modules())) == []


def test_onnxruntime_private_api_in_one_module() -> None:
    adapter = ENGINE / "common" / "ort_private.py"
    users = []
    for path in ENGINE.rglob("*.py"):
        if path == adapter:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("onnxruntime.capi") \
                    or isinstance(node, ast.Import) and any(a.name.startswith("onnxruntime.capi") for a in node.names) \
                    or isinstance(node, ast.Attribute) and node.attr == "_sess":
                users.append(f"{path.relative_to(ENGINE)}:{node.lineno}")
    assert users == []
