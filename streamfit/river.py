"""River interplay: the ready-made dense models as River estimators (``learn_one``/``predict_one`` on dicts).

:class:`RiverClassifier` and :class:`RiverRegressor` wrap a :class:`~streamfit.LogisticRegression`,
:class:`~streamfit.LinearRegressor`, :class:`~streamfit.MLPClassifier` or :class:`~streamfit.MLPRegressor`
(unfitted: a parameter, as River's wrappers take one; each wrapper trains its own copy, ``estimator_``).
When River is installed they are ``river.base.MiniBatchClassifier`` / ``MiniBatchRegressor`` subclasses, so
River's ``evaluate.progressive_val_score``, pipelines (``StandardScaler() | RiverClassifier()``), ``clone``
and ``river.checks.check_estimator`` take them; without River they have the same methods.

Rows are dicts ``{feature name: number}`` (or pandas frames for the ``*_many`` methods).  Features are
learned by name as they appear: a row with a new feature widens the model (its new weights start at zero,
the scaler's statistics of that feature as if it had been 0 so far), and a feature missing from a row is 0 in
that row, for learning and predicting alike (a sparse row; NaN in a frame is missing too).  A feature never
learned is ignored when predicting.  Before any learning a classifier predicts its classes uniformly, a
regressor 0.0.

The wrapped copy learns one row per step (``batch_size=1``, whatever the estimator given says): ``learn_many``
takes exactly the steps of ``learn_one`` in a loop, the frame's rows given to the estimator's ``partial_fit``
as chunks (River's own linear models take one mean-gradient step per mini-batch instead).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from streamfit.exceptions import BadInputError

try:  # River is optional: with it, the wrappers are River estimators
    from river import base as _river_base

    _ClassifierBase: Any = _river_base.MiniBatchClassifier
    _RegressorBase: Any = _river_base.MiniBatchRegressor
    RIVER_INSTALLED = True
except ImportError:  # pragma: no cover - exercised only without River
    _ClassifierBase = _RegressorBase = object
    RIVER_INSTALLED = False

__all__ = ["RiverClassifier", "RiverRegressor", "to_river", "RIVER_INSTALLED"]

#: the weights whose rows are the input features (the first layer of every ready-made dense model)
_FIRST_LAYER = "coef_0"


def _fresh(estimator: Any, seed: int | None) -> Any:
    """An unfitted copy of ``estimator`` (its parameters, none of its state), seeded by ``seed`` if given, one row
    per step (``batch_size=1``: ``learn_many`` takes the steps of ``learn_one`` in a loop)."""
    params = {**estimator.get_params(deep=False), "batch_size": 1}
    if seed is not None and "random_state" in params:
        params["random_state"] = seed
    return type(estimator)(**params)


def _check_dense(estimator: Any) -> None:
    from streamfit.models._base import ReadyMade

    hashed = bool(getattr(estimator, "categorical", ()))
    if not isinstance(estimator, ReadyMade) or hashed or getattr(estimator, "inputs", None) is not None:
        raise TypeError(f"the River wrappers take a ready-made dense model (LinearRegressor, LogisticRegression, "
                        f"MLPRegressor, MLPClassifier without categorical= or inputs=), got {estimator!r}")


def _widened(state: Mapping[str, Any], width: int, optimizer: Any) -> dict[str, Any]:
    """``state`` (a ready-made model's ``state_dict``) for ``width`` input features, the old ones first: the
    new rows of the first layer zero, their optimizer slots as the optimizer starts them, the scaler's
    statistics of the new features 0 (the feature was 0 in every row so far)."""
    trainer = dict(state["trainer"])
    weights = dict(trainer["weights"])
    old = weights[_FIRST_LAYER]
    grown = np.zeros((width, *old.shape[1:]), old.dtype)
    grown[:len(old)] = old
    weights[_FIRST_LAYER] = grown
    slots = dict(trainer["optimizer"])
    fresh = optimizer.init_state(np.zeros((width - len(old), *old.shape[1:]), old.dtype))
    for slot, init in fresh.items():
        key = f"{_FIRST_LAYER}__{slot}"
        slots[key] = np.concatenate([slots[key], init.astype(slots[key].dtype)])
    trainer["weights"], trainer["optimizer"] = weights, slots
    out = {**state, "trainer": trainer, "n_features_in_": width}
    if "scaler" in state:
        scaler = dict(state["scaler"])
        for key in ("mean", "m2", "shift", "s1", "s2"):
            if key not in scaler:
                continue
            arr = np.asarray(scaler[key])
            scaler[key] = np.concatenate([arr, np.zeros(width - len(arr), arr.dtype)])
        out["scaler"] = scaler
    return out


class _RiverWrapper:
    """What both wrappers share: the feature vocabulary, rows as float32 vectors, widening the model."""

    estimator: Any
    seed: int | None
    _names: list[Any]
    _index: dict[Any, int]

    def _default_estimator(self) -> Any:
        raise NotImplementedError

    def _model(self) -> Any:
        """The fitted copy, or None before the first ``learn_one``."""
        return self.__dict__.get("estimator_")

    def _vocabulary(self) -> dict[Any, int]:
        index = self.__dict__.get("_index")
        if index is None:
            index = self._index = {}
            self._names = []
        return index

    def _learn_features(self, keys: Iterable[Any]) -> None:
        """Add the keys not seen yet (sorted: the order of a row's keys never matters) and widen the model."""
        index = self._vocabulary()
        new = [k for k in keys if k not in index]
        if not new:
            return
        for k in sorted(new, key=repr):
            index[k] = len(self._names)
            self._names.append(k)
        model = self._model()
        if model is not None:
            state = _widened(model.state_dict(), len(self._names), model.trainer_.optimizer)
            wider = _fresh(self._estimator(), self.seed)
            wider.load_state_dict(state)
            self.estimator_ = wider

    def _estimator(self) -> Any:
        est = self.estimator if self.estimator is not None else self._default_estimator()
        _check_dense(est)
        return est

    def _row(self, x: Mapping[Any, Any]) -> np.ndarray:
        """``x`` as a (1, features) float32 row in the vocabulary's order: missing features 0, unknown ignored."""
        index = self._vocabulary()
        row = np.zeros((1, len(index)), np.float32)
        out = row[0]
        for k, v in x.items():
            j = index.get(k)
            if j is None:
                continue
            try:
                out[j] = v
            except (TypeError, ValueError):
                raise BadInputError(f"feature {k!r} is {v!r} ({type(v).__name__}), expected a number",
                                    reason="wrong_type") from None
        if not math.isfinite(float(out.sum())) and not np.isfinite(out).all():
            bad = self._names[int(np.nonzero(~np.isfinite(out))[0][0])]
            raise BadInputError(f"feature {bad!r} is {x[bad]!r}, expected a finite number", reason="non_finite")
        return row

    def _frame_rows(self, X: Any) -> list[dict[Any, Any]]:
        """A pandas frame (or a sequence of dicts) as dicts, NaN cells left out (missing)."""
        if isinstance(X, Sequence) and not isinstance(X, str):
            return [dict(x) for x in X]
        columns = list(X.columns)
        values = X.to_numpy()
        return [{c: v for c, v in zip(columns, row) if not (isinstance(v, float) and v != v)} for row in values]

    def _matrix(self, X: Any) -> np.ndarray:
        """Rows of a frame (or dicts) as a (rows, features) float32 matrix in the vocabulary's order."""
        rows = self._frame_rows(X)
        if not rows:
            return np.zeros((0, len(self._vocabulary())), np.float32)
        return np.concatenate([self._row(x) for x in rows])

    def _learn_rows(self, X: Any, y: Any) -> None:
        """``learn_many``: the rows in order, one step each, the steps of ``learn_one`` in a loop: the frame cut
        where a row brings new features (the model widened there, as ``learn_one`` widens it), each part one
        ``partial_fit`` call (the estimator's chunk path: one session run for the part's steps)."""
        rows = self._frame_rows(X)
        targets = list(y)
        if len(targets) != len(rows):
            raise BadInputError(f"X has {len(rows)} rows but y has {len(targets)}", reason="shape_mismatch")
        index, start = self._vocabulary(), 0
        for i, x in enumerate(rows):
            if any(k not in index for k in x):
                if i > start:
                    self._fit_block(rows[start:i], targets[start:i])
                self._learn_features(x)
                start = i
        if start < len(rows):
            self._fit_block(rows[start:], targets[start:])

    def _fit_block(self, rows: list[dict[Any, Any]], targets: list[Any]) -> None:
        """One ``partial_fit`` of rows whose features are all known (one step per row)."""
        raise NotImplementedError


class RiverClassifier(_RiverWrapper, _ClassifierBase):
    """A ready-made streamfit classifier as a River classifier (``learn_one``, ``predict_proba_one``, ...).

    Parameters
    ----------
    estimator
        An unfitted :class:`~streamfit.LogisticRegression` or :class:`~streamfit.MLPClassifier`; None:
        ``LogisticRegression(batch_size=1)``.  The wrapper trains a copy of it (``estimator_``).
    classes
        The labels, when more than two (a multinomial model over them); None: a binary classifier whose
        labels are taken as booleans, as River's binary classifiers take them (``predict_proba_one`` has the
        keys False and True).
    seed
        When given, the copy's ``random_state`` (River's name for it: ``check_estimator`` seeds through it).

    Examples
    --------
    >>> from river import datasets, evaluate, metrics
    >>> from streamfit.river import RiverClassifier
    >>> metric = evaluate.progressive_val_score(datasets.Phishing(), RiverClassifier(), metrics.Accuracy())
    >>> metric.get() > 0.88
    True
    """

    def __init__(self, estimator: Any = None, classes: tuple[Any, ...] | None = None, seed: int | None = None) -> None:
        self.estimator = estimator
        self.classes = classes
        self.seed = seed

    def _default_estimator(self) -> Any:
        from streamfit.models import LogisticRegression

        return LogisticRegression(batch_size=1)

    @property
    def _multiclass(self) -> bool:
        return self.classes is not None and len(self.classes) > 2

    def _labels(self) -> list[Any]:
        return [False, True] if self.classes is None else sorted(self.classes, key=repr)

    def _label(self, y: Any) -> Any:
        if self.classes is None:  # River's binary convention: False/True (or 0/1); anything else would be silently True
            if isinstance(y, (bool, np.bool_)) or (isinstance(y, (int, np.integer)) and y in (0, 1)):
                return bool(y)
            raise BadInputError(f"label {y!r} is not a boolean: RiverClassifier() without classes= is binary over "
                                f"False/True (0/1), as River's binary classifiers are; give the labels, e.g. "
                                f"RiverClassifier(classes=({y!r}, ...))", reason="unknown_label")
        if y not in self.classes:
            raise BadInputError(f"label {y!r} is not one of classes={self.classes!r}", reason="unknown_label")
        return y

    def learn_one(self, x: Mapping[Any, Any], y: Any, **kwargs: Any) -> None:
        """One training step on one row (the estimator's one-row path).

        Parameters
        ----------
        x
            The row: ``{feature: value}`` (a feature not seen before widens the model).
        y
            Its label.
        **kwargs
            River's other arguments of ``learn_one`` (ignored).
        """
        label = self._label(y)
        index = self._vocabulary()
        if len(index) < len(x) or any(k not in index for k in x):
            self._learn_features(x)
        model = self._model()
        row = self._row(x)
        if model is None:
            model = _fresh(self._estimator(), self.seed)
            model.partial_fit(row, [label], classes=self._labels())
            self.estimator_ = model
            return
        model.partial_fit(row, [label])

    def _fit_block(self, rows: list[dict[Any, Any]], targets: list[Any]) -> None:
        labels = [self._label(t) for t in targets]
        M = np.concatenate([self._row(x) for x in rows])
        model = self._model()
        if model is None:
            model = _fresh(self._estimator(), self.seed)
            model.partial_fit(M, labels, classes=self._labels())
            self.estimator_ = model
            return
        model.partial_fit(M, labels)

    def predict_proba_one(self, x: Mapping[Any, Any], **kwargs: Any) -> dict[Any, float]:
        model = self._model()
        if model is None:
            labels = self._labels()
            return {c: 1.0 / len(labels) for c in labels}
        proba = model.predict_proba(self._row(x))[0]
        return dict(zip(model.classes_.tolist(), proba.tolist()))

    def learn_many(self, X: Any, y: Any, **kwargs: Any) -> None:
        """Learn the rows of a pandas frame (and its labels) one by one, as ``learn_one`` in a loop.

        Parameters
        ----------
        X
            A pandas DataFrame of rows.
        y
            A pandas Series of their labels.
        **kwargs
            River's other arguments (ignored).
        """
        self._learn_rows(X, y)

    def predict_proba_many(self, X: Any) -> Any:
        """A frame of class probabilities, one column per class (one prediction of the whole frame).

        Parameters
        ----------
        X
            A pandas DataFrame of rows.
        """
        import pandas as pd

        model = self._model()
        labels = model.classes_.tolist() if model is not None else self._labels()
        M = self._matrix(X)
        proba = model.predict_proba(M) if model is not None and len(M) else \
            np.full((len(M), len(labels)), 1.0 / len(labels))
        return pd.DataFrame(proba, columns=labels, index=getattr(X, "index", None))

    def predict_many(self, X: Any) -> Any:
        """The most probable class of each row, a pandas Series.

        Parameters
        ----------
        X
            A pandas DataFrame of rows.
        """
        import pandas as pd

        proba = self.predict_proba_many(X)
        return pd.Series([proba.columns[i] for i in np.argmax(proba.to_numpy(), axis=1)], index=proba.index,
                         dtype=object)

    @classmethod
    def _unit_test_params(cls) -> Any:
        from streamfit.models import LogisticRegression

        yield {"estimator": LogisticRegression(batch_size=1, random_state=0)}


class RiverRegressor(_RiverWrapper, _RegressorBase):
    """A ready-made streamfit regressor as a River regressor (``learn_one``, ``predict_one``, ...).

    Parameters
    ----------
    estimator
        An unfitted :class:`~streamfit.LinearRegressor` or :class:`~streamfit.MLPRegressor`; None:
        ``LinearRegressor(batch_size=1)``.  The wrapper trains a copy of it (``estimator_``).
    seed
        When given, the copy's ``random_state``.

    Examples
    --------
    >>> from river import datasets, evaluate, metrics
    >>> from streamfit.river import RiverRegressor
    >>> metric = evaluate.progressive_val_score(datasets.TrumpApproval(), RiverRegressor(), metrics.MAE())
    >>> metric.get() < 1.0
    True
    """

    def __init__(self, estimator: Any = None, seed: int | None = None) -> None:
        self.estimator = estimator
        self.seed = seed

    def _default_estimator(self) -> Any:
        from streamfit.models import LinearRegressor

        return LinearRegressor(batch_size=1)

    def learn_one(self, x: Mapping[Any, Any], y: Any, **kwargs: Any) -> None:
        """One training step on one row (the estimator's one-row path).

        Parameters
        ----------
        x
            The row: ``{feature: value}`` (a feature not seen before widens the model).
        y
            Its target.
        **kwargs
            River's other arguments of ``learn_one`` (ignored).
        """
        index = self._vocabulary()
        if len(index) < len(x) or any(k not in index for k in x):
            self._learn_features(x)
        model = self._model()
        row = self._row(x)
        if model is None:
            model = _fresh(self._estimator(), self.seed)
            self.estimator_ = model
        model.partial_fit(row, [float(y)])

    def _fit_block(self, rows: list[dict[Any, Any]], targets: list[Any]) -> None:
        M = np.concatenate([self._row(x) for x in rows])
        model = self._model()
        if model is None:
            model = _fresh(self._estimator(), self.seed)
            self.estimator_ = model
        model.partial_fit(M, np.array([float(t) for t in targets]))

    def predict_one(self, x: Mapping[Any, Any], **kwargs: Any) -> float:
        model = self._model()
        if model is None:
            return 0.0
        return float(model.predict(self._row(x))[0])

    def learn_many(self, X: Any, y: Any, **kwargs: Any) -> None:
        """Learn the rows of a pandas frame (and its targets) one by one, as ``learn_one`` in a loop.

        Parameters
        ----------
        X
            A pandas DataFrame of rows.
        y
            A pandas Series of their targets.
        **kwargs
            River's other arguments (ignored).
        """
        self._learn_rows(X, y)

    def predict_many(self, X: Any) -> Any:
        """The prediction of each row, a pandas Series (one prediction of the whole frame).

        Parameters
        ----------
        X
            A pandas DataFrame of rows.
        """
        import pandas as pd

        model = self._model()
        M = self._matrix(X)
        pred = model.predict(M).astype(np.float64) if model is not None and len(M) else np.zeros(len(M))
        return pd.Series(pred, index=getattr(X, "index", None), dtype=np.float64)

    @classmethod
    def _unit_test_params(cls) -> Any:
        from streamfit.models import LinearRegressor

        yield {"estimator": LinearRegressor(batch_size=1, random_state=0)}


def to_river(estimator: Any, **params: Any) -> "RiverClassifier | RiverRegressor":
    """The River wrapper of a ready-made dense model: :class:`RiverClassifier` for a classifier, else
    :class:`RiverRegressor`; ``params`` go to the wrapper (``classes``, ``seed``).

    Parameters
    ----------
    estimator
        A ready-made dense model (``LinearRegressor``, ``LogisticRegression``, ``MLPRegressor``,
        ``MLPClassifier``), fitted or not.
    **params
        The wrapper's own arguments (``classes``, ``seed``).
    """
    _check_dense(estimator)
    if hasattr(estimator, "predict_proba"):
        return RiverClassifier(estimator, **params)
    return RiverRegressor(estimator, **params)
