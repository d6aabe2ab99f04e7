"""The one-row path of the ready-made estimators: a per-event stream's ``(1, n_features)`` float row.

A stream that predicts and learns one event at a time pays the estimator's Python on every row, and at
batch 1 that was most of the cost (the general checks of ``X``, ``y`` and the scalers are written for
batches).  :class:`RowPath` is what a fitted estimator keeps for such rows: the expected shape, a float32
buffer made once, the trainer and scalers it was made for.  A row that fits (an ndarray of that shape
and a float dtype, finite, a label already seen) is checked by a few attribute tests and one ``tolist``,
the running scalers take Welford's update on Python floats, and the row goes to the trainer scaled in
place; anything else -- a first sight of a label, a non-finite value, sample weights, ``classes=``, a
batch, a trainer or scaler replaced since -- returns ``None``/``False`` and takes the general path, which
validates it and says what is wrong.  Both paths compute the same float32 arithmetic (tests compare them).

Every microsecond here is paid once per event beside a step of a few tens of microseconds, and Python run
between two onnxruntime runs also slows the next run (its caches are cold), so the checks are few and flat.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamfit.models.scaler import RunningScaler

__all__ = ["RowPath", "ClassifierRows", "RegressorRows", "row_path", "keep_row_path", "binary_proba", "class_of",
           "proba_of", "in_target_units", "encoded_label"]

_F32 = np.dtype(np.float32)
_PASSIVE_AGGRESSIVE = ("pa1", "pa2")  # steps sized per row from its loss: the general path computes them


def binary_proba(score: float) -> np.ndarray:
    """``[[1 - p, p]]`` for ``p = 1 / (1 + exp(-score))``, in float64 as ``OnnxClassifier._proba`` computes it
    for one row (numpy's exp on a one-element array, then IEEE float64 arithmetic, which Python's is too).

    >>> binary_proba(0.0).tolist()
    [[0.5, 0.5]]
    """
    e = np.array((-score,))
    np.exp(e, out=e)
    p = 1.0 / (1.0 + e.item(0))
    return np.array(((1.0 - p, p),))


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
        return est.__dict__["_one_label"].get(label)
    except (KeyError, TypeError):  # no cache yet, or an unhashable label
        return None


def row_path(est: Any) -> Any:
    """The estimator's one-row path (a :class:`RowPath` or a hashed model's ``HashedRows``) if it has one
    that still fits it, else None."""
    rows = est.__dict__.get("_rows")
    return rows if rows is not None and rows.current(est) else None


def keep_row_path(est: Any, X: Any, kind: Any) -> None:
    """After a general fitting call on ``X``: keep (or renew) a one-row path of ``kind`` for the next calls, if
    ``X`` was the kind of one row it takes and the estimator fits it."""
    if kind.offered(X) and row_path(est) is None and kind.fits(est):
        est._rows = kind(est)


def proba_of(est: Any, out: np.ndarray) -> np.ndarray:
    """A classifier's class probabilities of one row's output (before its step): one sigmoid on a binary
    logit (:func:`binary_proba`), the classifier's ``_proba`` otherwise."""
    if out.size == 1 and est.binary_ and getattr(est, "output_kind_", "scores") != "probabilities":
        return binary_proba(out.item(0))
    return est._proba(out.reshape(1 if est.binary_ else (1, -1)))


def in_target_units(target: Any, out: np.ndarray) -> np.ndarray:
    """One row's float32 output as the float64 prediction in target units (``target``: the target scaler, or
    None), with the general path's float64 arithmetic."""
    value = out.item(0)
    if target is not None:
        mean, scale = target.float64()
        value = value * scale[0] + mean[0]
    return np.array((value,))


def class_of(classes: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The predicted class of one row's output (a logit of the second class, or one score per class), as a
    one-element array of ``classes``' dtype."""
    if out.size == 1:
        return classes[1:2].copy() if out.item(0) > 0 else classes[:1].copy()
    i = int(out.argmax())
    return classes[i:i + 1].copy()


class RowPath:
    """What the one-row path of a fitted estimator needs, made once (and again when the estimator's trainer
    or scalers are replaced: :meth:`current` says whether it still fits; the estimator asks it through
    :func:`row_path` before every call, so the methods below assume it does)."""

    __slots__ = ("trainer", "scaler", "update", "host_scaled", "shape", "buf", "step")

    def __init__(self, est: Any) -> None:
        self.trainer = est.trainer_
        self.step = self.trainer.step
        self.scaler = est.__dict__.get("scaler_")
        #: the running scaler's one-row update (None: no scaler, or a fixed one)
        self.update = self.scaler.update_row if isinstance(self.scaler, RunningScaler) else None
        #: the row is scaled here (a model pickled before the graph scaled its inputs), else by the graph
        self.host_scaled = self.scaler is not None and not est._scaler_in_graph()
        self.shape = (1, int(est.n_features_in_))
        self.buf = np.empty(self.shape, _F32)

    @classmethod
    def offered(cls, X: Any) -> bool:
        """Whether ``X`` is what this path takes: one row as an ndarray."""
        return type(X) is np.ndarray and X.ndim == 2 and X.shape[0] == 1

    @classmethod
    def fits(cls, est: Any) -> bool:
        """Whether ``est`` can use a one-row path (float32 weights, one float input, plain steps)."""
        trainer = est.__dict__.get("trainer_")
        return (trainer is not None and trainer.dtype == _F32 and getattr(trainer, "_single", False)
                and est.learning_rate not in _PASSIVE_AGGRESSIVE and getattr(est, "inputs", None) is None)

    #: the estimator attribute, beside its trainer and feature scaler, whose replacement retires the path
    #: (the classes a classifier encodes labels by, a regressor's target scaler)
    watched = ""

    def _watched(self) -> Any:
        raise NotImplementedError

    def current(self, est: Any) -> bool:
        """Whether this path still fits ``est`` (its trainer, scalers and labels not replaced, no
        passive-aggressive steps asked for since)."""
        d = est.__dict__
        return (d.get("trainer_") is self.trainer and d.get("scaler_") is self.scaler
                and d.get(self.watched) is self._watched() and d.get("learning_rate") not in _PASSIVE_AGGRESSIVE)

    def _row(self, X: Any) -> "tuple[np.ndarray, list[float]] | None":
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

    def _scaled(self, X: np.ndarray) -> np.ndarray:
        """The row the trainer takes: as it is when the graph scales it (the scaler keeps the graph's mean and
        scale current), else ``(X - mean) / scale`` in float32 into the buffer (as the scaler's transform)."""
        if not self.host_scaled:
            return X
        mean, scale = self.scaler.float32()
        np.subtract(X, mean, out=self.buf)
        return np.divide(self.buf, scale, out=self.buf)

    def _learn(self, est: Any, row: "tuple[np.ndarray, list[float]]", target: Any) -> bool:
        """A step on a checked row: the feature statistics updated with it first, then the step taken."""
        if self.update is not None:
            self.update(row[1])
        loss = self.step(row[0] if not self.host_scaled else self._scaled(row[0]), target)
        d = est.__dict__
        d["t_"] = self.trainer.n_steps
        d["loss_"] = loss if math.isfinite(loss) else float("nan")
        return True

    def _output(self, X: Any) -> np.ndarray | None:
        """The model's output for a checked row (a reused buffer), or None for the general path."""
        row = self._row(X)
        return None if row is None else self.trainer._predict(self._scaled(row[0]), False)


class ClassifierRows(RowPath):
    """The one-row path of a ready-made classifier: labels are looked up among those already encoded."""

    __slots__ = ("classes",)

    def __init__(self, est: Any) -> None:
        super().__init__(est)
        self.classes = est.classes_

    watched = "classes_"

    def _watched(self) -> Any:
        return self.classes

    def partial_fit(self, est: Any, X: Any, y: Any) -> bool:
        """One step on the row; False (nothing done) when it must take the general path."""
        encoded = encoded_label(est, y)
        if encoded is None:
            return False
        row = self._row(X)
        return row is not None and self._learn(est, row, encoded)

    def partial_fit_predict(self, est: Any, X: Any, y: Any) -> np.ndarray | None:
        """One step on the row, returning the class probabilities of the output the step computed before its
        update; None (nothing done) when it must take the general path."""
        return proba_of(est, self.trainer.last_output) if self.partial_fit(est, X, y) else None

    def predict(self, est: Any, X: Any) -> np.ndarray | None:
        out = self._output(X)
        return None if out is None else class_of(self.classes, out)


class RegressorRows(RowPath):
    """The one-row path of a ready-made regressor with one output (targets scaled as the features are)."""

    __slots__ = ("target", "target_update", "t")

    def __init__(self, est: Any) -> None:
        super().__init__(est)
        self.target = est.__dict__.get("target_scaler_")
        self.target_update = self.target.update_value if isinstance(self.target, RunningScaler) else None
        self.t = np.empty(1, _F32)

    @classmethod
    def fits(cls, est: Any) -> bool:
        return super().fits(est) and int(getattr(est, "n_outputs_", 0)) == 1

    watched = "target_scaler_"

    def _watched(self) -> Any:
        return self.target

    def partial_fit(self, est: Any, X: Any, y: Any) -> bool:
        """One step on the row; False (nothing done) when it must take the general path."""
        T = self.t
        if type(y) is np.ndarray:
            if y.shape != (1,) or y.dtype.kind not in "fiub":
                return False
            T[...] = y
        elif type(y) is list and len(y) == 1 and type(y[0]) in (float, int):
            T[0] = y[0]
        else:
            return False
        t = T.item(0)
        row = self._row(X) if math.isfinite(t) else None  # both checked before any statistics take them
        if row is None:
            return False
        target = self.target
        if target is not None:  # statistics first, as for the features
            if self.target_update is not None:
                self.target_update(t)
            mean, scale = target.float32()
            T[0] = (T[0] - mean[0]) / scale[0]  # numpy float32 scalars: the float32 arithmetic of transform()
        return self._learn(est, row, T)

    def partial_fit_predict(self, est: Any, X: Any, y: Any) -> np.ndarray | None:
        """One step on the row, returning the output the step computed before its update in target units
        (float32, mapped with the target statistics from before the row, as the general path does); None
        (nothing done) when it must take the general path."""
        target = self.target
        if target is not None:
            mean, scale = target.float32()
            mean, scale = mean[0], scale[0]  # numpy float32 scalars: copies, taken before the row's update
        if not self.partial_fit(est, X, y):
            return None
        out = self.trainer.last_output.reshape(1)
        if target is None:
            return out.copy()
        return np.array((out[0] * scale + mean,), _F32)

    def predict(self, est: Any, X: Any) -> np.ndarray | None:
        out = self._output(X)
        return None if out is None else in_target_units(self.target, out)
