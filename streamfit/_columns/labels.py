"""Labels and weights: how one schema's label column(s) become ``y`` (:class:`LabelPlan`), and the stream's
labels as state (:class:`Labels`: the classes, given or learned from the first valid batch, and the width of
``y``), with the row checks of labels and weights."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from streamfit._columns.schema import (ColumnProblem, find_column, kind, scalar_float, type_name,
                                       vector_storage_type)
from streamfit._columns.values import Check, finite_checks, float_values, null_mask

__all__ = ["LabelPlan", "plan_label", "Labels", "weight_values"]

logger = logging.getLogger("streamfit.stream")


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
            raise ColumnProblem("wrong_type", name, f"label column '{name}' is {type_name(lt)}, expected integer, "
                                                    "string, dictionary or bool class labels (pass cast=True to "
                                                    "convert float labels)")
        raise ColumnProblem("wrong_type", name, f"label column '{name}' is {type_name(lt)}, expected integer, "
                                                "string, dictionary or bool class labels")
    if len(names) == 1:
        i = find_column(schema, names[0], "label ", fname)
        t = schema.field(i).type
        if kind(t) == "vector":
            st = vector_storage_type(t)
            vkind = kind(st.value_type)
            width = int(np.prod(t.shape)) if isinstance(t, pa.FixedShapeTensorType) else st.list_size
            if vkind != "float" and not (cast and vkind in ("int", "bool", "decimal")):
                raise ColumnProblem("wrong_type", names[0], f"label column '{names[0]}' is {type_name(t)}, "
                                                            f"expected {fname} values")
            return LabelPlan(names, (i,), "vector", width, vkind != "float")
    indices, casts = [], []
    for name in names:
        i, needs_cast = scalar_float(schema, name, "label ", fname, cast)
        indices.append(i)
        casts.append(needs_cast)
    return LabelPlan(names, tuple(indices), "float", len(indices), any(casts))


class Labels:
    """The stream's labels: ``y`` of each record batch under its :class:`LabelPlan`, the classes (given, or
    learned from the first valid batch as ``partial_fit``'s ``classes=`` takes them) and the width of ``y``
    (fixed by the first batch: > 1 is multi-output regression)."""

    def __init__(self, label: "str | Sequence[str]", *, task: str, dtype: np.dtype, classes: Any = None) -> None:
        self.label = label
        self.task = task
        self.dtype = np.dtype(dtype)
        #: values per row of y, fixed by the first batch
        self.width = 1
        self._width_fixed = False
        #: the class labels (sorted), given or learned from the first valid batch
        self.classes: np.ndarray | None = None
        if classes is not None:
            from streamfit._arrow import as_labels

            self.classes = np.unique(as_labels(classes))

    @property
    def y_dtype(self) -> np.dtype:
        """The dtype of ``y`` in a training batch: the classes' (int64 before they are known), else ``dtype``."""
        if self.task != "classification":
            return self.dtype
        return self.classes.dtype if self.classes is not None else np.dtype(np.int64)

    def plan(self, schema: pa.Schema, cast: bool) -> LabelPlan:
        """The label plan of ``schema`` (:func:`plan_label`)."""
        return plan_label(schema, self.label, task=self.task, dtype=self.dtype, cast=cast)

    def fix_width(self, lp: LabelPlan) -> None:
        """The first valid batch fixes the width of ``y``; :class:`ColumnProblem` when a later one differs."""
        if not self._width_fixed:
            self.width, self._width_fixed = lp.width, True
        elif lp.width != self.width:
            raise ColumnProblem("wrong_shape", lp.columns[0], f"label column(s) {list(lp.columns)} give {lp.width} "
                                                              f"values per row, the stream's first gave {self.width}")

    def values(self, batch: pa.RecordBatch, lp: LabelPlan, checks: list[Check]) -> np.ndarray:
        """``y`` of ``batch`` (a classifier's first batch teaches the classes); bad rows go to ``checks``."""
        if lp.kind in ("int", "cast", "class"):
            return self._class_labels(batch.column(lp.indices[0]), lp, checks)
        if lp.kind == "vector":
            y, null = float_values(batch.column(lp.indices[0]), lp.columns[0], lp.cast, lp.width)
            finite_checks(checks, lp.columns[0], y, null)
            return y
        if len(lp.indices) == 1:
            y, null = float_values(batch.column(lp.indices[0]), lp.columns[0], lp.cast, 0)
            finite_checks(checks, lp.columns[0], y, null)
            return y
        y = np.empty((batch.num_rows, len(lp.indices)), dtype=self.dtype)
        for j, (i, name) in enumerate(zip(lp.indices, lp.columns)):
            values, null = float_values(batch.column(i), name, lp.cast, 0)
            finite_checks(checks, name, values, null)
            y[:, j] = values
        return y

    def _class_labels(self, arr: pa.Array, lp: LabelPlan, checks: list[Check]) -> np.ndarray:
        name = lp.columns[0]
        null = null_mask(arr)
        if null is not None:
            checks.append(("null", name, null, np.zeros(len(arr))))
        if lp.kind == "class":  # strings, dictionaries, bool: the values themselves, as classes_ holds them
            from streamfit.features._values import categorical

            cat = categorical(arr)
            uniques = cat.uniques.astype(str) if cat.kind == "string" else (
                cat.uniques.astype(bool) if cat.kind == "bool" else cat.uniques)
            present = uniques[np.unique(cat.index[cat.index >= 0])] if len(uniques) else uniques
            self._learn_classes(present)
            values = uniques[np.maximum(cat.index, 0)] if len(uniques) else np.zeros(len(arr), dtype=uniques.dtype)
            self._unknown_checks(checks, name, values, null)
            return values
        if lp.kind == "int":
            if null is not None:
                arr = arr.fill_null(0)
            values = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            self._learn_classes(values if null is None else values[~null])
            self._unknown_checks(checks, name, values, null)
            return values
        v = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
        finite = np.isfinite(v)
        if not finite.all():
            nf = ~finite if null is None else ~finite & ~null
            if nf.any():
                checks.append(("non_finite", name, nf, v))
        with np.errstate(invalid="ignore"):
            frac = finite & (v != np.floor(v))
        if frac.any():
            checks.append(("non_integer_label", name, frac, v))
        values = np.where(finite & ~frac, v, 0).astype(np.int64)
        ok = finite & ~frac if null is None else finite & ~frac & ~null
        self._learn_classes(values[ok])
        self._unknown_checks(checks, name, values, None if ok.all() else ~ok)
        return values

    def _learn_classes(self, present: np.ndarray) -> None:
        if self.classes is None and len(present):
            self.classes = np.unique(present)
            logger.info("classes taken from the first record batch: %s", self.classes.tolist(),
                        extra={"event": "classes", "fields": {"classes": self.classes.tolist()}})

    def _unknown_checks(self, checks: list[Check], name: str, values: np.ndarray, skip: np.ndarray | None) -> None:
        classes = self.classes
        if classes is None or not len(values):
            return
        try:
            idx = np.clip(np.searchsorted(classes, values), 0, len(classes) - 1)
            unknown = classes[idx] != values
        except TypeError:  # labels of another kind than the classes (strings vs ints)
            unknown = np.ones(len(values), dtype=bool)
        if skip is not None:
            unknown &= ~skip
        if unknown.any():
            checks.append(("unknown_class", name, unknown, values))


def weight_values(batch: pa.RecordBatch, index: int, name: str, cast: bool, checks: list[Check]) -> np.ndarray:
    """The sample weights of ``batch`` (finite, >= 0; bad rows go to ``checks``)."""
    w, null = float_values(batch.column(index), name, cast, 0)
    finite_checks(checks, name, w, null)
    with np.errstate(invalid="ignore"):
        neg = w < 0  # NaN (nulls included) compares False
    if neg.any():
        checks.append(("negative_weight", name, neg, w))
    return w
