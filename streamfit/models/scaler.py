"""Online standardization: a running per-feature mean and variance, merged batch by batch.

The merge is Chan, Golub & LeVeque's parallel update (Welford's for one row): a batch's weighted count,
mean and sum of squared deviations are computed in float64 and combined with the running ones, so the
result equals the two-pass statistics of everything seen, whatever the batch sizes.  Counts are
float64 (sums of sample weights), so weighted rows count by their weight and zero-weight rows not at all.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

__all__ = ["RunningScaler", "FixedScaler", "scaler_from_state", "merge_moments"]

_EPS32 = float(np.finfo(np.float32).eps)
_TOL64 = 10 * float(np.finfo(np.float64).eps)


def merge_moments(count: float, mean: np.ndarray, m2: np.ndarray, X: np.ndarray,
                  sample_weight: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray]:
    """``(count, mean, m2)`` after adding the rows of ``X`` (weighted), by Chan et al.'s update.

    ``m2`` is the (weighted) sum of squared deviations from the mean; the variance is ``m2 / count``.

    >>> import numpy as np
    >>> X = np.arange(10.0).reshape(5, 2)
    >>> c, m, s = merge_moments(0.0, np.zeros(2), np.zeros(2), X[:2])
    >>> c, m, s = merge_moments(c, m, s, X[2:])
    >>> c, m.tolist(), (s / c).tolist() == X.var(axis=0).tolist()
    (5.0, [4.0, 5.0], True)
    """
    X = np.asarray(X, np.float64)
    w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, np.float64).reshape(-1)
    n_b = float(w.sum())
    if n_b <= 0.0:
        return count, mean, m2
    mean_b = (w @ X) / n_b
    m2_b = w @ (X - mean_b) ** 2
    n = count + n_b
    delta = mean_b - mean
    return n, mean + delta * (n_b / n), m2 + m2_b + delta * delta * (count * n_b / n)


class RunningScaler:
    """Per-feature running mean and variance; :meth:`transform` standardizes with the current ones.

    A feature whose spread is below float32 resolution (constant so far) gets scale 1, as in
    scikit-learn's ``StandardScaler``.

    >>> import numpy as np
    >>> s = RunningScaler(2)
    >>> s.update(np.array([[1.0, 10.0], [3.0, 10.0]]))
    >>> s.mean_.tolist(), s.scale_.tolist()
    ([2.0, 10.0], [1.0, 1.0])
    >>> s.transform(np.array([[4.0, 10.0]], np.float32))
    array([[2., 0.]], dtype=float32)
    """

    #: up to this many features, a one-row update runs on Python floats (between onnxruntime runs each numpy
    #: call costs microseconds; the arithmetic is the same IEEE float64 operations, so the same bits)
    small = 64

    def __init__(self, n_features: int) -> None:
        self._bound = False  # float32 mean and scale written into arrays given by bind()
        self._f32: tuple[np.ndarray, np.ndarray] | None = None  # float32 mean and scale, until the next update
        self.count = 0.0
        self.mean_ = np.zeros(n_features)
        self.m2_ = np.zeros(n_features)

    def bind(self, mean: np.ndarray, scale: np.ndarray) -> None:
        """Keep the float32 mean and scale in these arrays from now on (every update writes them in place):
        the arrays a trainer's graph reads (its host tensors), so scaling costs no host work per row."""
        if mean.shape != (len(self._mean),) or scale.shape != mean.shape:
            raise ValueError(f"bind() needs two arrays of shape ({len(self._mean)},), got {mean.shape}, {scale.shape}")
        self._f32 = (mean, scale)
        self._bound = True
        self._stale()

    def _stale(self) -> None:
        """The statistics changed: refresh the bound float32 arrays, or forget the cached ones."""
        f32 = self.__dict__.get("_f32")
        if not self.__dict__.get("_bound") or f32 is None:
            self._f32 = None
        elif len(self.__dict__.get("_m2", ())) == len(self._mean):  # both set (not halfway through a load)
            f32[0][:] = self._mean
            f32[1][:] = self._scale_list()

    # the statistics are kept as Python floats; mean_/m2_ are float64 arrays made on demand
    @property
    def mean_(self) -> np.ndarray:
        """Running mean of each feature (float64)."""
        return np.array(self._mean, np.float64)

    @mean_.setter
    def mean_(self, value: np.ndarray) -> None:
        self._mean = np.asarray(value, np.float64).reshape(-1).tolist()
        self._stale()

    @property
    def m2_(self) -> np.ndarray:
        """Running sum of squared deviations from the mean of each feature (float64)."""
        return np.array(self._m2, np.float64)

    @m2_.setter
    def m2_(self, value: np.ndarray) -> None:
        self._m2 = np.asarray(value, np.float64).reshape(-1).tolist()
        self._stale()

    @property
    def var_(self) -> np.ndarray:
        """Population variance of each feature (0 before any row)."""
        return self.m2_ / self.count if self.count > 0 else np.zeros_like(self.m2_)

    @property
    def scale_(self) -> np.ndarray:
        """Standard deviation of each feature, with 1 for features that have been constant."""
        scale = np.sqrt(self.var_)
        constant = scale <= np.maximum(10 * np.finfo(np.float64).eps, 4 * _EPS32 * np.abs(self.mean_))
        return np.where(constant, 1.0, scale)

    def _scale_list(self) -> list[float]:
        """:attr:`scale_` as Python floats, computed as :attr:`scale_` computes it."""
        if len(self._mean) > self.small:
            return self.scale_.tolist()
        count, eps4, sqrt = self.count, 4 * _EPS32, math.sqrt
        if count <= 0:
            return [1.0] * len(self._mean)
        out = []
        for m, s2 in zip(self._mean, self._m2):
            scale = sqrt(s2 / count)
            out.append(1.0 if scale <= _TOL64 or scale <= eps4 * abs(m) else scale)
        return out

    def update(self, X: np.ndarray, sample_weight: np.ndarray | None = None) -> None:
        """Merge the rows of ``X`` (weighted by ``sample_weight``) into the statistics."""
        if sample_weight is None and len(X) == 1 and len(self._mean) <= self.small:  # one row: Welford's update
            self.update_row(X.tolist()[0] if type(X) is np.ndarray and X.ndim == 2 else
                            np.asarray(X).reshape(-1).tolist())
            return
        self.count, self.mean_, self.m2_ = merge_moments(self.count, self.mean_, self.m2_, X, sample_weight)

    def update_row(self, row: list[float]) -> None:
        """Welford's update by one unweighted row given as Python floats (the one-row path of a stream).

        The float32 mean and scale that :meth:`transform` uses are refreshed in place in the same pass, so
        a per-event stream pays one loop over the features per row and no numpy calls but two.
        """
        count = self.count + 1.0
        inv = 1.0 / count
        mean, m2, scales = [], [], []
        eps4, sqrt = 4 * _EPS32, math.sqrt
        for x, m, s2 in zip(row, self._mean, self._m2):
            delta = x - m
            m += delta * inv
            s2 += delta * (x - m)
            mean.append(m)
            m2.append(s2)
            scale = sqrt(s2 / count)  # as scale_ computes it: the same float64 operations, the same bits
            scales.append(1.0 if scale <= _TOL64 or scale <= eps4 * abs(m) else scale)
        self._mean, self._m2, self.count = mean, m2, count
        f32 = self._f32
        if f32 is None:
            self._f32 = (np.array(mean, np.float32), np.array(scales, np.float32))
        else:  # written in place: the one-row path holds these arrays
            f32[0][:] = mean
            f32[1][:] = scales

    def update_value(self, x: float) -> None:
        """:meth:`update_row` of a one-feature scaler (a regressor's target): the same float64 operations on
        one Python float, without the per-feature lists."""
        count = self.count + 1.0
        m, s2 = self._mean[0], self._m2[0]
        delta = x - m
        m += delta * (1.0 / count)
        s2 += delta * (x - m)
        scale = math.sqrt(s2 / count)
        self._mean, self._m2, self.count = [m], [s2], count
        scale = 1.0 if scale <= _TOL64 or scale <= 4 * _EPS32 * abs(m) else scale
        f32 = self._f32
        if f32 is None:
            self._f32 = (np.array([m], np.float32), np.array([scale], np.float32))
        else:
            f32[0][0] = m
            f32[1][0] = scale

    def float32(self) -> tuple[np.ndarray, np.ndarray]:
        """The current mean and scale as float32 arrays (what :meth:`transform` and the exported graph use).

        The arrays are reused and updated in place by :meth:`update_row`: read, do not keep or modify."""
        if self._f32 is None:
            self._f32 = (np.array(self._mean, np.float32), np.array(self._scale_list(), np.float32))
        return self._f32

    def float64(self) -> tuple[list[float], list[float]]:
        """The current mean and scale as Python floats (float64: the bits of :attr:`mean_`, :attr:`scale_`)."""
        return self._mean, self._scale_list()

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``(X - mean) / scale`` computed in ``X``'s float type (as the exported graph computes it)."""
        X = np.asarray(X)
        if X.dtype == np.float32:  # the ready-made estimators' case: statistics cast once per update
            mean, scale = self.float32()
            return (X - mean) / scale
        dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float32)
        return (X.astype(dtype, copy=False) - self.mean_.astype(dtype)) / self.scale_.astype(dtype)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays: ``count`` (float64 scalar), ``mean`` and ``m2`` (float64, one per feature)."""
        return {"count": np.array(self.count, np.float64), "mean": self.mean_.copy(), "m2": self.m2_.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the number of features must match."""
        mean, m2 = np.asarray(state["mean"], np.float64), np.asarray(state["m2"], np.float64)
        if mean.shape != self.mean_.shape or m2.shape != self.m2_.shape:
            raise ValueError(f"scaler state has {mean.shape[0] if mean.ndim else 0} features, expected "
                             f"{self.mean_.shape[0]}")
        self.count = float(np.asarray(state["count"], np.float64))
        self.mean_, self.m2_ = mean, m2

    def __repr__(self) -> str:
        return f"RunningScaler(n_features={len(self._mean)}, count={self.count})"


class FixedScaler:
    """A frozen ``(X - mean_) / scale_``: the fitted scalers of a converted scikit-learn pipeline.

    ``from_sklearn`` composes a pipeline's MinMaxScaler/MaxAbsScaler/StandardScaler steps into one of these;
    :meth:`update` keeps it as fitted (the pipeline's scaling is part of the model), and the exported graph
    applies it as :class:`RunningScaler`'s does.

    >>> import numpy as np
    >>> s = FixedScaler(np.array([1.0]), np.array([2.0]))
    >>> s.update(np.array([[100.0]])); s.transform(np.array([[5.0]], np.float32))
    array([[2.]], dtype=float32)
    """

    kind = "fixed"

    def __init__(self, mean: np.ndarray, scale: np.ndarray) -> None:
        self.mean_ = np.asarray(mean, np.float64).reshape(-1).copy()
        self.scale_ = np.asarray(scale, np.float64).reshape(-1).copy()
        if self.mean_.shape != self.scale_.shape or not (np.isfinite(self.scale_).all() and (self.scale_ != 0).all()):
            raise ValueError("a fixed scaler needs finite, nonzero scales, one per mean")

    def update(self, X: np.ndarray, sample_weight: np.ndarray | None = None) -> None:
        """Nothing: the scaling stays as fitted."""

    def transform(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float32)
        return (X.astype(dtype, copy=False) - self.mean_.astype(dtype)) / self.scale_.astype(dtype)

    def bind(self, mean: np.ndarray, scale: np.ndarray) -> None:
        """Write the float32 mean and scale into these arrays (a trainer's host tensors) and use them."""
        mean[...] = self.mean_
        scale[...] = self.scale_
        self._f32 = (mean, scale)

    def float32(self) -> tuple[np.ndarray, np.ndarray]:
        """The mean and scale as float32 arrays (made once: the scaling never changes)."""
        f32 = self.__dict__.get("_f32")
        if f32 is None:
            f32 = self._f32 = (self.mean_.astype(np.float32), self.scale_.astype(np.float32))
        return f32

    def float64(self) -> tuple[list[float], list[float]]:
        """The mean and scale as Python floats."""
        return self.mean_.tolist(), self.scale_.tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"kind": np.array(self.kind), "mean": self.mean_.copy(), "scale": self.scale_.copy()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "FixedScaler":
        return cls(state["mean"], state["scale"])

    def __repr__(self) -> str:
        return f"FixedScaler(n_features={self.mean_.shape[0]})"


def scaler_from_state(state: Mapping[str, Any], n_features: int) -> "RunningScaler | FixedScaler":
    """The scaler a :meth:`state_dict` describes (running statistics unless it says ``kind="fixed"``)."""
    if "kind" in state and str(np.asarray(state["kind"])) == FixedScaler.kind:
        scaler: RunningScaler | FixedScaler = FixedScaler.from_state(state)
    else:
        scaler = RunningScaler(n_features)
        scaler.load_state_dict(state)
    if scaler.mean_.shape != (n_features,):
        raise ValueError(f"scaler state has {scaler.mean_.shape[0]} features, expected {n_features}")
    return scaler
