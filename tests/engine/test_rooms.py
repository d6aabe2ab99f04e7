"""The engine's rooms: imports run one way (model preparation -> gradient building -> step strategies -> the
Trainer), no import circles (function-level imports included), and onnxruntime's private API in one module."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import streamfit._engine

# the package's shape tool (tools/shape.py) finds the circles, as it does for tests/test_rooms.py
_SHAPE = pathlib.Path(__file__).resolve().parents[2] / "tools" / "shape.py"
_spec = importlib.util.spec_from_file_location("streamfit_shape", _SHAPE)
assert _spec is not None and _spec.loader is not None
shape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape)

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


def test_imports_run_one_way() -> None:
    edges = _imports(_modules())
    wrong = sorted(f"{a} imports {b}" for a, targets in edges.items() for b in targets
                   if _room(b) not in MAY_IMPORT[_room(a)])
    assert not wrong, wrong


def test_no_import_circles() -> None:
    assert shape.cycles(_imports(_modules())) == []


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
