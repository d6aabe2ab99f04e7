"""The column plan: Arrow record batches -> one array per model input; the feature matrix is its
single-input case.

``inputs`` maps each model input name to a column name, a list of column names or an encoder
(:mod:`streamfit.features`); an input it does not name reads the column of its name.  ``features=`` (one
``X``) is the same plan for one float input ``[n, n_features]`` fed by the feature columns
(:func:`make_plan`).  Per schema, :meth:`InputPlan.compile` checks every column against the input it feeds
(element kind, width, rank) once; :meth:`InputPlan.extract` then turns a record batch into
``{input name: array}`` with each input's declared dtype and per-row shape:

* one scalar column -> ``[n]`` (or ``[n, 1]``); several scalar columns -> ``[n, k]`` reshaped to the
  declared shape (``k`` = product of the per-row dims); into a ``[n, features]`` input, scalar and vector
  columns are concatenated (as ``features=`` does);
* a ``FixedSizeList`` or ``fixed_shape_tensor`` column -> ``[n, d]`` reshaped to the declared shape
  (a CNN's ``[n, 1, 8, 8]``), zero-copy when the values already have the input's dtype and no nulls;
* a dictionary column of numbers is decoded (each dictionary value converted once);
* an encoder's ids (int64) are cast to the input's integer dtype.

Type policy (see :mod:`streamfit._stream.columns`): float inputs take float columns
(integer/bool/decimal ones with ``cast=True``); integer inputs take integer and bool columns (values
outside the input's range are bad rows, ``out_of_range``); bool inputs take bool columns; strings need an
encoder.  Nulls and non-finite floats are bad rows (``null``, ``non_finite``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pyarrow as pa

from streamfit._stream.columns import (ColumnProblem, LabelPlan, _scalar_float, _type_name, canonical_json, find_column,
                                       kind, plan_label, schema_names)
from streamfit.features._encoders import EncodeProblem, Encoder, EncoderState, Mask, Padded, Vocabulary

__all__ = ["InputSource", "InputPlan", "CompiledInputs", "ColumnInputs", "normalize_inputs", "check_inputs", "Check", "FeatureColumn",
           "ColumnPlan", "make_plan", "FEATURES", "column_values", "finite_checks"]

#: the one input of the feature matrix (``features=``)
FEATURES = "X"

_BLOCK = 4096  # rows per copy block (as the rebatcher's ring copies)

#: (reason, column, row mask, values shown in messages)
Check = tuple[str, str, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class InputSource:
    """What feeds one model input: columns read as they are, or an encoder of columns."""

    input: str
    columns: tuple[str, ...]
    encoder: Encoder | None = None

    def describe(self) -> str:
        """The ``repr`` form (how checkpoints before the typed form named it; messages)."""
        if self.encoder is not None:
            return repr(self.encoder)
        return repr(self.columns[0]) if len(self.columns) == 1 else repr(list(self.columns))

    def spec(self) -> dict[str, Any]:
        """What feeds the input as a typed JSON object: ``{"columns": [...]}`` or ``{"encoder": "Hashed",
        "columns": [...], "buckets": ..., "seed": ...}`` (an encoder's parameters by name).

        >>> InputSource("x", ("a", "b")).spec()
        {'columns': ['a', 'b']}
        """
        if self.encoder is None:
            return {"columns": list(self.columns)}
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self.encoder).items()}
        return {"encoder": type(self.encoder).__name__, **params}


def normalize_inputs(inputs: Mapping[str, Any]) -> tuple[InputSource, ...]:
    """Validate an ``inputs=`` mapping (input name -> column | list of columns | encoder)."""
    if not isinstance(inputs, Mapping) or not inputs:
        raise ValueError(f"inputs must be a non-empty mapping {{model input name: column(s) or encoder}}, "
                         f"got {inputs!r}")
    out = []
    for name, spec in inputs.items():
        if not isinstance(name, str):
            raise ValueError(f"inputs: model input names must be strings, got {name!r}")
        if isinstance(spec, Encoder):
            out.append(InputSource(name, tuple(spec.columns), spec))
        elif isinstance(spec, str) and spec:
            out.append(InputSource(name, (spec,)))
        elif isinstance(spec, (list, tuple)) and spec and all(isinstance(c, str) and c for c in spec):
            if len(set(spec)) != len(spec):
                raise ValueError(f"inputs[{name!r}] names a column twice: {list(spec)}")
            out.append(InputSource(name, tuple(spec)))
        else:
            raise ValueError(f"inputs[{name!r}] must be a column name, a list of column names or a "
                             f"streamfit.features encoder, got {spec!r}")
    return tuple(out)


@dataclass(frozen=True)
class _Part:
    """One column of an input: where it is in the record batch and how it converts."""

    column: str
    index: int
    kind: str  # "scalar" | "vector" | "dict"
    width: int
    cast: bool


@dataclass(frozen=True)
class _CompiledInput:
    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    parts: tuple[_Part, ...]
    encoder: Encoder | None
    zero_copy: bool


@dataclass(frozen=True)
class CompiledInputs:
    """The plan for one schema (built once per schema, reused for every batch with it)."""

    inputs: tuple[_CompiledInput, ...]

    @property
    def stateful(self) -> bool:
        return any(c.encoder is not None for c in self.inputs)


def _accepts(input_kind: str, col_kind: str, cast: bool) -> tuple[bool, bool]:
    """(accepted, needs an explicit cast) for a column element kind feeding an input element kind."""
    if input_kind == "f":
        if col_kind == "float":
            return True, False
        return (cast, True) if col_kind in ("int", "bool", "decimal") else (False, False)
    if input_kind in "iu":
        return (col_kind in ("int", "bool")), False
    if input_kind == "b":
        return col_kind == "bool", False
    return False, False


class InputPlan:
    """Fill every model input from a record batch; see the module docstring.

    ``model_inputs``: objects with ``name``, ``dtype`` and ``shape`` (dim 0 the batch; ints fixed),
    e.g. :class:`streamfit._engine.prepare.model.ModelInput`.  ``states``: the encoders' learned state by input
    name (fresh states when missing).  ``offers_cast``: whether the caller has a ``cast=`` option the user
    can set (a stream's); a refused column's error then says to pass it, else to convert the column first.
    """

    def __init__(self, model_inputs: Sequence[Any], inputs: Mapping[str, Any], *, cast: bool = False,
                 states: Mapping[str, EncoderState] | None = None,
                 feature_widths: "Sequence[int] | None | Literal[False]" = False, offers_cast: bool = True) -> None:
        #: the feature matrix (``features=``): False, else the widths of its columns once fixed (None before)
        self._features = feature_widths is not False
        self._widths = None if feature_widths is False or feature_widths is None else list(feature_widths)
        self.sources = normalize_inputs(inputs)
        declared = {m.name: m for m in model_inputs}
        names = [s.input for s in self.sources]
        unknown = [n for n in names if n not in declared]
        if unknown:
            from streamfit.exceptions import ModelError

            raise ModelError(f"inputs= names {unknown}, which the model does not have; its inputs are "
                             f"{[m.name for m in model_inputs]}")
        # an unmapped model input reads the column of its name
        self.sources += tuple(InputSource(m.name, (m.name,)) for m in model_inputs if m.name not in names)
        names = [s.input for s in self.sources]
        self.model_inputs = tuple(declared[n] for n in names)
        for s, m in zip(self.sources, self.model_inputs):
            _check_against_model(s, m)
        self.cast = bool(cast)
        self.offers_cast = offers_cast
        self.states: dict[str, EncoderState] = {}
        for s in self.sources:
            if s.encoder is not None:
                given = (states or {}).get(s.input)
                self.states[s.input] = given if given is not None else s.encoder.new_state()
        #: per-row shapes once resolved (unknown declared dims are fixed by the first schema)
        self.row_shapes: dict[str, tuple[int, ...]] = {}
        #: column -> {"dtype": numpy dtype name or "str", "dims": per-row dims} as first seen (the raw inputs
        #: of an exported model)
        self.column_info: dict[str, dict[str, Any]] = {}
        self._rows_encoded = 0

    def described(self) -> tuple[tuple[str, str], ...]:
        """(input name, what feeds it as canonical JSON) in model order: the mapping as a run's state
        (:class:`~streamfit._stream.columns.ColumnLayout`, checkpoints)."""
        return tuple((s.input, canonical_json(s.spec())) for s in self.sources)

    def matching(self) -> tuple[tuple[str, str, str], ...]:
        """(input name, canonical JSON, ``repr`` form): what a saved layout is checked against (layouts of
        older checkpoints hold the ``repr`` form)."""
        return tuple((s.input, canonical_json(s.spec()), s.describe()) for s in self.sources)

    @property
    def columns(self) -> list[str]:
        """Every column the plan reads, in input order."""
        out: list[str] = []
        for s in self.sources:
            out += [c for c in s.columns if c not in out]
        return out

    # -- per schema ---------------------------------------------------------------------------------
    def compile(self, schema: pa.Schema) -> CompiledInputs:
        """Check ``schema`` against every input; :class:`ColumnProblem` naming the column and the input."""
        schema_names(schema)
        compiled = CompiledInputs(tuple(self._compile_one(schema, s, m)
                                        for s, m in zip(self.sources, self.model_inputs)))
        for c in self.columns:
            if c not in self.column_info:
                self.column_info[c] = _column_info(schema.field(schema.get_field_index(c)).type,
                                                   self.row_shapes)
        return compiled

    def _declared_row_shape(self, m: Any) -> tuple[Any, ...]:
        shape = tuple(m.shape)
        return shape[1:] if shape else ()

    def _hint(self, dtype: np.dtype, col_kind: str, column: str, width: int | None = None) -> str:
        return _hint(dtype, col_kind, column, width, self.offers_cast)

    def _fix_shape(self, m: Any, total: int | None, last: int | None = None) -> tuple[int, ...]:
        """The per-row shape of input ``m`` given the values per row the columns give (``total``)."""
        if m.name in self.row_shapes:
            shape = self.row_shapes[m.name]
        else:
            dims = list(self._declared_row_shape(m))
            unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
            if unknown:
                if last is not None and unknown == [len(dims) - 1]:
                    dims[-1] = last
                elif total is not None and len(unknown) == 1:
                    known = math.prod(d for d in dims if isinstance(d, int))
                    if known == 0 or total % known:
                        dims[unknown[0]] = -1
                    else:
                        dims[unknown[0]] = total // known
                else:
                    dims = [-1]
            shape = tuple(dims)
        if total is not None and (any(d < 0 for d in shape) or math.prod(shape) != total):
            raise ColumnProblem("wrong_shape", None, f"input {m.name!r} takes {list(shape)} values per row "
                                                     f"(shape {_shape_text(m.shape)}), its columns give {total}")
        self.row_shapes.setdefault(m.name, shape)
        return shape

    def _compile_one(self, schema: pa.Schema, s: InputSource, m: Any) -> _CompiledInput:
        dtype = np.dtype(m.dtype)
        where = "" if self._features else f" (input {m.name!r}, {dtype}, shape {_shape_text(m.shape)})"
        if s.encoder is not None:
            indices = [find_column(schema, c, "", f"a column for {type(s.encoder).__name__}") for c in s.columns]
            if dtype.kind not in "iuf":
                raise ColumnProblem("wrong_type", s.columns[0], f"{type(s.encoder).__name__} gives integer ids but "
                                                                f"input {m.name!r} is {dtype}")
            enc = s.encoder
            if isinstance(enc, (Padded, Mask)):
                length = enc.length
                if length is None:
                    dims = self._declared_row_shape(m)
                    length = dims[-1] if dims and isinstance(dims[-1], int) else None
                    if length is None:
                        raise ColumnProblem("wrong_shape", enc.column, f"{enc!r} has no length and input "
                                                                       f"{m.name!r} has no fixed last dimension")
                self._fix_shape(m, length if len(self._declared_row_shape(m)) <= 1 else None, last=length)
            else:
                self._fix_shape(m, enc.width)
            return _CompiledInput(m.name, dtype, self.row_shapes[m.name],
                                  tuple(_Part(c, i, "encoder", 1, False) for c, i in zip(s.columns, indices)), enc, False)
        parts = []
        for j, c in enumerate(s.columns):
            i = find_column(schema, c, "", f"{dtype}{where}")
            t = schema.field(i).type
            storage = t.storage_type if isinstance(t, pa.BaseExtensionType) else t
            fixed = None if self._widths is None else self._widths[j]  # the feature matrix's, once fixed
            if pa.types.is_fixed_size_list(storage):
                vkind = kind(storage.value_type)
                ok, needs_cast = _accepts(dtype.kind, vkind, self.cast)
                width = int(np.prod(t.shape)) if isinstance(t, pa.FixedShapeTensorType) else storage.list_size
                if self._features:
                    expected = f"fixed_size_list<{dtype}>[{width if fixed is None else fixed}]"
                    if not ok:
                        hint = self._hint(dtype, vkind, c, width)
                        raise ColumnProblem("wrong_type", c, f"column '{c}' is {_type_name(t)}, expected {expected}{hint}")
                    if fixed is not None and width != fixed:
                        raise ColumnProblem("wrong_type", c, f"column '{c}' is {_type_name(t)}, expected {expected}")
                elif not ok:
                    raise ColumnProblem("wrong_type", c, f"column '{c}' is {_type_name(t)}, expected values of "
                                                         f"{dtype}{where}"
                                                         + self._hint(dtype, vkind, c, width))
                parts.append(_Part(c, i, "vector", width, needs_cast))
                continue
            if pa.types.is_dictionary(t):
                vkind = kind(t.value_type)
                ok, needs_cast = _accepts(dtype.kind, vkind, self.cast)
                if not ok:
                    raise ColumnProblem("wrong_type", c, f"column '{c}' is {_type_name(t)}, expected {dtype}{where}"
                                                         + self._hint(dtype, vkind, c))
                parts.append(_Part(c, i, "dict", 1, needs_cast))
            elif pa.types.is_list(t) or pa.types.is_large_list(t):
                raise ColumnProblem("wrong_type", c, f"column '{c}' is {t} (variable length), expected {dtype}{where}: "
                                                     f"use streamfit.features.Padded('{c}', pad=...) for this input")
            else:
                k = kind(t)
                ok, needs_cast = _accepts(dtype.kind, k, self.cast)
                if not ok:
                    raise ColumnProblem("wrong_type", c, f"column '{c}' is {_type_name(t)}, expected {dtype}{where}"
                                                         + self._hint(dtype, k, c))
                parts.append(_Part(c, i, "scalar", 1, needs_cast))
            if fixed is not None and fixed != 1:
                raise ColumnProblem("wrong_type", c, f"column '{c}' is {_type_name(t)}, expected "
                                                     f"fixed_size_list<{dtype}>[{fixed}]")
        if len(parts) > 1 and any(p.kind == "vector" for p in parts) and len(self._declared_row_shape(m)) != 1:
            raise ColumnProblem("wrong_type", None, f"input {m.name!r} mixes vector and scalar columns "
                                                    f"{list(s.columns)}; map it to one vector column or to scalar columns "
                                                    "(columns are concatenated only into a [N, features] input)")
        total = sum(p.width for p in parts)
        shape = self._fix_shape(m, total)
        zero_copy = (len(parts) == 1 and not parts[0].cast and parts[0].kind in ("vector", "scalar")
                     and _value_dtype(schema.field(parts[0].index).type) == dtype)
        return _CompiledInput(m.name, dtype, shape, tuple(parts), None, zero_copy)

    # -- per batch ----------------------------------------------------------------------------------
    def extract(self, batch: pa.RecordBatch, compiled: CompiledInputs) -> tuple[dict[str, np.ndarray], list[Check]]:
        """The arrays of the column inputs (``[n, *row_shape]``) and the row checks that failed.

        Changes no state (safe in a worker thread); encoder inputs are filled by :meth:`encode`."""
        checks: list[Check] = []
        out: dict[str, np.ndarray] = {}
        n = batch.num_rows
        for c in compiled.inputs:
            if c.encoder is not None:
                continue
            if c.zero_copy and not batch.column(c.parts[0].index).null_count:
                values = _values(batch.column(c.parts[0].index), c.parts[0], c.dtype)
                values = values.reshape((n, *c.row_shape))
                if c.dtype.kind == "f":
                    finite_checks(checks, c.parts[0].column, values.reshape(n, -1), None)
                out[c.name] = values
                continue
            buf = np.empty((n, sum(p.width for p in c.parts)), dtype=c.dtype)
            offset = 0
            nulls: list[tuple[_Part, int, np.ndarray | None]] = []
            parts: list[tuple[int, int, np.ndarray]] = []
            for p in c.parts:
                arr = batch.column(p.index)
                null = _null_rows(arr, p)
                values = _values(arr, p, c.dtype if c.dtype.kind != "f" else None)
                if c.dtype.kind != "f":
                    if null is not None:
                        checks.append(("null", p.column, null, np.zeros(n)))
                    _range_checks(checks, p.column, values, c.dtype, null)
                nulls.append((p, offset, null))
                parts.append((offset, p.width, values.reshape(n, p.width)))
                offset += p.width
            with np.errstate(invalid="ignore", over="ignore"):
                for r in range(0, n, _BLOCK):  # row blocks: the destination rows stay in cache
                    for offset, width, values in parts:
                        buf[r:r + _BLOCK, offset:offset + width] = values[r:r + _BLOCK]
            if c.dtype.kind == "f":  # one pass over the input when all is well; per column only if not
                with np.errstate(over="ignore", invalid="ignore"):
                    clean = np.isfinite(buf.sum())
                for p, offset, null in nulls:
                    if null is not None or not clean:
                        finite_checks(checks, p.column, buf[:, offset:offset + p.width], null)
            out[c.name] = buf.reshape((n, *c.row_shape))
        return out, checks

    def encode(self, batch: pa.RecordBatch, compiled: CompiledInputs, rows: np.ndarray | None, *,
               journal_at: int | None = None, learn: bool = True) -> dict[str, np.ndarray]:
        """The encoder inputs of the good ``rows`` (all when None), as full-batch arrays (other rows 0).

        Vocabularies learn from the good rows only, in order (not at all with ``learn=False``: predictions);
        ``journal_at`` (the stream's good-row number of the first good row) journals their updates for
        :meth:`commit`."""
        out: dict[str, np.ndarray] = {}
        n = batch.num_rows
        for c in compiled.inputs:
            enc = c.encoder
            if enc is None:
                continue
            arrays = [batch.column(p.index) for p in c.parts]
            if rows is not None:
                take = pa.array(rows, pa.int64())
                arrays = [a.take(take) for a in arrays]
            length = c.row_shape[-1] if c.row_shape else None
            try:
                state: Any = self.states.get(c.name)
                if not learn and isinstance(enc, Vocabulary):
                    ids = enc.lookup(state, arrays)
                else:
                    ids = enc.encode(state, arrays, journal_at=journal_at, length=length)
            except EncodeProblem as p:
                raise ColumnProblem("wrong_type", p.column, f"{p.message} (input {c.name!r})") from None
            ids = _cast_ids(ids, c.dtype, c.name)
            if rows is not None:
                full = np.zeros((n, ids.shape[1]), dtype=ids.dtype)
                full[rows] = ids
                ids = full
            out[c.name] = ids.reshape((n, *c.row_shape))
        return out

    def commit(self, committed: Mapping[str, EncoderState], rows: int) -> None:
        """Advance the ``committed`` encoder states to the stream's first ``rows`` good rows (after those
        rows were trained): a checkpoint then holds exactly what the trained rows taught, however far the
        stream was read ahead."""
        for s in self.sources:
            enc = s.encoder
            commit = getattr(enc, "commit", None)
            if commit is not None and s.input in committed:
                commit(committed[s.input], self.states[s.input], rows)
            elif enc is not None and s.input in committed:
                committed[s.input].kinds = list(self.states[s.input].kinds)


# ------------------------------------------------------------------------------- the feature matrix
@dataclass(frozen=True)
class _Declared:
    """An input as a model declares it (``name``, ``dtype``, ``shape``): the feature matrix's one input."""

    name: str
    dtype: np.dtype
    shape: tuple[Any, ...]


@dataclass(frozen=True)
class FeatureColumn:
    """One column of the feature matrix: where it is in the record batch, which columns of ``X`` it fills."""

    name: str
    index: int          # index in the record batch
    width: int          # 1 for a scalar column, d for a vector column
    offset: int         # first column of X it fills
    vector: bool
    cast: bool          # needs an explicit (cast=True) conversion to float64 first
    kind: str = "scalar"  # "scalar" | "vector" | "dict" (a dictionary of numbers, decoded)

    @property
    def part(self) -> "_Part":
        return _Part(self.name, self.index, self.kind, self.width, self.cast)


@dataclass(frozen=True)
class ColumnPlan:
    """How one schema maps to ``X`` (n, n_features), ``y`` and ``sample_weight``: the plan's single-input
    case (one float input fed by the feature columns), with the label and the weight."""

    features: tuple[FeatureColumn, ...]
    label: LabelPlan
    weight_index: int | None
    weight_cast: bool
    n_features: int
    #: one vector column whose values already have the training dtype: X can be a view of Arrow memory.
    zero_copy: bool


def make_plan(schema: pa.Schema, *, features: Sequence[str], widths: Sequence[int] | None,
              label: "str | Sequence[str]", weight: str | None, task: str, dtype: np.dtype,
              cast: bool) -> ColumnPlan:
    """Check ``schema`` for the feature matrix of ``features`` (``widths``: the feature widths fixed by the
    first batch), the label and the weight; :class:`ColumnProblem` naming the column."""
    schema_names(schema)  # a name that is not valid UTF-8 makes the whole schema unreadable
    if not features:
        raise ColumnProblem("missing_column", None,
                            f"no feature columns: the batch has only the label/weight columns {schema.names}")
    dtype = np.dtype(dtype)
    for name in sorted({n for n in features if list(features).count(n) > 1}):  # names read off a schema that
        find_column(schema, name, "", dtype.name)  # has a column twice: duplicate_column, never "first wins"
    plan = InputPlan([_Declared(FEATURES, dtype, ("N", "n_features"))], {FEATURES: list(features)}, cast=cast,
                     feature_widths=None if widths is None else list(widths))
    (compiled,) = plan.compile(schema).inputs
    cols, offset = [], 0
    for p in compiled.parts:
        cols.append(FeatureColumn(p.column, p.index, p.width, offset, p.kind == "vector", p.cast, p.kind))
        offset += p.width
    lp = plan_label(schema, label, task=task, dtype=dtype, cast=cast)
    wi, weight_cast = (None, False)
    if weight is not None:
        wi, weight_cast = _scalar_float(schema, weight, "weight ", dtype.name, cast)
    zero_copy = compiled.zero_copy and len(cols) == 1 and cols[0].vector
    return ColumnPlan(tuple(cols), lp, wi, weight_cast, offset, zero_copy)


def column_values(arr: pa.Array, part: "_Part", dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A column's values (``[n]``, or ``[n, width]`` for a vector column) and its null-row mask (None: no
    nulls); null rows hold arbitrary values."""
    return _values(arr, part, dtype), _null_rows(arr, part)


def _check_against_model(s: InputSource, m: Any) -> None:
    """What the mapping alone says about an input (before any schema): a :class:`ModelError` naming the
    input when it cannot fit the model's declared element type or fixed per-row dims."""
    from streamfit.exceptions import ModelError

    dtype = np.dtype(m.dtype)
    shape = tuple(m.shape)
    dims = shape[1:] if shape else ()
    fixed = all(isinstance(d, int) and d > 0 for d in dims)
    where = f"model input {m.name!r} ({dtype}, shape {_shape_text(shape)})"
    enc = s.encoder
    if enc is not None:
        if dtype.kind not in "iuf":
            raise ModelError(f"inputs={{{m.name!r}: {enc!r}}}: the encoder gives numbers, but {where} expects "
                             f"{dtype} values")
        if isinstance(enc, (Padded, Mask)):
            last = dims[-1] if dims and isinstance(dims[-1], int) and dims[-1] > 0 else None
            if enc.length is None and last is None:
                raise ModelError(f"inputs={{{m.name!r}: {enc!r}}}: no length given and {where} has no fixed last "
                                 f"dimension; pass length=")
            if enc.length is not None and last is not None and enc.length != last:
                raise ModelError(f"inputs={{{m.name!r}: {enc!r}}}: rows of length {enc.length}, but {where} "
                                 f"expects {last}")
        elif fixed and math.prod(dims) != enc.width:
            raise ModelError(f"inputs={{{m.name!r}: {enc!r}}}: {enc.width} value(s) per row, but {where} expects "
                             f"{math.prod(dims)}")
        return
    if dtype.kind not in "iufb":
        raise ModelError(f"{where} is not numeric: streamfit feeds numeric and bool inputs only")
    if fixed and len(s.columns) > math.prod(dims):  # every column gives at least one value per row
        raise ModelError(f"inputs={{{m.name!r}: {list(s.columns)!r}}}: {len(s.columns)} columns, but {where} "
                         f"takes {math.prod(dims)} value(s) per row")


def check_inputs(model_inputs: Sequence[Any], inputs: Mapping[str, Any]) -> None:
    """Check an ``inputs=`` mapping against the model's declared inputs, before any data: a
    :class:`~streamfit.exceptions.ModelError` naming the input (a name the model lacks, more columns than a
    fixed-width input takes, an encoder's width or length that does not fit, a malformed mapping)."""
    from streamfit.exceptions import ModelError, StreamfitError

    try:
        InputPlan(model_inputs, inputs)
    except ValueError as exc:
        if isinstance(exc, StreamfitError):
            raise
        raise ModelError(str(exc)) from None


def as_record_batch(X: Any) -> pa.RecordBatch:
    """An Arrow Table (its chunks combined), RecordBatch or dict of columns as one record batch."""
    if isinstance(X, pa.RecordBatch):
        return X
    if isinstance(X, pa.Table):
        batches = X.combine_chunks().to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in X.schema], schema=X.schema)
    if isinstance(X, Mapping):
        try:
            return pa.RecordBatch.from_pydict({k: v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v)
                                               for k, v in X.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            from streamfit.exceptions import BadInputError

            raise BadInputError(f"a dict of columns must hold equally long 1-D columns: {exc}",
                                reason="wrong_type") from None
    raise TypeError(f"expected an Arrow Table/RecordBatch or a dict of columns, got {type(X).__name__}")


class ColumnInputs:
    """The column plan in memory: Arrow tables (or dicts of columns) -> ``{model input name: array}``.

    What :class:`~streamfit.Trainer` and the estimators with ``inputs=`` use for in-memory batches (the
    stream's rebatcher uses :class:`InputPlan` directly).  A schema is compiled once; a bad value raises
    :class:`~streamfit.exceptions.BadInputError` naming the column, the row and the reason.
    """

    def __init__(self, model_inputs: Sequence[Any], inputs: Mapping[str, Any], *,
                 states: Mapping[str, EncoderState] | None = None) -> None:
        # in memory nothing is cast: the caller converts its columns (the error says how), as with numpy inputs
        self.plan = InputPlan(model_inputs, inputs, states=states, offers_cast=False)
        self.names = frozenset(m.name for m in model_inputs)
        self._compiled: dict[pa.Schema, CompiledInputs] = {}

    def takes(self, X: Any) -> bool:
        """Whether ``X`` is columns (an Arrow table, or a dict not keyed by exactly the model's input names)."""
        if isinstance(X, (pa.Table, pa.RecordBatch)):
            return True
        return isinstance(X, Mapping) and set(X) != self.names

    def arrays(self, X: Any, *, learn: bool = True) -> dict[str, np.ndarray]:
        """The model inputs of the rows of ``X``; ``learn=False`` encodes without teaching a vocabulary."""
        from streamfit.exceptions import BadInputError

        batch = as_record_batch(X)
        plan = self.plan
        try:
            compiled = self._compiled.get(batch.schema)
            if compiled is None:
                compiled = self._compiled.setdefault(batch.schema, plan.compile(batch.schema))
            arrays, checks = plan.extract(batch, compiled)
            if checks:
                reason, column, mask, values = checks[0]
                row = int(np.argmax(mask))
                raise BadInputError(f"column '{column}' has a bad value at row {row} ({reason}: {values[row]!r})",
                                    reason=reason, column=column)
            arrays.update(plan.encode(batch, compiled, None, learn=learn))
        except ColumnProblem as p:
            raise BadInputError(p.message, reason=p.reason, column=p.column) from None
        return arrays


def _column_info(t: pa.DataType, row_shapes: Mapping[str, Any]) -> dict[str, Any]:
    from streamfit.features._values import kind_of

    dims: list[int] = []
    if isinstance(t, pa.FixedShapeTensorType):
        dims, t = list(t.shape), t.value_type
    elif pa.types.is_fixed_size_list(t):
        dims, t = [t.list_size], t.value_type
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        dims, t = [-1], t.value_type  # padded: the length is the input's
    if pa.types.is_dictionary(t):
        t = t.value_type
    if kind_of(t) == "string":
        return {"dtype": "str", "dims": dims}
    try:
        return {"dtype": np.dtype(t.to_pandas_dtype()).name, "dims": dims}
    except (NotImplementedError, TypeError):
        return {"dtype": "float64", "dims": dims}


def _shape_text(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("N" if i == 0 and not isinstance(d, int) else str(d) if isinstance(d, int) else "?"
                           for i, d in enumerate(shape)) + "]"


def _hint(dtype: np.dtype, col_kind: str, column: str, width: int | None, offers_cast: bool) -> str:
    """What the user can do about column ``column`` of kind ``col_kind`` refused by an input of ``dtype``
    (``width``: of a vector column)."""
    if dtype.kind == "f" and col_kind in ("int", "bool", "decimal"):
        if offers_cast:
            return f" (pass cast=True to convert {col_kind} columns)"
        target, arrow = dtype.name, f"pyarrow.{dtype.name}()"
        if width is not None:
            target, arrow = f"fixed_size_list<{dtype.name}>[{width}]", f"pyarrow.list_({arrow}, {width})"
        return (f" (in memory no column is converted: cast it to {target} first, e.g. with "
                f"pyarrow.compute.cast(table['{column}'], {arrow}); train_stream(..., cast=True) converts a "
                "stream's columns)")
    if col_kind == "other":
        return " (encode strings with streamfit.features.Hashed or Vocabulary)"
    return ""


def _value_dtype(t: pa.DataType) -> np.dtype | None:
    storage = t.storage_type if isinstance(t, pa.BaseExtensionType) else t
    if pa.types.is_fixed_size_list(storage):
        storage = storage.value_type
    try:
        return np.dtype(storage.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        return None


def _null_rows(arr: pa.Array, p: _Part) -> np.ndarray | None:
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


def _values(arr: pa.Array, p: _Part, dtype: np.dtype | None) -> np.ndarray:
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


def _range_checks(checks: list, name: str, values: np.ndarray, dtype: np.dtype, null: np.ndarray | None) -> None:
    if values.dtype.kind not in "iu" or np.can_cast(values.dtype, dtype, "safe") or values.size == 0:
        return
    info = np.iinfo(dtype)
    flat = values.reshape(len(values), -1)
    bad = ((flat < info.min) | (flat > info.max)).any(axis=1)
    if null is not None:
        bad &= ~null
    if bad.any():
        checks.append(("out_of_range", name, bad, flat[:, 0]))


def _cast_ids(ids: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    if ids.dtype == dtype:
        return ids
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if ids.size and (ids.min() < info.min or ids.max() > info.max):
            raise ColumnProblem("out_of_range", None, f"ids up to {int(ids.max())} do not fit input {name!r} "
                                                      f"({dtype})")
    return ids.astype(dtype)
