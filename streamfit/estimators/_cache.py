"""What an estimator keeps between calls beside its parameters and learned state: one typed object.

Everything here is derived -- from the parameters (the hashed models' column mapping and graph, the dense
models' ``inputs=`` shorthand), from the classes (one-row labels already encoded) or from the fitted
trainer (the one-row path) -- so it can always be made again.  Each entry made from parameters holds the
key it was made from and is made again when the key changes (a ``set_params`` or a plain assignment);
the one-row path checks itself before every call (``current``); the one-row labels are forgotten when the
classes are set (:meth:`EstimatorCache.classes_set`).  Pickling (``__getstate__``: a copy, Ray's
transfer, ``copy.deepcopy``) leaves the one-row path out, as it holds the trainer's sessions; a clone starts
with a cache of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

__all__ = ["EstimatorCache", "Keyed", "caches"]

#: the estimator attribute that holds its EstimatorCache
ATTRIBUTE = "_caches"


@dataclass(frozen=True)
class Keyed:
    """A value and the key (parameters) it was made from."""

    key: Any
    value: Any


@dataclass
class EstimatorCache:
    """The derived state of one estimator (see the module docstring)."""

    #: the hashed models' ``inputs`` mapping (hashed ids, dense columns), keyed by the hashing parameters:
    #: one object while they stay (the column plan is cached on it)
    hashed_inputs: Keyed | None = None
    #: the dense models' ``inputs=`` shorthand as the mapping ``{"X": given}``, keyed by the given object
    shorthand: Keyed | None = None
    #: the hashed models' ONNX graph, keyed by the parameters it is built from
    graph: Keyed | None = None
    #: the parameters whose checks passed (checked once per parameter set, not per one-row call)
    checked: Any = None
    #: a one-row label -> its encoded target (read-only arrays; emptied when the classes are set)
    labels: dict[Any, Any] = field(default_factory=dict)
    #: the one-row path of a per-event stream (models/_rows.py: a RowPath), or None
    rows: Any = None

    def keyed(self, slot: str, key: Any, make: Callable[[], Any]) -> Any:
        """The value in ``slot`` if it was made from ``key``, else ``make()`` kept there with ``key``."""
        held = getattr(self, slot)
        if held is None or held.key != key:
            held = Keyed(key, make())
            setattr(self, slot, held)
        return held.value

    def classes_set(self) -> None:
        """The classes were set (a first fit, a load): labels encoded by the old ones are forgotten."""
        self.labels = {}

    def for_pickle(self) -> "EstimatorCache":
        """A copy without the one-row path (it holds the trainer, which travels as its model and state)."""
        return replace(self, rows=None, labels=dict(self.labels))


def caches(est: Any) -> EstimatorCache:
    """``est``'s cache, made on first use (``__init__`` stores parameters only)."""
    cache = est.__dict__.get(ATTRIBUTE)
    if cache is None:
        cache = est.__dict__[ATTRIBUTE] = EstimatorCache()
    return cache
