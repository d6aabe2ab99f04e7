"""``categorical=`` on the ready-made linear models: VW's hashing trick beside dense columns.

``LogisticRegression(categorical=[...], dense=[...], buckets=2**18)`` and its regressor twin become a hashed
linear model: every categorical column hashed (:class:`~streamfit.features.Hashed`, one table of
``buckets`` ids, each column with its own seed) and one-hot encoded, which is a ``Gather`` of one weight
row per field; dense columns enter with a weight each.  The graph is
:func:`~streamfit.models._fm_graph.fm_model` without factors (:class:`~streamfit.models._hashed.HashedModel`
makes it and the column mapping); its table is trained row-sparsely (a step costs the rows its batch
touches, whatever ``buckets`` is), and ``to_onnx()`` takes the raw columns.  Without ``categorical`` the
models are the dense ones, unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from streamfit.estimators._cache import caches
from streamfit.models._hashed import HashedModel

__all__ = ["HashedLinear"]


class HashedLinear(HashedModel):
    """Mixin (first base) of :class:`~streamfit.LinearRegressor` and :class:`~streamfit.LogisticRegression`:
    the hashed model while ``categorical`` is set, the dense one otherwise."""

    learning_rate: Any

    @property
    def _hashed(self) -> bool:
        cat = self.__dict__.get("categorical")
        if cat is None or isinstance(cat, str):
            return cat is not None
        try:
            return len(cat) > 0
        except TypeError:  # not a list: the fit's checks say so
            return True

    def _auto_eta0(self) -> float:
        """``eta0="auto"``: Adam (and AdamW) at ``0.005 * sqrt(batch_size)``, at most 0.01 (from 4 rows a step); other
        optimizers at their own rate.  One row a step takes half the step of a mini-batch: on 15 of River's
        streams and generators, 0.005 met River's progressive metric on all 15 at ``batch_size=1`` and 0.01 on 13;
        from 4 rows a step 0.01 did as well as any (``bench/eta0_study.py``; hashed columns alike)."""
        from streamfit.optim import Adam

        opt = self._optimizer()  # type: ignore[attr-defined]
        if not isinstance(opt, Adam):
            return float(opt.auto_eta0())
        size = self.__dict__.get("batch_size")
        rows = size if isinstance(size, int) and size >= 1 else 1  # a bad batch_size: the fit's checks say so
        return min(0.01, 0.005 * math.sqrt(rows))

    @property
    def _sparse_tables(self) -> Any:  # type: ignore[override]
        # the hashed table: lazy rules (Adam, penalties) on touched rows, so a step never costs O(buckets)
        return True if self._hashed else "auto"

    def _inputs_mapping(self) -> Mapping[str, Any] | None:
        """``inputs``: the hashed mapping while ``categorical`` is set, else the dense model's (``inputs=``)."""
        if self._hashed:
            try:
                return self._hashed_inputs()
            except (TypeError, ValueError):  # bad parameters: reported by the fit's checks, not by a repr
                pass
        return super()._inputs_mapping()  # type: ignore[misc, no-any-return]

    # -- the hashed model ---------------------------------------------------------------------------
    def _check_hashed_params(self) -> None:
        super()._check_hashed_params()
        name = type(self).__name__
        overlap = set(self.categorical) & set(self.dense)
        if overlap:
            raise ValueError(f"{name}: columns {sorted(overlap)} are both categorical and dense")
        if self.__dict__.get("_inputs_param") is not None:
            raise ValueError(f"{name}: categorical= makes the model's inputs (hashed ids and the dense columns); "
                             "give the dense columns as dense=, not inputs=")
        if getattr(self, "learning_rate", None) in ("pa1", "pa2"):
            raise ValueError(f"{name}: passive-aggressive steps (learning_rate={self.learning_rate!r}) are not "
                             "available with categorical=")

    def _precheck_params(self) -> None:
        """Refuse now what the first fit would refuse in the hashed parameters (columns, buckets, seed), without
        building the table: ``streamfit train|serve`` check a configuration with it before reading a row."""
        if self._hashed:
            self._check_hashed_params()
            self._hashed_inputs()

    def _hashed_width(self) -> int:
        """Output columns of the hashed graph (a hook: classes or targets decide)."""
        return 1

    def _declared_inputs(self) -> tuple[Any, ...]:
        """The model inputs before the first fit (the stream's column plan needs them): the hashed graph's."""
        if not self._hashed:
            return super()._declared_inputs()  # type: ignore[misc, no-any-return]
        from streamfit._engine.prepare.model import _model_input

        graph = self.model.graph
        inits = {i.name for i in graph.initializer}
        return tuple(_model_input(vi) for vi in graph.input if vi.name not in inits)

    @property
    def model(self) -> Any:
        """The hashed graph (None for a dense model: it is built from the data on the first fit)."""
        return self._hashed_graph(self._hashed_width()) if self._hashed else None

    def _check_X(self, X: Any, reset: bool, learn: bool = True) -> Any:
        if not self._hashed:
            return super()._check_X(X, reset, learn)  # type: ignore[misc]
        from streamfit.models._base import ReadyMade

        try:
            key = (tuple(self.categorical), tuple(self.dense), self.__dict__.get("_inputs_param") is None,
                   getattr(self, "learning_rate", None))
        except TypeError:
            key = None
        cache = caches(self)
        if key is None or cache.checked != key:  # once per parameter set, not per (one-row) call
            self._check_hashed_params()
            cache.checked = key
        X = self._columns_X(X, f"{type(self).__name__}(categorical=...)")
        return super(ReadyMade, self)._check_X(X, reset, learn)  # type: ignore[misc]  # not the dense matrix checks

    def _hashed_coef_error(self) -> AttributeError:
        return AttributeError(f"{type(self).__name__}(categorical=...) keeps its weights in a hashed table: "
                              "trainer_.get_weights() has 'linear' (one row per id), 'dense_linear' and 'bias'")
