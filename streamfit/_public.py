"""Public names for objects defined in private modules (``__module__``, as httpx and anyio set it).

A class or function defined in ``streamfit._engine.trainer`` but imported by users as ``streamfit.Trainer``
says so in its ``__module__`` (reprs, help(), documentation tools, error messages).  doctest finds a
class's examples only in the module its ``__module__`` names, so :func:`reexport` also keeps them collected
exactly once: from the defining module's ``__test__`` when the public module is lazy (the root package),
or from the public module itself, whose ``__test__`` then gets the class's methods with examples.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Iterable

__all__ = ["reexport"]


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def reexport(public: str, namespace: dict[str, Any], names: Iterable[str]) -> None:
    """Set ``__module__ = public`` on the classes and functions ``names`` of ``namespace`` that are defined in
    a private module.

    ``namespace`` is the public module's globals (an eager re-export, called at the end of its ``__init__``;
    the module's doctest finder sees the classes, and its ``__test__`` gets their methods with examples), or
    any other module's for names the lazy root package re-exports (no finder sees those classes any more:
    each goes into its defining module's ``__test__``, and doctest collects it there, methods included).
    Examples of eagerly re-exported names run in the public module's globals, as a user's code would: they
    import what they use.  (doctest attributes a class or a function to the module its ``__module__`` names, a method to the module
    its class is attributed to only if it also has the method's globals.)
    """
    eager = namespace.get("__name__") == public
    for name in names:
        obj = namespace.get(name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not _is_private(obj.__module__):
            continue
        defining = sys.modules[obj.__module__]
        obj.__module__ = public
        if not eager:
            defining.__dict__.setdefault("__test__", {})[name] = obj
            continue
        if not inspect.isclass(obj):
            continue
        tests = namespace.setdefault("__test__", {})
        for attr, value in vars(obj).items():
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if inspect.isfunction(func) and ">>>" in (func.__doc__ or ""):
                tests[f"{name}.{attr}"] = func
