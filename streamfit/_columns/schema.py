"""Schema checks every column plan shares: finding a column by name, element kinds, a type's name in messages.

* :func:`find_column` finds a column by name: missing, duplicated and non-UTF-8 names are refused
  (:class:`ColumnProblem`), never read as "first wins";
* :func:`kind` classifies a column type's elements once for every plan;
* :func:`scalar_float` checks a float column (a weight, a regression label) under the type policy of
  :mod:`streamfit._columns` (integer/bool/decimal columns only with ``cast=True``).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

__all__ = ["ColumnProblem", "kind", "vector_storage_type", "type_name", "canonical_json", "schema_names",
           "find_column", "scalar_float"]


class ColumnProblem(Exception):
    """A schema does not match the column spec; the rebatcher adds the position and policy."""

    def __init__(self, reason: str, column: str | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.column = column
        self.message = message


def kind(t: pa.DataType) -> str:
    """The element kind of a column type: ``float``, ``int``, ``bool``, ``decimal``, ``vector`` (a
    FixedSizeList or fixed_shape_tensor) or ``other``.

    >>> kind(pa.float32()), kind(pa.list_(pa.int64(), 3)), kind(pa.string())
    ('float', 'vector', 'other')
    """
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_fixed_size_list(t):
        return "vector"
    return "other"


def vector_storage_type(t: pa.DataType) -> pa.FixedSizeListType:
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else t


def type_name(t: pa.DataType) -> str:
    if isinstance(t, pa.FixedShapeTensorType):
        return f"fixed_shape_tensor<{t.value_type}>{list(t.shape)}"
    return str(t)


def canonical_json(value: Any) -> str:
    """One spelling of a JSON value: sorted keys, no spaces, whole floats as integers (``pad=0`` and
    ``pad=0.0`` are the same padding).

    >>> canonical_json({"pad": 0.0, "column": "t"})
    '{"column":"t","pad":0}'
    """
    def norm(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        return v

    return json.dumps(norm(value), sort_keys=True, separators=(",", ":"))


def schema_names(schema: pa.Schema) -> list[str]:
    """The column names; :class:`ColumnProblem` ``invalid_name`` if one is not valid UTF-8."""
    try:
        return schema.names
    except UnicodeDecodeError:
        for i in range(len(schema)):
            try:
                schema.field(i).name
            except UnicodeDecodeError as exc:
                raise ColumnProblem("invalid_name", None,
                                    f"column {i} has a name that is not valid UTF-8 ({bytes(exc.object)!r}), "
                                    "expected UTF-8 column names") from None
        raise  # pragma: no cover - names failed but no single field did


def find_column(schema: pa.Schema, name: str, role: str, expected: str) -> int:
    """The index of column ``name``; :class:`ColumnProblem` if it is missing or present twice."""
    idx = schema.get_all_field_indices(name)
    if not idx:
        names = schema_names(schema)
        present = ", ".join(repr(n) for n in names[:10])
        more = ", ..." if len(names) > 10 else ""
        raise ColumnProblem("missing_column", name,
                            f"{role}column '{name}' is missing, expected {expected} "
                            f"(columns present: {present}{more})")
    if len(idx) > 1:
        raise ColumnProblem("duplicate_column", name,
                            f"{role}column '{name}' appears {len(idx)} times (columns {idx}), expected exactly "
                            "one column of that name")
    return idx[0]


def scalar_float(schema: pa.Schema, name: str, role: str, expected: str, cast: bool) -> tuple[int, bool]:
    i = find_column(schema, name, role, expected)
    t = schema.field(i).type
    k = kind(t)
    if k == "float":
        return i, False
    if k in ("int", "bool", "decimal"):
        if cast:
            return i, True
        raise ColumnProblem("wrong_type", name, f"{role}column '{name}' is {type_name(t)}, expected {expected} "
                                                f"(pass cast=True to convert {k} columns)")
    raise ColumnProblem("wrong_type", name, f"{role}column '{name}' is {type_name(t)}, expected {expected}")
