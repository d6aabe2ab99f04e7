"""Arrow columns as numpy values, and the row checks every plan makes (nulls, non-finite floats, integers out
of an input's range): one conversion for features, model inputs, labels and weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamfit._columns.schema import ColumnProblem

__all__ = ["Part", "Check", "BLOCK", "column_values", "float_values", "null_mask", "null_rows", "values_of",
           "value_dtype", "finite_checks", "range_checks", "cast_ids"]

#: rows per copy block: keeps the destination rows in cache for wide buffers
BLOCK = 4096

#: (reason, column, row mask, values shown in messages)
Check = tuple[str, str, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Part:
    """One column of an input: where it is in the record batch and how it converts."""

    column: str
    index: int
    kind: str  # "scalar" | "vector" | "dict"
    width: int
    cast: bool


def column_values(arr: pa.Array, part: Part, dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A column's values (``[n]``, or ``[n, width]`` for a vector column) and its null-row mask (None: no
    nulls); null rows hold arbitrary values."""
    return values_of(arr, part, dtype), null_rows(arr, part)


def value_dtype(t: pa.DataType) -> np.dtype | None:
    storage = t.storage_type if isinstance(t, pa.BaseExtensionType) else t
    if pa.types.is_fixed_size_list(storage):
        storage = storage.value_type
    try:
        return np.dtype(storage.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        return None


def null_rows(arr: pa.Array, p: Part) -> np.ndarray | None:
    storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
    null = None
    if storage.null_count:
        null = np.asarray(storage.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if p.kind == "vector":
        values = storage.values.slice(storage.offset * p.width, len(storage) * p.width)
        if values.null_count:
            child = values.is_null().to_numpy(zero_copy_only=False).reshape(-1, p.width).any(axis=1)
            null = child if null is None else null | child
    return null


def values_of(arr: pa.Array, p: Part, dtype: np.dtype | None) -> np.ndarray:
    """The column's values as numpy (``[n]`` or ``[n, width]``); nulls hold arbitrary values."""
    try:
        if p.kind == "vector":
            storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
            values = storage.values.slice(storage.offset * p.width, len(storage) * p.width)
            if p.cast:
                values = values.cast(pa.float64())
            return values.to_numpy(zero_copy_only=False).reshape(-1, p.width)
        if p.kind == "dict":
            dictionary = arr.dictionary
            if p.cast:
                dictionary = dictionary.cast(pa.float64())
            table = dictionary.to_numpy(zero_copy_only=False)
            index = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
            return table[index] if len(table) else np.zeros(len(arr), dtype=table.dtype)
        if p.cast:
            arr = arr.cast(pa.float64())
        if arr.null_count and pa.types.is_integer(arr.type):
            arr = arr.fill_null(0)
        return arr.to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ColumnProblem("wrong_type", p.column, f"column '{p.column}' is {arr.type} and cannot be "
                                                    f"converted: {exc}") from exc


def finite_checks(checks: list, name: str, values: np.ndarray, null: np.ndarray | None) -> None:
    """Append ``("null", ...)`` and ``("non_finite", ...)`` checks for ``values``; one pass when all is well."""
    if null is not None:
        checks.append(("null", name, null, values[:, 0] if values.ndim == 2 else values))
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(values.sum()):
            return
    bad = ~np.isfinite(values)
    if bad.ndim == 2:
        bad = bad.any(axis=1)
    if null is not None:
        bad &= ~null
    if bad.any():
        shown = values if values.ndim == 1 else values[np.arange(len(values)), np.argmax(~np.isfinite(values), axis=1)]
        checks.append(("non_finite", name, bad, shown))


def range_checks(checks: list, name: str, values: np.ndarray, dtype: np.dtype, null: np.ndarray | None) -> None:
    if values.dtype.kind not in "iu" or np.can_cast(values.dtype, dtype, "safe") or values.size == 0:
        return
    info = np.iinfo(dtype)
    flat = values.reshape(len(values), -1)
    bad = ((flat < info.min) | (flat > info.max)).any(axis=1)
    if null is not None:
        bad &= ~null
    if bad.any():
        checks.append(("out_of_range", name, bad, flat[:, 0]))


def cast_ids(ids: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    if ids.dtype == dtype:
        return ids
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if ids.size and (ids.min() < info.min or ids.max() > info.max):
            raise ColumnProblem("out_of_range", None, f"ids up to {int(ids.max())} do not fit input {name!r} "
                                                      f"({dtype})")
    return ids.astype(dtype)


def null_mask(arr: pa.Array) -> np.ndarray | None:
    """The null rows of a (scalar) column, None when it has no nulls."""
    if not arr.null_count:
        return None
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def float_values(arr: pa.Array, name: str, cast: bool, width: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Values of a float label/weight column (1-D) or vector label column (2-D, ``width`` > 0), and its
    null-row mask."""
    return column_values(arr, Part(name, -1, "vector" if width else "scalar", width or 1, cast))
