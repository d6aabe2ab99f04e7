"""Progressive validation: each batch is predicted by the model *before* it trains on it.

Every evaluated row is an honest out-of-sample prediction, so the running mean is a test metric
obtained for free on a stream.  Metrics are kept over the whole stream and over the last ``window`` rows
(exact, row by row).  Rows are unweighted (``sample_weight`` does not enter the metrics).

Per task:

* regression: ``loss`` (the estimator's ``loss_function(y_true, y_pred)`` if it has one, else the
  squared error), ``mae``, ``rmse``;
* classification: ``loss`` (the estimator's ``loss_function(y_true, proba_or_pred)`` if it has one,
  else the log loss if ``predict_proba`` is available, else ``None``), ``accuracy``, ``log_loss``
  (``None`` without ``predict_proba``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EPS", "evaluate_batch", "ProgressiveMetrics", "is_fitted"]

#: probabilities are clipped to [EPS, 1] in the log loss.
EPS = 1e-15


def is_fitted(estimator: Any) -> bool:
    """scikit-learn's rule: ``__sklearn_is_fitted__()`` if defined, else any attribute ending in ``_``."""
    check = getattr(estimator, "__sklearn_is_fitted__", None)
    if callable(check):
        return bool(check())
    try:
        names = vars(estimator)
    except TypeError:
        return False
    return any(k.endswith("_") and not k.startswith("__") for k in names)


def _own_loss(estimator: Any, y: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    fn = getattr(estimator, "loss_function", None)
    if not callable(fn):
        return None
    value = np.asarray(fn(y, out), dtype=np.float64)
    if value.ndim == 0:
        return np.full(len(y), float(value))
    return value.reshape(len(y), -1).mean(axis=1) if value.size != len(y) else value.reshape(len(y))


def log_loss_rows(y: np.ndarray, proba: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """``-log p(true class)`` per row, probabilities clipped to ``[EPS, 1]``."""
    classes = np.asarray(classes)
    order = np.argsort(classes, kind="stable")
    pos = np.searchsorted(classes[order], y)
    pos = np.clip(pos, 0, len(classes) - 1)
    col = order[pos]
    known = classes[col] == y
    p = np.where(known, proba[np.arange(len(y)), col], 0.0)
    return -np.log(np.clip(p, EPS, 1.0))


def evaluate_batch(estimator: Any, X: Any, y: np.ndarray, *, task: str,
                   classes: Any = None) -> dict[str, np.ndarray]:
    """Per-row progressive values for one batch (call *before* ``partial_fit`` on it)."""
    pred = np.asarray(estimator.predict(X))
    proba = None
    if task != "regression" and hasattr(estimator, "predict_proba"):
        proba = np.asarray(estimator.predict_proba(X), dtype=np.float64)
    return rows_from_predictions(estimator, pred, proba, y, task=task, classes=classes)


def rows_from_predictions(estimator: Any, pred: np.ndarray, proba: np.ndarray | None, y: np.ndarray, *,
                          task: str, classes: Any = None) -> dict[str, np.ndarray]:
    """Per-row progressive values from predictions made before training (labels and, if any, probabilities)."""
    if task == "regression":
        pred = pred.reshape(y.shape).astype(np.float64)
        err = pred - y.astype(np.float64)
        sq = err * err
        own = _own_loss(estimator, y, pred)
        if y.ndim > 1:  # multi-output: per row, the mean over the outputs
            sq, err = sq.reshape(len(y), -1).mean(axis=1), np.abs(err).reshape(len(y), -1).mean(axis=1)
        return {"loss": sq if own is None else own, "abs_error": np.abs(err), "sq_error": sq}
    rows: dict[str, np.ndarray] = {"correct": (pred.reshape(len(y)) == y).astype(np.float64)}
    if proba is not None:
        cls = getattr(estimator, "classes_", classes)
        rows["log_loss"] = log_loss_rows(y, proba, np.asarray(cls))
    own = _own_loss(estimator, y, pred if proba is None else proba)
    if own is not None:
        rows["loss"] = own
    elif "log_loss" in rows:
        rows["loss"] = rows["log_loss"]
    return rows


def _summary(task: str, n: int, sums: dict[str, float]) -> dict[str, float | int | None]:
    def mean(key: str) -> float | None:
        return sums[key] / n if n and key in sums else None

    if task == "regression":
        mse = mean("sq_error")
        return {"rows": n, "loss": mean("loss"), "mae": mean("abs_error"),
                "rmse": None if mse is None else float(np.sqrt(mse))}
    return {"rows": n, "loss": mean("loss"), "accuracy": mean("correct"), "log_loss": mean("log_loss")}


class ProgressiveMetrics:
    """Running sums over the stream and an exact ring of per-row values over the last ``window`` rows."""

    def __init__(self, task: str = "regression", window: int = 1000) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"Invalid window: {window!r}, expected an int >= 1")
        self.task = task
        self.window = window
        self.rows = 0
        self._sums: dict[str, float] = {}
        self._ring: dict[str, np.ndarray] = {}
        self._head = 0  # next ring slot to write
        self._count = 0  # rows in the ring

    def update(self, rows: dict[str, np.ndarray]) -> dict[str, float | int | None]:
        """Add one batch of per-row values; return that batch's metrics."""
        n = len(next(iter(rows.values())))
        batch_sums = {k: float(v.sum()) for k, v in rows.items()}
        for k, s in batch_sums.items():
            self._sums[k] = self._sums.get(k, 0.0) + s
        self.rows += n
        take = min(n, self.window)
        for k, v in rows.items():
            ring = self._ring.get(k)
            if ring is None:
                ring = self._ring[k] = np.zeros(self.window)
            tail = v[n - take:]
            first = min(take, self.window - self._head)
            ring[self._head:self._head + first] = tail[:first]
            ring[:take - first] = tail[first:]
        self._head = (self._head + take) % self.window
        self._count = min(self.window, self._count + take)
        return _summary(self.task, n, batch_sums)

    def stream(self) -> dict[str, float | int | None]:
        """Metrics over every evaluated row of the stream."""
        return _summary(self.task, self.rows, self._sums)

    def recent(self) -> dict[str, float | int | None]:
        """Metrics over the last ``window`` evaluated rows."""
        c = self._count
        sums = {k: float(r[:c].sum()) if c == self.window else float(_ring_last(r, self._head, c).sum())
                for k, r in self._ring.items()}
        return _summary(self.task, c, sums)


def _ring_last(ring: np.ndarray, head: int, count: int) -> np.ndarray:
    """The ``count`` most recently written values (order irrelevant for sums)."""
    start = head - count
    return ring[start:head] if start >= 0 else np.concatenate([ring[start:], ring[:head]])
