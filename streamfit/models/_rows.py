"""The one-row path of the ready-made estimators: one event per call, composed of a reader and a target.

A stream that predicts and learns one event at a time pays the estimator's Python on every row, and at
batch 1 that was most of the cost (the general checks of ``X``, ``y`` and the scalers are written for
batches).  :class:`RowPath` is what a fitted estimator keeps for such rows, made of two parts:

- a **reader**, the row's model inputs: :class:`DenseRow` (a ``(1, n_features)`` float ndarray, scaled by
  the running feature statistics) or :class:`~streamfit.models._hashed_rows.HashedRow` (a one-row Arrow
  table, record batch or dict of columns, hashed in Python);
- a **target**, the row's label and what an output means: :class:`LabelTarget` (a classifier's label among
  those already encoded; probabilities, classes) or :class:`ScaledTarget` (a regressor's one target,
  standardized by the running target statistics; predictions in target units).

A row that fits is checked by a few attribute tests, its statistics take Welford's update on Python
floats, and it goes to the trainer; anything else -- a first sight of a label, a non-finite value, sample
weights, ``classes=``, a batch, a trainer, scaler or parameter replaced since -- returns ``None``/``False``
and takes the general path, which validates it and says what is wrong.  Both paths compute the same
float32 arithmetic (tests compare them).

Every microsecond here is paid once per event beside a step of a few tens of microseconds, and Python run
between two onnxruntime runs also slows the next run (its caches are cold), so the checks are few and flat.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamfit.estimators._cache import ATTRIBUTE as CACHE, caches
from streamfit.models.scaler import RunningScaler

__all__ = ["RowPath", "DenseRow", "LabelTarget", "ScaledTarget", "row_path", "keep_row_path", "binary_proba",
           "class_of", "proba_of", "in_target_units", "encoded_label", "PASSIVE_AGGRESSIVE"]

_F32 = np.dtype(np.float32)
_exp = np.exp
#: steps sized per row from its loss (learning_rate="pa1"/"pa2"): the general path computes them
PASSIVE_AGGRESSIVE = ("pa1", "pa2")


# -- what an output means ----------------------------------------------------------------------------
def binary_proba(score: float) -> np.ndarray:
    """``[[1 - p, p]]`` for ``p = 1 / (1 + exp(-score))``, in float64 as ``OnnxClassifier._proba`` computes it
    for one row (numpy's exp on a one-element array, then IEEE float64 arithmetic, which Python's is too).

    >>> binary_proba(0.0).tolist()
    [[0.5, 0.5]]
    """
    p = 1.0 / (1.0 + float(_exp(-score)))  # numpy's exp of one value: the loop an array's elements take
    out = np.empty((1, 2))
    out[0, 0] = 1.0 - p
    out[0, 1] = p
    return out


def proba_of(est: Any, out: np.ndarray) -> np.ndarray:
    """A classifier's class probabilities of one row's output (before its step): one sigmoid on a binary
    logit (:func:`binary_proba`), the classifier's ``_proba`` otherwise."""
    if out.size == 1 and est.binary_ and getattr(est, "output_kind_", "scores") != "probabilities":
        return binary_proba(out.item(0))
    return est._proba(out.reshape(1 if est.binary_ else (1, -1)))


def class_of(classes: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The predicted class of one row's output (a logit of the second class, or one score per class), as a
    one-element array of ``classes``' dtype."""
    if out.size == 1:
        return classes[1:2].copy() if out.item(0) > 0 else classes[:1].copy()
    i = int(out.argmax())
    return classes[i:i + 1].copy()


def in_target_units(target: Any, out: np.ndarray) -> np.ndarray:
    """One row's float32 output as the float64 prediction in target units (``target``: the target scaler, or
    None), with the general path's float64 arithmetic."""
    value = out.item(0)
    if target is not None:
        mean, scale = target.float64()
        value = value * scale[0] + mean[0]
    return np.array((value,))


def encoded_label(est: Any, y: Any) -> Any:
    """The encoded target of a one-row label ``y`` (a 1-element ndarray or list) already seen by ``est``'s
    general path, which fills the cache; None when the row must take the general path."""
    if type(y) is np.ndarray:
        if y.shape != (1,):
            return None
        label = y.item()
    elif type(y) is list and len(y) == 1:
        label = y[0]
    else:
        return None
    try:
        return est.__dict__[CACHE].labels.get(label)
    except (KeyError, TypeError):  # no cache yet, or an unhashable label
        return None


# -- targets -------------------------------------------------------------------------------------------
class LabelTarget:
    """A classifier's one-row label: looked up among those already encoded (the classes it encodes by
    watched: new classes retire the path)."""

    __slots__ = ("held",)
    #: the estimator attribute whose replacement retires the path
    watched = "classes_"

    def __init__(self, est: Any) -> None:
        self.held = est.classes_

    @classmethod
    def fits(cls, est: Any) -> bool:
        return True

    def read(self, est: Any, y: Any) -> Any:
        """The encoded label (the trainer's target), or None for the general path."""
        return encoded_label(est, y)

    def learn(self, T: Any) -> Any:
        return T

    def before(self) -> None:
        return None

    def output(self, est: Any, out: np.ndarray, before: None) -> np.ndarray:
        """The class probabilities of the output a step computed before its update."""
        return proba_of(est, out)

    def prediction(self, out: np.ndarray) -> np.ndarray:
        return class_of(self.held, out)


class ScaledTarget:
    """A regressor's one target, standardized by the running target statistics as the general path does
    (statistics first); outputs mapped back to target units."""

    __slots__ = ("held", "update", "t", "value")
    watched = "target_scaler_"

    def __init__(self, est: Any) -> None:
        self.held = est.__dict__.get("target_scaler_")
        #: the running target scaler's one-value update (None: no scaler)
        self.update = self.held.update_value if isinstance(self.held, RunningScaler) else None
        self.t = np.empty(1, _F32)
        self.value = 0.0  # the float32 target just read, as a Python float

    @classmethod
    def fits(cls, est: Any) -> bool:
        """One output (the path reads one target per row)."""
        return int(getattr(est, "n_outputs_", 0)) == 1

    def read(self, est: Any, y: Any) -> np.ndarray | None:
        """The target as float32 (a buffer), or None when it is not one finite number (the general path's)."""
        T = self.t
        if type(y) is np.ndarray:
            if y.shape != (1,) or y.dtype.kind not in "fiub":
                return None
            T[...] = y
        elif type(y) is list and len(y) == 1 and type(y[0]) in (float, int):
            T[0] = y[0]
        else:
            return None
        value = self.value = T.item(0)
        return T if math.isfinite(value) else None

    def learn(self, T: np.ndarray) -> np.ndarray:
        """The target the trainer takes: the statistics updated with it, then it standardized in place."""
        target = self.held
        if target is not None:
            if self.update is not None:
                self.update(self.value)
            mean, scale = target.float32()
            T[0] = (T[0] - mean[0]) / scale[0]  # numpy float32 scalars: the float32 arithmetic of transform()
        return T

    def before(self) -> Any:
        """The target statistics before a row's update (float32 scalar copies), or None without a scaler."""
        if self.held is None:
            return None
        mean, scale = self.held.float32()
        return mean[0], scale[0]

    def output(self, est: Any, out: np.ndarray, before: Any) -> np.ndarray:
        """The output a step computed before its update, in target units by the statistics from before the
        row (float32, as the general path maps it)."""
        out = out.reshape(1)
        if before is None:
            return out.copy()
        mean, scale = before
        return np.array((out[0] * scale + mean,), _F32)

    def prediction(self, out: np.ndarray) -> np.ndarray:
        return in_target_units(self.held, out)


# -- the dense reader ----------------------------------------------------------------------------------
class DenseRow:
    """A ``(1, n_features)`` float row as the trainer takes it (scaled by the graph, or here for a model
    pickled before the graph scaled its inputs), the running feature statistics updated with it."""

    __slots__ = ("scaler", "update", "host_scaled", "shape", "buf")

    def __init__(self, est: Any) -> None:
        self.scaler = est.__dict__.get("scaler_")
        #: the running scaler's one-row update (None: no scaler, or a fixed one)
        self.update = self.scaler.update_row if isinstance(self.scaler, RunningScaler) else None
        #: the row is scaled here (a model pickled before the graph scaled its inputs), else by the graph
        self.host_scaled = self.scaler is not None and not est._scaler_in_graph()
        self.shape = (1, int(est.n_features_in_))
        self.buf = np.empty(self.shape, _F32)

    @classmethod
    def offered(cls, X: Any) -> bool:
        """Whether ``X`` is what this reader takes: one row as an ndarray."""
        return type(X) is np.ndarray and X.ndim == 2 and X.shape[0] == 1

    @classmethod
    def fits(cls, est: Any) -> bool:
        """Whether ``est`` can use it (float32 weights, one float input, plain steps, no ``inputs=``)."""
        trainer = est.__dict__.get("trainer_")
        return (trainer is not None and trainer.dtype == _F32 and getattr(trainer, "_single", False)
                and est.learning_rate not in PASSIVE_AGGRESSIVE and getattr(est, "inputs", None) is None)

    def current(self, est: Any) -> bool:
        """The feature scaler not replaced, no passive-aggressive steps asked for since."""
        d = est.__dict__
        return d.get("scaler_") is self.scaler and d.get("learning_rate") not in PASSIVE_AGGRESSIVE

    def read(self, X: Any) -> "tuple[np.ndarray, list[float]] | None":
        """``X`` as a float32 row and its values, or None when it is not a finite float row of the shape."""
        if type(X) is not np.ndarray or X.shape != self.shape:
            return None
        if X.dtype is not _F32:
            if X.dtype.kind != "f":
                return None
            self.buf[...] = X  # the general path casts to float32 before anything else too
            X = self.buf
        values = X.tolist()[0]
        return (X, values) if math.isfinite(sum(values)) else None

    def learn(self, row: "tuple[np.ndarray, list[float]]") -> np.ndarray:
        """The row the trainer steps on: the feature statistics updated with it first."""
        if self.update is not None:
            self.update(row[1])
        return self.inputs(row) if self.host_scaled else row[0]

    def inputs(self, row: "tuple[np.ndarray, list[float]]") -> np.ndarray:
        """The row the trainer takes: as it is when the graph scales it (the scaler keeps the graph's mean and
        scale current), else ``(X - mean) / scale`` in float32 into the buffer (as the scaler's transform)."""
        X = row[0]
        if not self.host_scaled:
            return X
        mean, scale = self.scaler.float32()
        np.subtract(X, mean, out=self.buf)
        return np.divide(self.buf, scale, out=self.buf)


# -- the path ------------------------------------------------------------------------------------------
class RowPath:
    """A fitted estimator's one-row path: its trainer, a reader and a target, made once (and again when the
    trainer, a scaler, the classes or a parameter they depend on change: :meth:`current`, asked through
    :func:`row_path` before every call, so the methods below assume it holds)."""

    __slots__ = ("trainer", "step", "reader", "target", "rows")

    def __init__(self, est: Any, reader: Any, target: Any) -> None:
        self.trainer = est.trainer_
        self.step = self.trainer.step
        self.reader = reader
        self.target = target
        self.rows = 0  # rows this path took (tests check that one-row calls use it)

    def current(self, est: Any) -> bool:
        """Whether this path still fits ``est``."""
        d = est.__dict__
        target = self.target
        return (d.get("trainer_") is self.trainer and d.get(target.watched) is target.held
                and self.reader.current(est))

    def partial_fit(self, est: Any, X: Any, y: Any) -> bool:
        """One step on the row; False (nothing done) when it must take the general path."""
        target, reader = self.target, self.reader
        T = target.read(est, y)
        row = None if T is None else reader.read(X)  # both checked before any statistics take them
        if row is None:
            return False
        loss = self.step(reader.learn(row), target.learn(T))
        d = est.__dict__
        d["t_"] = self.trainer.n_steps
        d["loss_"] = loss if math.isfinite(loss) else float("nan")
        self.rows += 1
        return True

    def partial_fit_predict(self, est: Any, X: Any, y: Any) -> np.ndarray | None:
        """One step on the row, returning what the output it computed before its update means (class
        probabilities, a prediction in target units); None (nothing done) when it must take the general path."""
        before = self.target.before()
        if not self.partial_fit(est, X, y):
            return None
        return self.target.output(est, self.trainer.last_output, before)  # type: ignore[no-any-return]

    def output(self, X: Any) -> np.ndarray | None:
        """The model's output of one row (a reused buffer), or None when the row must take the general path."""
        row = self.reader.read(X)
        if row is None:
            return None
        self.rows += 1
        return self.trainer._predict(self.reader.inputs(row), False)  # type: ignore[no-any-return]

    def predict(self, est: Any, X: Any) -> np.ndarray | None:
        out = self.output(X)
        return None if out is None else self.target.prediction(out)  # type: ignore[no-any-return]

    def predict_proba(self, est: Any, X: Any) -> np.ndarray | None:
        """A classifier's class probabilities of one row (as ``predict_proba`` computes them), or None when the
        row must take the general path."""
        out = self.output(X)
        return None if out is None else proba_of(est, out)


def row_path(est: Any) -> RowPath | None:
    """The estimator's one-row path if it has one that still fits it, else None."""
    cache = est.__dict__.get(CACHE)
    rows = cache.rows if cache is not None else None
    return rows if rows is not None and rows.current(est) else None


def keep_row_path(est: Any, X: Any) -> None:
    """After a general fitting call on ``X``: keep (or renew) a one-row path for the next calls, if ``X`` was
    the kind of one row its reader takes (``est._row_reader()``) and the estimator fits both parts."""
    reader, target = est._row_reader(), est._row_target
    if reader.offered(X) and row_path(est) is None and reader.fits(est) and target.fits(est):
        caches(est).rows = RowPath(est, reader(est), target(est))
