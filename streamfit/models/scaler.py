"""Online standardization: a running per-feature mean and variance, merged batch by batch.

The statistics are float64 sums of each row's (weighted) deviations from a shift and of their squares, so
the statistics after each row of a chunk are cumulative sums, computed at once with the bits of one row at a
time.  Counts are float64 (sums of sample weights), so weighted rows count by their weight and zero-weight
rows not at all.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["RunningScaler", "ScalerSnapshot", "FixedScaler", "scaler_from_state", "update_steps_together"]

_EPS32 = float(np.finfo(np.float32).eps)
_TOL64 = 10 * float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class ScalerSnapshot:
    """A :class:`RunningScaler`'s statistics at one moment (its lists are never changed in place)."""

    count: float
    shift: list[float] | None
    s1: list[float]
    s2: list[float]


class RunningScaler:
    """Per-feature running mean and variance; :meth:`transform` standardizes with the current ones.

    The statistics are sums of the rows' deviations from a fixed shift (the first row seen): ``s1 = sum w (x - k)``
    and ``s2 = sum w (x - k)^2``.  A row adds to them, so the statistics after every row of a chunk are
    cumulative sums (:meth:`update_steps`, vectorized) with the same bits as one row at a time, and the shift
    keeps the variance ``(s2 - s1^2 / n) / n`` accurate while the mean stays within many standard deviations of
    the first row.  A feature whose spread is below float32 resolution (constant so far) gets scale 1, as in
    scikit-learn's ``StandardScaler``.

    Parameters
    ----------
    n_features
        Features per row.

    Examples
    --------
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
        self._shift: list[float] | None = None  # set by the first row
        self._s1 = [0.0] * n_features
        self._s2 = [0.0] * n_features

    def bind(self, mean: np.ndarray, scale: np.ndarray) -> None:
        """Keep the float32 mean and scale in these arrays from now on (every update writes them in place):
        the arrays a trainer's graph reads (its host tensors), so scaling costs no host work per row.

        Parameters
        ----------
        mean, scale
            float32 arrays of ``n_features`` values each, written in place from now on.
        """
        if mean.shape != (len(self._s1),) or scale.shape != mean.shape:
            raise ValueError(f"bind() needs two arrays of shape ({len(self._s1)},), got {mean.shape}, {scale.shape}")
        self._f32 = (mean, scale)
        self._bound = True
        self._stale()

    def _stale(self, mean: Any = None, scale: Any = None) -> None:
        """The statistics changed: refresh the bound float32 arrays (from ``mean`` and ``scale`` when the caller
        has them, :meth:`float64`'s bits), or forget the cached ones."""
        f32 = self.__dict__.get("_f32")
        if not self.__dict__.get("_bound") or f32 is None:
            self._f32 = None
        else:
            if mean is None:
                mean, scale = self.float64()
            self._write_f32(f32, mean, scale)

    def _shift_of(self, row: Any) -> list[float]:
        if self._shift is None:
            self._shift = [float(v) for v in row]
        return self._shift

    @property
    def mean_(self) -> np.ndarray:
        """Running mean of each feature (float64)."""
        return np.array(self.float64()[0], np.float64)

    @mean_.setter
    def mean_(self, value: np.ndarray) -> None:  # the deviations are then measured from this mean
        m2 = self.m2_
        self._shift = np.asarray(value, np.float64).reshape(-1).tolist()
        self._s1 = [0.0] * len(self._shift)
        self._s2 = m2.tolist() if len(m2) == len(self._shift) else [0.0] * len(self._shift)
        self._stale()

    @property
    def m2_(self) -> np.ndarray:
        """Running sum of squared deviations from the mean of each feature (float64)."""
        n = self.count
        if n <= 0:
            return np.zeros(len(self._s1))
        return np.array([s2 - s1 * (s1 / n) for s1, s2 in zip(self._s1, self._s2)], np.float64)

    @m2_.setter
    def m2_(self, value: np.ndarray) -> None:  # with the mean as the shift (see mean_'s setter)
        self._shift = self.float64()[0] if self._shift is not None else [0.0] * len(self._s1)
        self._s1 = [0.0] * len(self._shift)
        self._s2 = np.asarray(value, np.float64).reshape(-1).tolist()
        self._stale()

    @property
    def var_(self) -> np.ndarray:
        """Population variance of each feature (0 before any row)."""
        return self.m2_ / self.count if self.count > 0 else np.zeros(len(self._s1))

    @property
    def scale_(self) -> np.ndarray:
        """Standard deviation of each feature, with 1 for features that have been constant."""
        return np.array(self.float64()[1], np.float64)

    def update(self, X: np.ndarray, sample_weight: np.ndarray | None = None) -> None:
        """Add the rows of ``X`` (weighted by ``sample_weight``) to the statistics.

        Parameters
        ----------
        X
            Rows ``(n, n_features)``.
        sample_weight
            Row weights (``n`` values), or None for 1 each.
        """
        if sample_weight is None and len(X) == 1 and len(self._s1) <= self.small:  # one row, on Python floats
            self.update_row(X.tolist()[0] if type(X) is np.ndarray and X.ndim == 2 else
                            np.asarray(X).reshape(-1).tolist())
            return
        X = np.asarray(X, np.float64).reshape(len(X), -1)
        w = None if sample_weight is None else np.asarray(sample_weight, np.float64).reshape(-1)
        total = float(len(X)) if w is None else float(w.sum())
        if total <= 0.0:
            return
        shift = self._shift_of(X[0])
        if w is None:  # one step of all the rows, summed as update_steps sums each step's
            s1, s2 = _step_sums([X], shift, len(X))[:, 0]
        else:
            D = X - np.array(shift, np.float64)
            s1, s2 = w @ D, w @ (D * D)
        self._s1 = (np.array(self._s1) + s1).tolist()
        self._s2 = (np.array(self._s2) + s2).tolist()
        self.count += total
        self._stale()

    def update_row(self, row: list[float]) -> None:
        """One unweighted row given as Python floats (the one-row path of a stream): its deviations added to
        the sums, and the float32 mean and scale that :meth:`transform` uses refreshed in place, in one pass
        with :meth:`float64`'s operations.

        Parameters
        ----------
        row
            One row's ``n_features`` values.
        """
        shift = self._shift if self._shift is not None else self._shift_of(row)
        n = self.count + 1.0
        eps4, tol, sqrt = 4 * _EPS32, _TOL64, math.sqrt
        s1, s2, means, scales = [], [], [], []
        for x, k, a, b in zip(row, shift, self._s1, self._s2):
            d = x - k
            a += d
            b += d * d
            s1.append(a)
            s2.append(b)
            dm = a / n
            m = k + dm
            v = (b - a * dm) / n
            scale = sqrt(v) if v > 0.0 else 0.0 if v <= 0.0 else v  # max(v, 0.0) without a call (NaN stays)
            means.append(m)
            scales.append(1.0 if scale <= tol or scale <= eps4 * abs(m) else scale)
        self._s1, self._s2, self.count = s1, s2, n
        f32 = self._f32
        if f32 is None:
            self._f32 = (np.array(means, np.float32), np.array(scales, np.float32))
        else:  # written in place: the one-row path holds these arrays
            self._write_f32(f32, means, scales)

    def _write_f32(self, f32: tuple[np.ndarray, np.ndarray], means: Any, scales: Any) -> None:
        """The one writer of the float32 arrays: float64 values into them, in place.  Python floats (the one-row
        path, once per event) go by ``struct``: its float32 rounding is numpy's cast's, in a third of the time of
        assigning a list.  An array (a chunk's last step) is cast by numpy, which is faster for arrays."""
        if type(means) is np.ndarray:
            f32[0][:] = means
            f32[1][:] = scales
            return
        views = self.__dict__.get("_views")
        if views is None or views[0] is not f32:
            views = self._views = (f32, *_packers(f32))
        pack = views[1]
        if pack is not None:
            try:
                pack(views[2], 0, *means)
                pack(views[3], 0, *scales)
                return
            except OverflowError:  # a finite value beyond float32's range (numpy's cast makes it inf)
                pass
        f32[0][:] = means
        f32[1][:] = scales

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_views", None)  # memoryviews of the float32 arrays: made again on the next update
        return state

    def update_value(self, x: float) -> None:
        """:meth:`update_row` of a one-feature scaler (a regressor's target).

        Parameters
        ----------
        x
            The value.
        """
        self.update_row([x])

    def update_steps(self, X: np.ndarray, size: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Add the rows of ``X`` in steps of ``size`` rows (the last may be shorter), as :meth:`update` on each
        step's rows in turn (the same bits: a step's sums are added to the running ones), and return the float64
        mean and scale after each step ([steps, features] each).

        Parameters
        ----------
        X
            Rows ``(n, n_features)``.
        size
            Rows per step.
        """
        return update_steps_together([self], [X], size)[0]

    def float32(self) -> tuple[np.ndarray, np.ndarray]:
        """The current mean and scale as float32 arrays (what :meth:`transform` and the exported graph use).

        The arrays are reused and updated in place by :meth:`update_row`: read, do not keep or modify."""
        if self._f32 is None:
            mean, scale = self.float64()
            self._f32 = (np.array(mean, np.float32), np.array(scale, np.float32))
        return self._f32

    def float64(self) -> tuple[list[float], list[float]]:
        """The current mean and scale as Python floats (float64: the bits of :attr:`mean_`, :attr:`scale_`)."""
        n, shift = self.count, self._shift
        if shift is None:
            return [0.0] * len(self._s1), [1.0] * len(self._s1)
        if n <= 0:  # no rows (statistics set directly, or all weights zero): the shift is the mean
            return list(shift), [1.0] * len(self._s1)
        eps4, sqrt = 4 * _EPS32, math.sqrt
        means, scales = [], []
        for k, s1, s2 in zip(shift, self._s1, self._s2):
            d = s1 / n
            m = k + d
            scale = sqrt(max((s2 - s1 * d) / n, 0.0))
            means.append(m)
            scales.append(1.0 if scale <= _TOL64 or scale <= eps4 * abs(m) else scale)
        return means, scales

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``(X - mean) / scale`` computed in ``X``'s float type (as the exported graph computes it).

        Parameters
        ----------
        X
            Rows ``(n, n_features)``.
        """
        X = np.asarray(X)
        if X.dtype == np.float32:  # the ready-made estimators' case: statistics cast once per update
            mean, scale = self.float32()
            return (X - mean) / scale
        dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float32)
        return (X.astype(dtype, copy=False) - self.mean_.astype(dtype)) / self.scale_.astype(dtype)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays: ``count`` (float64 scalar); per feature (float64): ``shift``, the sums ``s1`` and ``s2`` of
        the rows' deviations from it and their squares, and (derived, for readers) ``mean`` and ``m2``."""
        shift = self._shift if self._shift is not None else [0.0] * len(self._s1)
        return {"count": np.array(self.count, np.float64), "shift": np.array(shift, np.float64),
                "s1": np.array(self._s1, np.float64), "s2": np.array(self._s2, np.float64),
                "mean": self.mean_, "m2": self.m2_}

    def snapshot(self) -> "ScalerSnapshot":
        """The statistics as they are now, for :meth:`restore` (no copy: every update replaces the sums)."""
        return ScalerSnapshot(self.count, self._shift, self._s1, self._s2)

    def restore(self, snapshot: "ScalerSnapshot") -> None:
        """Back to the statistics of a :meth:`snapshot` of this scaler.

        Parameters
        ----------
        snapshot
            What :meth:`snapshot` returned.
        """
        self.count, self._shift, self._s1, self._s2 = snapshot.count, snapshot.shift, snapshot.s1, snapshot.s2
        self._stale()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (or an older one of ``count``, ``mean``, ``m2``: the deviations are
        then measured from that mean); the number of features must match.

        Parameters
        ----------
        state
            What :meth:`state_dict` returned.
        """
        keys = ("shift", "s1", "s2") if "s1" in state else ("mean", "m2")
        arrays = [np.asarray(state[k], np.float64).reshape(-1) for k in keys]
        if any(a.shape != (len(self._s1),) for a in arrays):
            raise ValueError(f"scaler state has {arrays[0].shape[0]} features, expected {len(self._s1)}")
        self.count = float(np.asarray(state["count"], np.float64))
        if len(arrays) == 3:
            self._shift, self._s1, self._s2 = (a.tolist() for a in arrays)
        else:
            self._shift, self._s1, self._s2 = arrays[0].tolist(), [0.0] * len(self._s1), arrays[1].tolist()
        if self.count <= 0 and not any(self._shift):
            self._shift = None
        self._stale()

    def __repr__(self) -> str:
        return f"RunningScaler(n_features={len(self._s1)}, count={self.count})"


def _step_sums(parts: Sequence[np.ndarray], shift: list[float], size: int) -> np.ndarray:
    """The sums of each step's deviations from ``shift`` and of their squares ([2, steps, features], float64) for
    steps of ``size`` rows of ``parts`` side by side (the last step may be shorter), each step's rows added in
    order, whatever the number of steps and the arrays' layout (one step per :meth:`RunningScaler.update`, many
    per :func:`update_steps_together`: the same bits).  The rows are cast into a [2, rows of a step, steps,
    features] buffer, so that the deviations and squares are flat operations and the sums one reduction over
    its rows with a long inner loop, which numpy adds in order (along a lone column it would add pairwise): 1024
    rows of 9 features in steps of 32 cost 2/3 of a [rows, features] layout's broadcasts and concatenation."""
    n_rows = len(parts[0])
    width = parts[0].shape[1] if len(parts) == 1 else sum(p.shape[1] for p in parts)
    full = n_rows // size * size
    out = []
    for start, rows, steps in ((0, size, full // size), (full, n_rows - full, 1)):  # the full steps, the last
        if not rows or not steps:
            continue
        buf = np.empty((2, rows, steps, width))
        dev = buf[0]
        at = 0
        for p in parts:
            w = p.shape[1]
            block = p[start:start + steps * rows].reshape(steps, rows, w).transpose(1, 0, 2)
            np.copyto(dev[:, :, at:at + w] if len(parts) > 1 else dev, block, casting="unsafe")
            at += w
        flat = dev.reshape(rows, steps * width)
        np.subtract(flat, _tiled(np.array(shift, np.float64).tobytes(), steps), out=flat)
        np.multiply(flat, flat, out=buf[1].reshape(rows, steps * width))
        if steps * width > 1:
            sums = buf.reshape(2, rows, steps * width).sum(axis=1)
        else:  # one column: summed as a [rows, 2] array (a reduction along its only axis would be pairwise)
            sums = buf.reshape(2, rows).T.copy().sum(axis=0)
        out.append(sums.reshape(2, steps, width))
    return out[0] if len(out) == 1 else np.concatenate(out, axis=1)


@functools.lru_cache(maxsize=16)
def _tiled(shift: bytes, times: int) -> np.ndarray:
    """The float64 ``shift`` (its bytes: a key that tells -0.0 from 0.0, which a tuple of floats does not, and
    ``x - 0.0`` is not ``x - -0.0`` for ``x = -0.0``) repeated ``times`` times, read-only: a scaler's shift never
    changes once set, so a chunk's deviations are one flat subtraction of the same array."""
    out = np.tile(np.frombuffer(shift, np.float64), times)
    out.flags.writeable = False
    return out


def _packers(f32: tuple[np.ndarray, np.ndarray]) -> tuple[Any, Any, Any]:
    """``struct``'s pack_into for the float32 arrays and their byte views, or Nones when they are not contiguous
    float32 vectors of one length."""
    mean, scale = f32
    if not all(a.dtype == np.float32 and a.ndim == 1 and a.flags.c_contiguous and a.flags.writeable
               and a.shape == mean.shape for a in f32):
        return None, None, None
    return struct.Struct(f"={len(mean)}f").pack_into, mean.data.cast("B"), scale.data.cast("B")


def update_steps_together(scalers: Sequence[RunningScaler], arrays: Sequence[np.ndarray], size: int = 1
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:meth:`RunningScaler.update_steps` of each scaler on its rows (the same number of rows each), in one pass
    over their columns side by side when they have counted the same rows (a regressor's input and target
    scalers): every operation is per column, so the bits are each scaler's own, in half the numpy calls.

    >>> import numpy as np
    >>> a, b = RunningScaler(2), RunningScaler(1)
    >>> X, t = np.arange(8.0).reshape(4, 2), np.array([[1.0], [3.0], [5.0], [7.0]])
    >>> [m.tolist() for m, _ in update_steps_together([a, b], [X, t], 2)]
    [[[1.0, 2.0], [3.0, 4.0]], [[2.0], [4.0]]]
    """
    if len({s.count for s in scalers}) > 1 or len({len(a) for a in arrays}) > 1:
        return [update_steps_together([s], [a], size)[0] for s, a in zip(scalers, arrays)]
    n_rows = len(arrays[0])
    widths = [len(s._s1) for s in scalers]
    if not n_rows:
        return [(np.empty((0, w)), np.empty((0, w))) for w in widths]
    parts = [np.asarray(a).reshape(n_rows, -1) for a in arrays]
    shift: list[float] = []
    for s, a in zip(scalers, parts):
        shift += s._shift_of(a[0].tolist())  # Python floats: a float32's value is its float64's
    s1 = [v for s in scalers for v in s._s1]
    s2 = [v for s in scalers for v in s._s2]
    count = scalers[0].count
    if size > 1:
        sums = _step_sums(parts, shift, size)  # [2, steps, features]
        inc1, inc2 = sums[0], sums[1]
        rows = np.full(sums.shape[1], float(size))
        if n_rows % size:
            rows[-1] = n_rows % size
        counted = False
    else:  # a step's sums are its row
        # a copy (the sums are accumulated in place), the float64 values of each scaler's rows side by side
        D = np.concatenate(parts, axis=1, dtype=np.float64)
        D -= np.array(shift, np.float64)
        inc1, inc2 = D, D * D
        # the count after each row: count + 1, count + 2, ... (exact for whole counts below 2**53, as the
        # cumulative sum below gives them)
        counted = float(count).is_integer() and count + n_rows < 2.0 ** 52
        rows = np.arange(count + 1.0, count + n_rows + 0.5) if counted else np.ones(n_rows)
    # the running sums and count after each step: the first step's increments take the sums so far
    # (s + a == a + s), then numpy's cumsum adds in order, as step by step (a count of weighted rows may
    # not be an integer: it is accumulated the same way)
    inc1[0] += s1
    inc2[0] += s2
    if not counted:
        rows[0] += count
    if size == 1:
        S1, S2 = np.cumsum(inc1, axis=0, out=inc1), np.cumsum(inc2, axis=0, out=inc2)
    else:  # each column on its own, both at once
        np.cumsum(sums, axis=1, out=sums)
        S1, S2 = inc1, inc2
    n = (rows if counted else np.cumsum(rows, out=rows))[:, None]
    last1, last2, total = S1[-1].tolist(), S2[-1].tolist(), float(n[-1, 0])
    mean, scale = _statistics(np.array(shift), S1, S2, n)
    out = []
    at = 0
    for s, w in zip(scalers, widths):
        s._s1, s._s2, s.count = last1[at:at + w], last2[at:at + w], total
        m, sc = (mean, scale) if len(scalers) == 1 else (mean[:, at:at + w], scale[:, at:at + w])
        s._stale(m[-1], sc[-1])
        out.append((m, sc))
        at += w
    return out


def _statistics(shift: np.ndarray, S1: np.ndarray, S2: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale from the sums, with :meth:`RunningScaler.float64`'s operations elementwise."""
    d = S1 / n
    mean = shift + d
    var = S1 * d  # the same operations as below, in place: (S2 - S1 * d) / n, then max(., 0), its square root
    np.subtract(S2, var, out=var)
    var /= n
    scale = np.sqrt(np.maximum(var, 0.0, out=var), out=var)
    limit = np.abs(mean)
    limit *= 4 * _EPS32
    np.fmax(limit, _TOL64, out=limit)  # constant: scale <= _TOL64 or scale <= 4 * eps32 * |mean| (NaN: the first)
    scale[scale <= limit] = 1.0
    return mean, scale


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

    def snapshot(self) -> None:
        """Nothing to keep (the scaling never changes): :meth:`RunningScaler.snapshot`'s counterpart."""

    def restore(self, snapshot: None) -> None:
        """Nothing to put back."""

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
