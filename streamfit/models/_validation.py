"""Input checks of the ready-made estimators: scikit-learn's contract, without needing scikit-learn.

Features become a finite float32 (rows, features) array, or a ``ValueError``/``TypeError`` that says
what was wrong (NaN, sparse, complex, 1-D, empty...).  Non-finite features are refused rather than
skipped: one NaN row would poison the running statistics of ``standardize=True`` for good.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pyarrow as pa

from streamfit._arrow import as_features, as_labels
from streamfit.exceptions import BadInputError

try:
    from sklearn.exceptions import DataConversionWarning
except ImportError:  # pragma: no cover - exercised only without the [sklearn] extra
    class DataConversionWarning(UserWarning):  # type: ignore[no-redef]
        """A column-vector y was given where a 1-D array was expected."""

__all__ = ["check_features", "check_targets", "check_labels", "check_sample_weight", "DataConversionWarning"]


def _is_sparse(X: Any) -> bool:
    return type(X).__module__.startswith("scipy.sparse")


_F32 = np.dtype(np.float32)


def _finite_sum(arr: np.ndarray) -> bool:
    """True when the Python sum of a few values is finite: then every value is (a NaN or an infinity makes it
    nan or inf; a False may also be an overflow, which the exact check settles).  One numpy call (tolist):
    between onnxruntime runs each numpy call costs microseconds here."""
    values = arr.tolist()
    return math.isfinite(sum(map(sum, values)) if arr.ndim == 2 else sum(values))


def check_features(X: Any, dtype: Any = _F32) -> np.ndarray:
    """``X`` as a finite (rows, features) array of ``dtype`` (C-contiguous unless it holds at most 64 values);
    Arrow tables are accepted.

    >>> check_features([[1, 2], [3, 4]]).dtype
    dtype('float32')
    >>> check_features([[1.0, float("nan")]])
    Traceback (most recent call last):
    ...
    streamfit.exceptions.BadInputError: Input X contains NaN or infinity (first at row 0, column 1)
    """
    if dtype is not _F32:
        dtype = np.dtype(dtype)
    if type(X) is np.ndarray and X.ndim == 2 and 0 < X.size <= 64 and X.dtype.kind == "f":  # a small batch
        arr = X if X.dtype is dtype else X.astype(dtype)
        return arr if _finite_sum(arr) else _finite(arr)
    if X is None:
        raise ValueError("X is None; expected an array-like of shape (rows, features)")
    if _is_sparse(X):
        raise TypeError(f"sparse input ({type(X).__name__}) is not supported; pass a dense array, e.g. X.toarray()")
    if isinstance(X, (pa.Table, pa.RecordBatch)):
        arr = as_features(X, dtype)
    else:
        arr = np.asarray(X)
        if arr.dtype.kind == "c":
            raise ValueError("Complex data not supported: features must be real numbers")
        if arr.dtype.kind == "O":
            arr = arr.astype(np.float64)  # numbers stored as objects; anything else fails here, and says why
        if arr.dtype.kind not in "fiub":
            raise BadInputError(f"features are {arr.dtype}, expected numbers", reason="wrong_type")
    if arr.ndim != 2:
        raise BadInputError(f"Expected a 2-D array (rows, features), got shape {arr.shape}. Reshape your data "
                            "with X.reshape(-1, 1) for one feature, X.reshape(1, -1) for one row",
                            reason="shape_mismatch")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        what = "sample(s)" if arr.shape[0] == 0 else "feature(s)"
        n = arr.shape[0] if arr.shape[0] == 0 else arr.shape[1]
        raise BadInputError(f"Found array with {n} {what} (shape={arr.shape}) while a minimum of 1 is required.",
                            reason="empty_batch")
    return _finite(np.ascontiguousarray(arr, dtype=dtype))


def _finite(arr: np.ndarray) -> np.ndarray:
    if not np.isfinite(arr).all():
        row, col = (int(i[0]) for i in np.nonzero(~np.isfinite(arr)))
        raise BadInputError(f"Input X contains NaN or infinity (first at row {row}, column {col})",
                            reason="non_finite", position=(row, col))
    return arr


def _column_or_1d(y: np.ndarray, multi_output: bool) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape of y "
                      "to (n_samples, ), for example using ravel().", DataConversionWarning, stacklevel=4)
        return y.ravel()
    if y.ndim == 2 and multi_output:
        return y
    if y.ndim != 1:
        raise ValueError(f"y should be a 1d array, got an array of shape {y.shape} instead")
    return y


def _check_rows(y: np.ndarray, n: int) -> None:
    if y.shape[0] != n:
        raise BadInputError(f"X has {n} rows but y has {y.shape[0]}: found input variables with inconsistent "
                            "numbers of samples", reason="shape_mismatch")


def check_targets(y: Any, n: int, dtype: Any = np.float32) -> np.ndarray:
    """Regression targets: finite numbers, shape (n,) or (n, outputs)."""
    if y is None:
        raise ValueError("this estimator requires y to be passed, but the target y is None")
    y = as_labels(y)
    if y.dtype.kind == "O":
        y = y.astype(np.float64)
    if y.dtype.kind not in "fiub":
        raise ValueError(f"regression targets must be numbers, got {y.dtype}")
    y = _column_or_1d(y, multi_output=True)
    _check_rows(y, n)
    y = y.astype(dtype, copy=False)
    if not (_finite_sum(y) if y.size <= 64 else False) and not np.isfinite(y).all():
        raise ValueError("Input y contains NaN or infinity")
    return y


def check_labels(y: Any, n: int) -> np.ndarray:
    """Class labels: shape (n,), discrete (whole-valued floats are fine, other floats are not)."""
    if y is None:
        raise ValueError("this estimator requires y to be passed, but the target y is None")
    y = _column_or_1d(as_labels(y), multi_output=False)
    _check_rows(y, n)
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise ValueError("Input y contains NaN or infinity")
        if np.any(y != np.round(y)):
            raise ValueError("Unknown label type: continuous. A classifier needs discrete class labels; "
                             "use a regressor for continuous targets")
    elif y.dtype.kind == "O" and any(v is None or (isinstance(v, float) and not np.isfinite(v)) for v in y):
        raise ValueError("Input y contains NaN or None")
    return y


def check_sample_weight(sample_weight: Any, n: int, all_zero_ok: bool = False) -> np.ndarray | None:
    """Sample weights: finite, >= 0, shape (n,); not all zero unless ``all_zero_ok`` (a stream's batch)."""
    if sample_weight is None:
        return None
    sw = np.asarray(as_labels(sample_weight), dtype=np.float64)
    if sw.ndim != 1 or sw.shape[0] != n:
        raise BadInputError(f"sample_weight has shape {sw.shape}, expected ({n},)", reason="shape_mismatch")
    if not np.isfinite(sw).all() or (sw < 0).any():
        raise ValueError("sample weights must be finite and >= 0")
    if not all_zero_ok and not sw.any():
        raise ValueError("Sample weights must contain at least one non-zero number.")
    return sw
