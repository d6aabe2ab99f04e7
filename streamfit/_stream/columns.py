"""What the column plan shares: schema checks, element kinds, labels and weights, and the run's layout.

The plan itself (:mod:`streamfit._stream.inputs`) turns columns into model inputs; the feature matrix of
``features=`` is its single-input case.  This module holds what every plan needs per schema and the
state a run keeps:

* finding a column by name (:func:`find_column`: missing, duplicated, non-UTF-8 names refused), one
  element-kind classification (:func:`kind`) and how a type is named in messages;
* the label (:func:`plan_label`) and the weight column;
* :class:`ColumnLayout`, the run's column plan as state, saved in checkpoints.

Type policy (nothing is coerced silently):

* features, a regression label and weights must be floating columns (float16/32/64); they are converted
  to the training ``dtype`` (a change of float precision, not of kind).  Integer, bool and decimal
  columns are refused ("column 'x3' is int64, expected float32") unless ``cast=True`` is given.
* a feature may also be a vector column: ``FixedSizeList<float, d>`` or ``fixed_shape_tensor``
  (width = product of the shape); it is taken zero-copy when a training batch lies inside one record batch;
  a dictionary column of numbers is decoded.
* a classification label is an integer, string, large_string, dictionary or bool column, mapped through
  the classes (given, or learned from the first batch as ``partial_fit(classes=)`` takes them): a label not
  among them is a bad row (``unknown_class``).  With ``cast=True`` float columns are accepted; float rows
  that are not whole numbers are bad rows (``non_integer_label``).
* a regression label is one float column, several (multi-output ``[n, k]``) or one ``FixedSizeList`` /
  ``fixed_shape_tensor`` column (``[n, d]``).
* strings, nested lists, timestamps... are refused as features (``wrong_type``), even with ``cast=True``:
  strings need an encoder (:mod:`streamfit.features`).

Schema policy: columns are read by name (extra columns are ignored, reordered ones read where they are);
a schema with a name that is not valid UTF-8 (``invalid_name``) or with a column the plan reads present
twice (``duplicate_column``) is refused as a whole, never read as "first wins".

The run's column plan is state (:class:`ColumnLayout`): the feature order and widths (or the model inputs'
mapping), label, weight and dtype fixed once, saved in checkpoints and enforced on resume, so a message with
extra or reordered columns never changes what the model is fed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["ColumnProblem", "ColumnLayout", "LabelPlan", "plan_label", "schema_names", "kind", "find_column"]


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


def _type_name(t: pa.DataType) -> str:
    if isinstance(t, pa.FixedShapeTensorType):
        return f"fixed_shape_tensor<{t.value_type}>{list(t.shape)}"
    return str(t)


@dataclass(frozen=True)
class ColumnLayout:
    """The run's column plan as state: which columns feed ``X`` in which order, and the label/weight/dtype.

    Fixed by the first valid record batch (or given), saved in checkpoints (:meth:`to_json`) and
    enforced on resume (:meth:`check_matches`), so later messages are read by name into the same layout.

    >>> layout = ColumnLayout(("x0", "emb"), (1, 4), "y", None, "float32", "regression")
    >>> ColumnLayout.from_json(layout.to_json()) == layout, layout.n_features
    (True, 5)
    """

    features: tuple[str, ...]
    widths: tuple[int, ...]
    label: "str | tuple[str, ...]"
    weight: str | None
    dtype: str
    task: str
    #: with named model inputs: (input name, what feeds it as canonical JSON) in model order; checkpoints
    #: hold the JSON objects (``{"columns": [...]}``, ``{"encoder": "Hashed", "columns": [...], ...}``).
    #: Checkpoints written before held ``repr`` strings: such an entry is kept as that string (legacy).
    inputs: tuple[tuple[str, str], ...] = ()

    @property
    def n_features(self) -> int:
        return sum(self.widths)

    def __eq__(self, other: object) -> bool:  # the inputs mapping compares as a mapping (JSON may reorder it)
        if not isinstance(other, ColumnLayout):
            return NotImplemented
        return (self.features, self.widths, self.label, self.weight, self.dtype, self.task, dict(self.inputs)) == (
            other.features, other.widths, other.label, other.weight, other.dtype, other.task, dict(other.inputs))

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features), "widths": list(self.widths),
                "label": self.label if isinstance(self.label, str) else list(self.label),
                "weight": self.weight, "dtype": self.dtype, "task": self.task,
                **({"inputs": {k: v if _legacy(v) else json.loads(v) for k, v in self.inputs}} if self.inputs else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ColumnLayout":
        """Parse :meth:`to_json` output; ``ValueError`` naming the field that is malformed."""
        try:
            if not isinstance(data["features"], list) or not isinstance(data["widths"], list):
                raise TypeError("features and widths must be lists")
            features = tuple(data["features"])
            widths = tuple(data["widths"])
            label = data["label"]
            if isinstance(label, list) and label and all(isinstance(v, str) for v in label):
                label = tuple(label)
            inputs = data.get("inputs") or {}
            if not isinstance(inputs, dict) or not all(isinstance(v, (str, dict)) for v in inputs.values()):
                raise TypeError("inputs must map input names to what feeds them")
            if not all(isinstance(v, str) or isinstance(v.get("columns"), list) or isinstance(v.get("column"), str)
                       for v in inputs.values()):
                raise TypeError("an input's source names no columns")
            layout = cls(features, widths, label, data.get("weight"), data["dtype"], data["task"],
                         tuple((str(k), v if isinstance(v, str) else canonical_json(v)) for k, v in inputs.items()))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed column layout {dict(data)!r}: {exc!r}") from None
        if (len(features) != len(widths) or not all(isinstance(f, str) for f in features)
                or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths)
                or not isinstance(layout.label, (str, tuple)) or not (layout.weight is None or isinstance(layout.weight, str))
                or layout.dtype not in ("float32", "float64") or layout.task not in ("regression", "classification")):
            raise ValueError(f"malformed column layout {dict(data)!r}")
        return layout

    def check_matches(self, *, features: Sequence[str] | None, label: "str | Sequence[str]", weight: str | None,
                      dtype: str, task: str, what: str = "the saved column plan",
                      inputs: "Sequence[tuple[str, str, str]] | None" = None) -> None:
        """``ValueError`` naming every difference between this layout and a configuration.

        ``inputs``: the configured mapping as (input name, canonical JSON, legacy ``repr``) triples (a layout
        read from an older checkpoint compares its ``repr`` strings)."""
        diffs = []
        if inputs is not None and self.inputs:
            given = {name: legacy if _legacy(dict(self.inputs).get(name, "{")) else spec
                     for name, spec, legacy in inputs}
            if given != dict(self.inputs):
                diffs.append(f"inputs {dict(self.inputs)} (configured: {given})")
        label = label if isinstance(label, str) else tuple(label)
        if features is not None and tuple(features) != self.features:
            diffs.append(f"features {list(self.features)} (configured: {list(features)})")
        for name, mine, configured in (("label", self.label, label), ("weight", self.weight, weight),
                                       ("dtype", self.dtype, dtype), ("task", self.task, task)):
            if mine != configured:
                diffs.append(f"{name} {mine!r} (configured: {configured!r})")
        if diffs:
            raise ValueError(f"{what} has " + "; ".join(diffs)
                             + ": a run keeps its columns (configure the same ones, or start a new run)")


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


def _legacy(spec: str) -> bool:
    """A mapping entry saved as a ``repr`` string (checkpoints before the typed form) rather than JSON."""
    return not spec.startswith("{")


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


def _scalar_float(schema: pa.Schema, name: str, role: str, expected: str, cast: bool) -> tuple[int, bool]:
    i = find_column(schema, name, role, expected)
    t = schema.field(i).type
    k = kind(t)
    if k == "float":
        return i, False
    if k in ("int", "bool", "decimal"):
        if cast:
            return i, True
        raise ColumnProblem("wrong_type", name, f"{role}column '{name}' is {_type_name(t)}, expected {expected} "
                                                f"(pass cast=True to convert {k} columns)")
    raise ColumnProblem("wrong_type", name, f"{role}column '{name}' is {_type_name(t)}, expected {expected}")


@dataclass(frozen=True)
class LabelPlan:
    """How one schema's label column(s) become ``y``.

    ``kind``: ``"float"`` (regression, scalar columns: ``y`` is ``[n]`` or ``[n, k]`` for k columns),
    ``"vector"`` (regression, one FixedSizeList / fixed_shape_tensor column: ``[n, d]``), ``"int"``
    (integer class labels), ``"cast"`` (float class labels converted, ``cast=True``), ``"class"``
    (string, dictionary or bool class labels, mapped through the classes).
    """

    columns: tuple[str, ...]
    indices: tuple[int, ...]
    kind: str
    width: int
    cast: bool

    @property
    def multi(self) -> bool:
        return self.kind == "vector" or len(self.indices) > 1


def plan_label(schema: pa.Schema, label: "str | Sequence[str]", *, task: str, dtype: np.dtype,
               cast: bool) -> LabelPlan:
    """Check the label column(s) of ``schema``; :class:`ColumnProblem` naming the column."""
    names = (label,) if isinstance(label, str) else tuple(label)
    fname = np.dtype(dtype).name
    if task == "classification":
        if len(names) != 1:
            raise ColumnProblem("wrong_type", names[0], f"a classifier takes one label column, got {list(names)}")
        (name,) = names
        li = find_column(schema, name, "label ", "class labels")
        lt = schema.field(li).type
        value_type = lt.value_type if pa.types.is_dictionary(lt) else lt
        lkind = kind(value_type)
        text = pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
        if text or lkind == "bool" or (pa.types.is_dictionary(lt) and lkind == "int"):
            return LabelPlan(names, (li,), "class", 1, False)
        if lkind == "int":
            return LabelPlan(names, (li,), "int", 1, False)
        if lkind == "float" and cast:
            return LabelPlan(names, (li,), "cast", 1, True)
        if lkind == "float":
            raise ColumnProblem("wrong_type", name, f"label column '{name}' is {_type_name(lt)}, expected integer, "
                                                    "string, dictionary or bool class labels (pass cast=True to "
                                                    "convert float labels)")
        raise ColumnProblem("wrong_type", name, f"label column '{name}' is {_type_name(lt)}, expected integer, "
                                                "string, dictionary or bool class labels")
    if len(names) == 1:
        i = find_column(schema, names[0], "label ", fname)
        t = schema.field(i).type
        if kind(t) == "vector":
            st = vector_storage_type(t)
            vkind = kind(st.value_type)
            width = int(np.prod(t.shape)) if isinstance(t, pa.FixedShapeTensorType) else st.list_size
            if vkind != "float" and not (cast and vkind in ("int", "bool", "decimal")):
                raise ColumnProblem("wrong_type", names[0], f"label column '{names[0]}' is {_type_name(t)}, "
                                                            f"expected {fname} values")
            return LabelPlan(names, (i,), "vector", width, vkind != "float")
    indices, casts = [], []
    for name in names:
        i, needs_cast = _scalar_float(schema, name, "label ", fname, cast)
        indices.append(i)
        casts.append(needs_cast)
    return LabelPlan(names, tuple(indices), "float", len(indices), any(casts))
