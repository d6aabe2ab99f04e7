"""Count the package's shape: functions over N lines, import circles between modules (function-level imports
included), and imports that reach up a room of ARCHITECTURE.md's table.  ``python tools/shape.py [N]``."""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "streamfit"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def long_functions(limit: int) -> list[tuple[int, str]]:
    found = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = child.end_lineno - child.lineno + 1
                    if n > limit:
                        found.append((n, f"{name}:{prefix}{child.name}"))
                    walk(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")
        walk(tree, "")
    return sorted(found, reverse=True)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for the type checker only)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        found = set()
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")
                    up = up[: len(up) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                # ``from pkg import submodule`` imports the submodule; ``from pkg import name`` the package
                targets = subs + ([base] if len(subs) < len(node.names) else [])
            found.update(t for t in targets if t in mods and t != name)
        edges[name] = found
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    sys.setrecursionlimit(10000)
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


if __name__ == "__main__":
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    fns = long_functions(limit)
    print(f"functions over {limit} lines: {len(fns)}")
    for n, f in fns:
        print(f"  {n:4d} {f}")
    edges = imports()
    # package-level circles only (ignore parent-package __init__ re-export edges)
    cyc = cycles(edges)
    print(f"module import circles: {len(cyc)}")
    for c in cyc:
        print("  ", c)


#: ARCHITECTURE.md's rooms, lowest first, and the rooms each may import besides itself (``streamfit`` itself is
#: the base too: eagerly it imports only the error tree, its names are imported lazily)
_BASE = {"base"}
_EXT = _BASE | {"engine.common"}
_COLUMNS = _BASE | {"encoders", "columns"}
_ENGINE = _COLUMNS | {"extensions", "engine.common", "engine"}
_MODELS = _ENGINE | {"features", "estimators"}
_STREAM = _COLUMNS | {"features", "sources", "history", "stream"}
_DAEMON = _MODELS | _STREAM | {"checkpoint", "history", "daemon"}
ROOMS: dict[str, tuple[tuple[str, ...], set[str]]] = {
    "base": (("streamfit.exceptions", "streamfit._public", "streamfit._params", "streamfit._arrow"), set()),
    "sources": (("streamfit.sources",), _BASE),
    "checkpoint": (("streamfit.checkpoint",), _BASE),
    "history": (("streamfit.history", "streamfit.report"), _BASE | {"checkpoint"}),
    "encoders": (("streamfit.features._encoders", "streamfit.features._values", "streamfit.features._murmur"), _BASE),
    "columns": (("streamfit._columns",), _COLUMNS),
    "engine.common": (("streamfit._engine.common",), _BASE),
    "extensions": (("streamfit.losses", "streamfit.optim", "streamfit.penalties", "streamfit.schedules"), _EXT),
    "engine": (("streamfit._engine",), _ENGINE),
    "features": (("streamfit.features",), _ENGINE | {"features"}),
    "estimators": (("streamfit.estimators", "streamfit.models"), _MODELS),
    "stream": (("streamfit._stream",), _STREAM),
    "daemon": (("streamfit.daemon",), _DAEMON | {"top"}),
    "distributed": (("streamfit.distributed",), _DAEMON | {"distributed"}),
    "top": (("streamfit.cli", "streamfit._sklearn", "streamfit._preflight", "streamfit.graph", "streamfit.testing",
             "streamfit.river"),
            _DAEMON | {"distributed", "top"}),
}


def room_of(module: str) -> str | None:
    if module == "streamfit":
        return "base"
    best, room = "", None
    for name, (prefixes, _) in ROOMS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, room = p, name
    return room


def reach_ups(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in edges.items():
        ra = room_of(a)
        if ra is None:
            continue
        for b in targets:
            rb = room_of(b)
            if rb is None or rb != ra and rb not in ROOMS[ra][1] | {ra}:
                out.append(f"{a} ({ra}) imports {b} ({rb})")
    return sorted(out)


if __name__ == "__main__":
    ups = reach_ups(imports())
    print(f"reach-ups: {len(ups)}")
    for u in ups:
        print("  ", u)
