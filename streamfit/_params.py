"""Parameters read from the constructor's signature: the one ``get_params`` of losses, optimizers and penalties.

A loss, an optimizer or a penalty stores each constructor argument under its own name (as scikit-learn's
estimators do), so its parameters are the constructor's named arguments read back from the object: no
subclass writes a ``get_params`` of its own, and one that adds an argument has it in ``repr``, equality and
the artifact's spec at once.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["Parameters", "param_names"]

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_NAMES: dict[type, tuple[str, ...]] = {}  # per class: the signature is read once


def param_names(cls: type) -> tuple[str, ...]:
    """The named arguments of ``cls.__init__`` in signature order (``self``, ``*args``, ``**kwargs`` left out),
    as scikit-learn's ``BaseEstimator._get_param_names`` reads them (which sorts them; here the order is kept
    for ``repr``)."""
    names = _NAMES.get(cls)
    if names is None:
        init = cls.__init__  # type: ignore[misc]
        params = [] if init is object.__init__ else list(inspect.signature(init).parameters.values())[1:]
        names = _NAMES[cls] = tuple(p.name for p in params if p.kind in _NAMED)
    return names


class Parameters:
    """Mixin: :meth:`get_params` from the constructor's signature."""

    def get_params(self) -> dict[str, Any]:
        """The constructor's arguments as stored on the object, in signature order (an argument the object
        does not store under its name is left out)."""
        d = self.__dict__
        return {name: d[name] if name in d else getattr(self, name)
                for name in param_names(type(self)) if name in d or hasattr(self, name)}
