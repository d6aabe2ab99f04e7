"""Categorical Arrow columns as (kind, distinct values, per-row index): what the encoders work on.

A string, large_string or dictionary column is dictionary-encoded by Arrow (its values hashed or looked
up once per batch, not once per row); integers are widened to int64, bool to 0/1.  Nulls get index -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Categorical", "categorical", "kind_of"]


@dataclass(frozen=True)
class Categorical:
    """One column's values: ``uniques[index[r]]`` is row r's value (``index[r] == -1``: null)."""

    kind: str  # "string" | "int" | "bool"
    uniques: np.ndarray  # object (str) or int64
    index: np.ndarray  # int64, -1 = null


def kind_of(t: pa.DataType) -> str | None:
    """``"string"``, ``"int"`` or ``"bool"`` for a column type an encoder takes, else None."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "string"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_boolean(t):
        return "bool"
    return None


def _plain(values: pa.Array, kind: str) -> np.ndarray:
    if kind == "string":
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=object)
    if kind == "bool":
        values = values.cast(pa.int8())
    return values.cast(pa.int64(), safe=False).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def categorical(arr: "pa.Array | pa.ChunkedArray") -> Categorical:
    """Distinct values and row indices of a string/dictionary/integer/bool column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    kind = kind_of(arr.type)
    if kind is None:
        raise TypeError(f"{arr.type} is not a categorical type")
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    dictionary = arr.dictionary
    index = arr.indices.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)
    if dictionary.null_count:  # a null stored in the dictionary itself
        nulls = np.flatnonzero(dictionary.is_null().to_numpy(zero_copy_only=False))
        index = np.where(np.isin(index, nulls), -1, index)
        dictionary = dictionary.fill_null("" if kind == "string" else 0)
    return Categorical(kind, _plain(dictionary, kind), np.asarray(index, dtype=np.int64))
