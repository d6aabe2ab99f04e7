"""What the models over hashed categorical columns share: the column mapping, the graph, the columns as ``X``.

The factorization machines (:mod:`streamfit.models.fm`) and the linear models with ``categorical=``
(:mod:`streamfit.models._hashed_linear`) hash their categorical columns into one table of ``buckets`` ids
(:class:`~streamfit.features.Hashed`, each column with its own seed) beside dense columns used as values,
and train :func:`~streamfit.models._fm_graph.fm_model` (without factors for the linear ones).  The mapping
and the graph are made once per parameter set and kept in the estimator's cache
(:mod:`streamfit.estimators._cache`); each model adds its own parameter checks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pyarrow as pa

from streamfit.estimators._cache import caches
from streamfit.models._base import random_generator
from streamfit.models._fm_graph import DENSE, IDS, fm_model

__all__ = ["HashedModel"]

#: the initial scale of the factors when the model has none (fm_model's default)
_NO_FACTORS = (0, 0.01)


class HashedModel:
    """Mixin (first base) of the models over hashed categorical columns and dense columns."""

    categorical: Sequence[str]
    dense: Sequence[str]
    buckets: int
    hash_seed: int
    random_state: Any
    weights: Any = None
    input_name: str | None = None
    output_name: str | None = None

    # -- hooks ------------------------------------------------------------------------------------------
    def _factors(self) -> tuple[int, float]:
        """Rank and initial scale of the pairwise factors (rank 0: a hashed linear model)."""
        return _NO_FACTORS

    def _check_hashed_params(self) -> None:
        """Refuse parameters the model cannot be built from (before the graph is built; a model adds its own)."""
        self._check_columns()

    # -- shared -----------------------------------------------------------------------------------------
    def _check_columns(self) -> None:
        name = type(self).__name__
        for what in ("categorical", "dense"):
            cols = getattr(self, what)
            if isinstance(cols, str) or not hasattr(cols, "__iter__") or not all(isinstance(c, str) and c for c in cols):
                raise ValueError(f"{name}: {what} must be a list of column names, got {cols!r}")

    def _hashed_inputs(self) -> dict[str, Any]:
        """The model inputs from the columns: hashed ids of the categorical ones, the dense ones as values."""
        key = (tuple(self.categorical), tuple(self.dense), self.buckets, self.hash_seed)
        return caches(self).keyed("hashed_inputs", key, self._make_hashed_inputs)  # type: ignore[no-any-return]

    def _make_hashed_inputs(self) -> dict[str, Any]:
        from streamfit.features import Hashed

        out: dict[str, Any] = {}
        if list(self.categorical):
            out[IDS] = Hashed(list(self.categorical), self.buckets, seed=self.hash_seed)
        if list(self.dense):
            out[DENSE] = list(self.dense)
        return out

    def _hashed_graph(self, n_outputs: int) -> Any:
        """The ONNX graph (built once per parameter set, with initial factors from ``random_state``)."""
        n_factors, init_scale = self._factors()
        key = (tuple(self.categorical), tuple(self.dense), self.buckets, n_factors, init_scale, n_outputs)
        return caches(self).keyed("graph", key, lambda: self._build_graph(n_outputs))

    def _build_graph(self, n_outputs: int) -> Any:
        self._check_hashed_params()
        n_factors, init_scale = self._factors()
        return fm_model(len(self.categorical), len(self.dense), int(self.buckets), int(n_factors),
                        random_generator(self.random_state), init_scale, n_outputs=n_outputs)

    def _columns_X(self, X: Any, what: str) -> Any:
        """``X`` as the column plan takes it: a dict of columns made a table (encoded inputs as they are); any
        other kind than a table, a dict or named rows refused, naming the columns (``what``: the model)."""
        from streamfit._columns.memory import holds_inputs
        from streamfit._engine.prepare.input_signature import NamedRows

        if isinstance(X, Mapping) and not holds_inputs(X, self._hashed_inputs()):  # the plan decides
            X = pa.table({k: pa.array(v) for k, v in X.items()})
        if not isinstance(X, (pa.Table, pa.RecordBatch, Mapping, NamedRows)):
            raise TypeError(f"{what} takes an Arrow Table/RecordBatch or a dict of columns (categorical "
                            f"{list(self.categorical)}, dense {list(self.dense)}), got {type(X).__name__}")
        return X
