"""The column plan: what a run (or an estimator, or a Trainer) reads from record batches, checked once per schema.

One type, :class:`ColumnPlan`, for every use: named model inputs (``inputs=``), the feature matrix of
``features=`` as its single-input case (one float input ``X [n, n_features]`` fed by the feature columns,
inferred from the first valid batch when not named), with the label and the weight of a stream, or without
them in memory (:class:`~streamfit._columns.memory.ColumnInputs`).  Per schema it builds a
:class:`SchemaPlan`; per record batch :meth:`ColumnPlan.extract` gives an :class:`Extracted` (values and the
row checks that failed) and :meth:`ColumnPlan.encode` the encoders' ids of the good rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from streamfit._columns.labels import LabelPlan, Labels, weight_values
from streamfit._columns.layout import ColumnLayout
from streamfit._columns.mapping import ColumnMapping, CompiledInput, Pieces
from streamfit._columns.schema import ColumnProblem, find_column, scalar_float, schema_names
from streamfit._columns.values import Check
from streamfit.features._encoders import EncoderState

__all__ = ["ColumnPlan", "SchemaPlan", "Extracted", "FEATURES"]

logger = logging.getLogger("streamfit.stream")

#: the one input of the feature matrix (``features=``)
FEATURES = "X"


@dataclass(frozen=True)
class _Declared:
    """An input as a model declares it (``name``, ``dtype``, ``shape``): the feature matrix's one input."""

    name: str
    dtype: np.dtype
    shape: tuple[Any, ...]


@dataclass(frozen=True)
class SchemaPlan:
    """One schema's plan (built once per schema, reused for every record batch with it): the model inputs'
    columns, the label's and the weight's (None in memory, where there is no label)."""

    inputs: tuple[CompiledInput, ...]
    label: LabelPlan | None = None
    weight_index: int | None = None
    weight_cast: bool = False
    #: some input is an encoder's, which learns (it is filled by :meth:`ColumnPlan.encode`)
    stateful: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stateful", any(c.encoder is not None for c in self.inputs))

    @property
    def n_values(self) -> int:
        """Values per row over every model input (the feature matrix's ``n_features``)."""
        return sum(c.width for c in self.inputs)


@dataclass(frozen=True)
class Extracted:
    """A record batch's values under ``plan``, before bad rows are dropped: each column input's array or
    :data:`~streamfit._columns.mapping.Pieces` (encoder inputs come from :meth:`ColumnPlan.encode`), ``y``,
    the weights, and the row checks that failed (usually none)."""

    plan: SchemaPlan
    inputs: "dict[str, np.ndarray | Pieces]"
    y: np.ndarray | None
    w: np.ndarray | None
    checks: list[Check]


class ColumnPlan:
    """Columns -> model inputs, label and weight; see the module docstring.

    ``model_inputs`` and ``inputs``: the model's declared inputs and the ``inputs=`` mapping (named inputs);
    without them, ``features`` names the feature matrix's columns (``None``: every column but the label
    and weight of the first valid batch, which must then give ``expected_width`` values per row when that is
    known).  ``label=None``: no label nor weight (in memory).  ``layout``: a saved
    :class:`~streamfit._columns.layout.ColumnLayout` (a resumed run): the features, their widths, label,
    weight and dtype are that layout's; the other arguments must agree.  ``states``: the encoders' learned
    state by input name; ``offers_cast``: whether the user can pass ``cast=`` (a stream can, memory cannot:
    a refused column's error says what to do).
    """

    def __init__(self, model_inputs: "Sequence[Any] | None" = None, inputs: "Mapping[str, Any] | None" = None, *,
                 features: "Sequence[str] | str | None" = None, label: "str | Sequence[str] | None" = "y",
                 weight: str | None = None, task: str = "regression", dtype: Any = np.float32, cast: bool = False,
                 states: "Mapping[str, EncoderState] | None" = None, offers_cast: bool = True,
                 layout: ColumnLayout | None = None, expected_width: int | None = None, classes: Any = None) -> None:
        if task not in ("regression", "classification"):
            raise ValueError(f"Invalid task: {task!r}, expected 'regression' or 'classification'")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"Invalid dtype: {dtype!r}, expected float32 or float64")
        self.task, self.weight, self.cast = task, weight, bool(cast)
        self._init_labels(label, weight, classes)
        if isinstance(features, str):
            features = [features]
        if features is not None:
            features = list(features)
            for name in self._roles:
                if name in features:
                    raise ValueError(f"column {name!r} is both a feature and the label/weight")
        #: the named inputs' mapping (the feature matrix's once its columns and widths are fixed)
        self.mapping: ColumnMapping | None = None
        self.named = inputs is not None
        #: the feature matrix (``features=``): one input ``X``, handed out as an array, not a dict
        self.single = not self.named
        if inputs is not None:
            if features is not None:
                raise ValueError("give features= (one X) or inputs= (named model inputs), not both")
            if model_inputs is None:
                raise ValueError("inputs= needs the model's declared inputs (model_inputs=)")
            self.mapping = ColumnMapping(model_inputs, inputs, cast=cast, states=states, offers_cast=offers_cast)
            for name in self._roles:
                if name in self.mapping.columns:
                    raise ValueError(f"column {name!r} is both a model input's column and the label/weight")
        self.expected_width = expected_width
        self._widths: list[int] | None = None
        if layout is not None:
            features, self._widths = self._check_layout(layout, features)
        self._features: list[str] | None = features
        #: the run's column plan as state (checkpoints), once fixed
        self.layout = layout
        #: values per row over the model inputs, once fixed
        self.n_features: int | None = None if layout is None else layout.n_features
        self._schema: pa.Schema | None = None
        self._last: SchemaPlan | None = None

    def _init_labels(self, label: "str | Sequence[str] | None", weight: str | None, classes: Any) -> None:
        """The label column(s) (``None``: no label nor weight) and how messages name the label and weight."""
        self._roles: dict[str, str] = {}
        self.labels: Labels | None = None
        if label is not None:
            labels = [label] if isinstance(label, str) else list(label)
            if not labels or not all(isinstance(v, str) for v in labels):
                raise ValueError(f"Invalid label: {label!r}, expected a column name or a list of column names")
            label = label if isinstance(label, str) else tuple(labels)
            self.labels = Labels(label, task=self.task, dtype=self.dtype, classes=classes)
            self._roles = {name: "label " for name in labels}
            if weight is not None:
                self._roles.setdefault(weight, "weight ")
        self.label = label

    def _check_layout(self, layout: ColumnLayout, features: "list[str] | None") -> tuple[list[str], list[int]]:
        """A resumed run's features and widths: the saved layout's, which the other arguments must agree with."""
        assert self.label is not None, "a saved layout is a stream's: it has a label"
        layout.check_matches(features=None if self.named else features, label=self.label, weight=self.weight,
                             dtype=self.dtype.name, task=self.task,
                             inputs=None if self.mapping is None else self.mapping.matching())
        if self.expected_width is not None and layout.n_features != self.expected_width:
            raise ValueError(f"the saved column plan gives {layout.n_features} feature values per row "
                             f"({list(layout.features)}), the model takes {self.expected_width}")
        return list(layout.features), list(layout.widths)

    @classmethod
    def in_memory(cls, model_inputs: Sequence[Any], inputs: Mapping[str, Any], *,
                  states: "Mapping[str, EncoderState] | None" = None) -> "ColumnPlan":
        """The plan of in-memory tables: no label, no weight, nothing cast (the caller converts its columns)."""
        return cls(model_inputs, inputs, label=None, states=states, offers_cast=False)

    # ------------------------------------------------------------------ state
    @property
    def features(self) -> list[str] | None:
        """The feature column names (resolved from the first valid batch when not given)."""
        return None if self._features is None else list(self._features)

    @property
    def classes(self) -> np.ndarray | None:
        return None if self.labels is None else self.labels.classes

    # the mapping's state, read by the Trainer (its checkpoints and exported model)
    @property
    def sources(self) -> tuple[Any, ...]:
        """What feeds each model input (:class:`~streamfit._columns.mapping.InputSource`), once known."""
        return () if self.mapping is None else self.mapping.sources

    @property
    def states(self) -> dict[str, EncoderState]:
        """The encoders' learned state by input name."""
        return {} if self.mapping is None else self.mapping.states

    @property
    def column_info(self) -> dict[str, dict[str, Any]]:
        """Column -> its dtype and per-row dims as first seen (the raw inputs of an exported model)."""
        return {} if self.mapping is None else self.mapping.column_info

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]:
        """The inputs' per-row shapes once resolved."""
        return {} if self.mapping is None else self.mapping.row_shapes

    def role(self, column: str) -> str:
        """``"label "``, ``"weight "`` or ``""``: how messages name ``column``."""
        return self._roles.get(column, "")

    # ------------------------------------------------------------------ per schema
    def for_schema(self, schema: pa.Schema) -> SchemaPlan:
        """The plan of ``schema`` (the last one's when it is the same); :class:`ColumnProblem` naming the column."""
        if self._last is not None and (schema is self._schema or schema.equals(self._schema)):
            return self._last
        plan = self.build(schema)
        self._last, self._schema = plan, schema
        return plan

    def current(self, schema: pa.Schema) -> SchemaPlan | None:
        """The last schema's plan when ``schema`` is that schema (no check, no state change), else None."""
        if self._last is not None and (schema is self._schema or schema.equals(self._schema)):
            return self._last
        return None

    def build(self, schema: pa.Schema) -> SchemaPlan:
        """Check ``schema`` against the plan (no cache); the first valid schema fixes what is not given."""
        if self.named:
            assert self.mapping is not None
            compiled = self.mapping.compile(schema)
            plan = self._with_label(schema, compiled)
            if self.layout is None:
                columns = self.mapping.columns
                self.layout = ColumnLayout(tuple(columns), (1,) * len(columns), self.label, self.weight,  # type: ignore[arg-type]
                                           self.dtype.name, self.task, self.mapping.described())
            self.n_features = plan.n_values
            return plan
        names = self._features
        inferred = names is None
        if names is None:
            names = [n for n in schema_names(schema) if n not in self._roles]
        mapping = self.mapping if self._widths is not None and self.mapping is not None else \
            self._feature_mapping(schema, names)
        plan = self._with_label(schema, mapping.compile(schema))
        if self.mapping is None and self._widths is not None:  # the widths of a saved layout
            self.mapping = mapping
        elif self._widths is None:
            (x,) = plan.inputs
            expected, n = self.expected_width, plan.n_values
            if expected is not None and n != expected:
                which = "the record batch's columns but the label/weight" if inferred else "the feature columns"
                raise ColumnProblem("feature_count", None,
                                    f"{which} {names} give {n} values per row, the model takes {expected}"
                                    + (": name the feature columns (features=[...], --features)" if inferred else ""))
            self._features, self._widths, self.n_features = names, [p.width for p in x.parts], n
            self.layout = ColumnLayout(tuple(names), tuple(self._widths), self.label, self.weight,  # type: ignore[arg-type]
                                       self.dtype.name, self.task)
            self.mapping = self._feature_mapping(schema, names)
            if inferred:
                logger.info("features taken from the first record batch: %s (%d values per row)", names, n,
                            extra={"event": "columns", "fields": {"features": names, "widths": self._widths}})
        return plan

    def _feature_mapping(self, schema: pa.Schema, names: list[str]) -> ColumnMapping:
        """The feature matrix's mapping: one float input ``X`` fed by the feature columns ``names``."""
        schema_names(schema)  # a name that is not valid UTF-8 makes the whole schema unreadable
        if not names:
            raise ColumnProblem("missing_column", None,
                                f"no feature columns: the batch has only the label/weight columns {schema.names}")
        for name in sorted({n for n in names if names.count(n) > 1}):  # names read off a schema that has a
            find_column(schema, name, "", self.dtype.name)  # column twice: duplicate_column, never "first wins"
        return ColumnMapping([_Declared(FEATURES, self.dtype, ("N", "n_features"))], {FEATURES: list(names)},
                             cast=self.cast, feature_widths=self._widths)

    def _with_label(self, schema: pa.Schema, compiled: tuple[CompiledInput, ...]) -> SchemaPlan:
        if self.labels is None:
            return SchemaPlan(compiled)
        lp = self.labels.plan(schema, self.cast)
        wi, wc = (None, False)
        if self.weight is not None:
            wi, wc = scalar_float(schema, self.weight, "weight ", self.dtype.name, self.cast)
        self.labels.fix_width(lp)
        return SchemaPlan(compiled, lp, wi, wc)

    # ------------------------------------------------------------------ per record batch
    def extract(self, batch: pa.RecordBatch, plan: SchemaPlan) -> Extracted:
        """The values of ``batch`` and the row checks that failed; changes no state but the classes a
        classifier's first batch teaches (safe in a worker thread once they are known)."""
        assert self.mapping is not None
        checks: list[Check] = []
        inputs = self.mapping.extract(batch, plan.inputs, checks)
        y = w = None
        if plan.label is not None:
            assert self.labels is not None
            y = self.labels.values(batch, plan.label, checks)
        if plan.weight_index is not None:
            w = weight_values(batch, plan.weight_index, str(self.weight), plan.weight_cast, checks)
        return Extracted(plan, inputs, y, w, checks)

    def encode(self, batch: pa.RecordBatch, plan: SchemaPlan, rows: np.ndarray | None, *,
               journal_at: int | None = None, learn: bool = True) -> dict[str, np.ndarray]:
        """The encoder inputs of the good ``rows`` (see :meth:`ColumnMapping.encode`)."""
        assert self.mapping is not None
        return self.mapping.encode(batch, plan.inputs, rows, journal_at=journal_at, learn=learn)

    def commit(self, rows: int, committed: "Mapping[str, EncoderState]") -> None:
        """The stream's first ``rows`` good rows were trained: advance the ``committed`` encoder states."""
        if self.named and self.mapping is not None:
            self.mapping.commit(committed, rows)
