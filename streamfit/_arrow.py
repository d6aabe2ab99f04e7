"""Turning numpy arrays and Arrow tables into the dense arrays the engine trains on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from streamfit.exceptions import BadInputError

__all__ = ["as_features", "as_labels"]


def _column_to_numpy(name: str, col: "pa.Array | pa.ChunkedArray", dtype: np.dtype) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        raise BadInputError(f"column {name!r} has {col.null_count} null(s), expected {dtype} values",
                            reason="null", column=name)
    t = col.type
    if pa.types.is_fixed_size_list(t) or isinstance(t, pa.FixedShapeTensorType):
        storage = col.storage if isinstance(t, pa.FixedShapeTensorType) else col
        width = t.list_size if pa.types.is_fixed_size_list(t) else int(np.prod(t.shape))
        values = storage.flatten()
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise BadInputError(f"column {name!r} is a list of {values.type}, expected {dtype}",
                                reason="wrong_type", column=name)
        return values.to_numpy(zero_copy_only=False).reshape(-1, width)
    if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t)):
        raise BadInputError(f"column {name!r} is {t}, expected {dtype}", reason="wrong_type", column=name)
    return col.to_numpy(zero_copy_only=False)


def as_features(X: Any, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous (n, ...) array of ``dtype`` from numpy data or an Arrow Table/RecordBatch.

    An Arrow input is either one FixedSizeList / fixed-shape-tensor column or several numeric columns
    (stacked in column order).
    """
    if isinstance(X, (pa.Table, pa.RecordBatch)):
        cols = [_column_to_numpy(name, X.column(i), dtype) for i, name in enumerate(X.column_names)]
        if len(cols) == 1 and cols[0].ndim == 2:
            return np.ascontiguousarray(cols[0], dtype=dtype)
        out = np.empty((X.num_rows, len(cols)), dtype)
        for j, col in enumerate(cols):
            if col.ndim != 1:
                raise BadInputError(f"column {X.column_names[j]!r} is a list column; mix of list and scalar "
                                    "columns is not supported", reason="wrong_type", column=X.column_names[j])
            out[:, j] = col
        return out
    arr = np.asarray(X)
    if arr.dtype.kind not in "fiub":
        raise BadInputError(f"features are {arr.dtype}, expected numbers ({dtype})", reason="wrong_type")
    if arr.ndim == 1:
        raise BadInputError(f"features must be 2-D (rows, features), got shape {arr.shape}; "
                            "reshape a single feature with X.reshape(-1, 1)", reason="shape_mismatch")
    return np.ascontiguousarray(arr, dtype=dtype)


def as_labels(y: Any) -> np.ndarray:
    """A numpy array from numpy data or an Arrow Array/ChunkedArray/single-column table."""
    if type(y) is np.ndarray:
        return y
    if isinstance(y, (pa.Table, pa.RecordBatch)):
        if y.num_columns != 1:
            raise BadInputError(f"labels must be one column, got {y.column_names}", reason="shape_mismatch")
        y = y.column(0)
    if isinstance(y, (pa.Array, pa.ChunkedArray)):
        if y.null_count:
            raise BadInputError(f"labels have {y.null_count} null(s)", reason="null")
        return np.asarray(y.to_numpy(zero_copy_only=False))
    return np.asarray(y)
