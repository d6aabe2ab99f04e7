"""The column mapping: which columns (or encoder) feed each model input, checked per schema, and a record
batch's values per input.

``inputs`` maps each model input name to a column name, a list of column names or an encoder
(:mod:`streamfit.features`); an input it does not name reads the column of its name.  ``features=`` (one
``X``) is the same plan for one float input ``[n, n_features]`` fed by the feature columns
(:class:`~streamfit._columns.plan.ColumnPlan`).  Per schema, :meth:`ColumnMapping.compile` checks every column against the input it feeds
(element kind, width, rank) once; :meth:`ColumnMapping.extract` then turns a record batch into
``{input name: array}`` with each input's declared dtype and per-row shape:

* one scalar column -> ``[n]`` (or ``[n, 1]``); several scalar columns -> ``[n, k]`` reshaped to the
  declared shape (``k`` = product of the per-row dims); into a ``[n, features]`` input, scalar and vector
  columns are concatenated (as ``features=`` does);
* a ``FixedSizeList`` or ``fixed_shape_tensor`` column -> ``[n, d]`` reshaped to the declared shape
  (a CNN's ``[n, 1, 8, 8]``), zero-copy when the values already have the input's dtype and no nulls;
* a dictionary column of numbers is decoded (each dictionary value converted once);
* an encoder's ids (int64) are cast to the input's integer dtype.

Type policy (see :mod:`streamfit._columns`): float inputs take float columns
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

from streamfit._columns.schema import ColumnProblem, canonical_json, find_column, kind, schema_names, type_name
from streamfit._columns.values import (BLOCK, Check, Part, cast_ids, finite_checks, null_rows, range_checks, value_dtype,
                                       values_of)
from streamfit.features._encoders import EncodeProblem, Encoder, EncoderState, Mask, Padded, Vocabulary

__all__ = ["InputSource", "ColumnMapping", "CompiledInput", "Pieces", "normalize_inputs", "check_inputs", "assemble"]

#: one input's columns from a record batch, where each goes in the flattened row: (offset, width, values
#: ``[n]`` or ``[n, width]``); copied into the input's array by the consumer (the rebatcher's ring, or
#: :func:`assemble`) in one pass, without an intermediate stack
Pieces = tuple[tuple[int, int, np.ndarray], ...]


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
class CompiledInput:
    """One model input for one schema: its dtype, per-row shape, and the columns (or encoder) that fill it."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    parts: tuple[Part, ...]
    encoder: Encoder | None
    #: one column whose values already have the input's dtype: the input can be a view of Arrow memory
    zero_copy: bool

    @property
    def width(self) -> int:
        return math.prod(self.row_shape)


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


class ColumnMapping:
    """Which columns (or encoder) feed every model input, and their values per record batch; see the module
    docstring.

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
        (:class:`~streamfit._columns.layout.ColumnLayout`, checkpoints)."""
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
    def compile(self, schema: pa.Schema) -> tuple[CompiledInput, ...]:
        """Check ``schema`` against every input; :class:`ColumnProblem` naming the column and the input."""
        schema_names(schema)
        compiled = tuple(self._compile_one(schema, s, m) for s, m in zip(self.sources, self.model_inputs))
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

    def _compile_one(self, schema: pa.Schema, s: InputSource, m: Any) -> CompiledInput:
        if s.encoder is not None:
            return self._compile_encoder(schema, s, s.encoder, m)
        return self._compile_columns(schema, s, m)

    def _compile_encoder(self, schema: pa.Schema, s: InputSource, enc: Encoder, m: Any) -> CompiledInput:
        """An encoder's input: its columns found, the ids' width or padded length against the model's."""
        dtype = np.dtype(m.dtype)
        indices = [find_column(schema, c, "", f"a column for {type(enc).__name__}") for c in s.columns]
        if dtype.kind not in "iuf":
            raise ColumnProblem("wrong_type", s.columns[0], f"{type(enc).__name__} gives integer ids but "
                                                            f"input {m.name!r} is {dtype}")
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
        return CompiledInput(m.name, dtype, self.row_shapes[m.name],
                             tuple(Part(c, i, "encoder", 1, False) for c, i in zip(s.columns, indices)), enc, False)

    def _compile_columns(self, schema: pa.Schema, s: InputSource, m: Any) -> CompiledInput:
        """An input read from columns: each column's kind and width accepted by the input's element type."""
        dtype = np.dtype(m.dtype)
        where = "" if self._features else f" (input {m.name!r}, {dtype}, shape {_shape_text(m.shape)})"
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
                        raise ColumnProblem("wrong_type", c, f"column '{c}' is {type_name(t)}, expected {expected}{hint}")
                    if fixed is not None and width != fixed:
                        raise ColumnProblem("wrong_type", c, f"column '{c}' is {type_name(t)}, expected {expected}")
                elif not ok:
                    raise ColumnProblem("wrong_type", c, f"column '{c}' is {type_name(t)}, expected values of "
                                                         f"{dtype}{where}"
                                                         + self._hint(dtype, vkind, c, width))
                parts.append(Part(c, i, "vector", width, needs_cast))
                continue
            if pa.types.is_dictionary(t):
                vkind = kind(t.value_type)
                ok, needs_cast = _accepts(dtype.kind, vkind, self.cast)
                if not ok:
                    raise ColumnProblem("wrong_type", c, f"column '{c}' is {type_name(t)}, expected {dtype}{where}"
                                                         + self._hint(dtype, vkind, c))
                parts.append(Part(c, i, "dict", 1, needs_cast))
            elif pa.types.is_list(t) or pa.types.is_large_list(t):
                raise ColumnProblem("wrong_type", c, f"column '{c}' is {t} (variable length), expected {dtype}{where}: "
                                                     f"use streamfit.features.Padded('{c}', pad=...) for this input")
            else:
                k = kind(t)
                ok, needs_cast = _accepts(dtype.kind, k, self.cast)
                if not ok:
                    raise ColumnProblem("wrong_type", c, f"column '{c}' is {type_name(t)}, expected {dtype}{where}"
                                                         + self._hint(dtype, k, c))
                parts.append(Part(c, i, "scalar", 1, needs_cast))
            if fixed is not None and fixed != 1:
                raise ColumnProblem("wrong_type", c, f"column '{c}' is {type_name(t)}, expected "
                                                     f"fixed_size_list<{dtype}>[{fixed}]")
        if len(parts) > 1 and any(p.kind == "vector" for p in parts) and len(self._declared_row_shape(m)) != 1:
            raise ColumnProblem("wrong_type", None, f"input {m.name!r} mixes vector and scalar columns "
                                                    f"{list(s.columns)}; map it to one vector column or to scalar columns "
                                                    "(columns are concatenated only into a [N, features] input)")
        total = sum(p.width for p in parts)
        shape = self._fix_shape(m, total)
        zero_copy = (len(parts) == 1 and not parts[0].cast and parts[0].kind in ("vector", "scalar")
                     and value_dtype(schema.field(parts[0].index).type) == dtype
                     and (not self._features or parts[0].kind == "vector"))  # X [n, 1] of a scalar: copied
        return CompiledInput(m.name, dtype, shape, tuple(parts), None, zero_copy)

    # -- per batch ----------------------------------------------------------------------------------
    def extract(self, batch: pa.RecordBatch, compiled: Sequence[CompiledInput],
                checks: list[Check]) -> dict[str, "np.ndarray | Pieces"]:
        """The values of the column inputs: an array ``[n, *row_shape]`` (a view of Arrow memory when the
        input is zero-copy), else the :data:`Pieces` of its columns; the row checks that fail go to ``checks``.

        Changes no state (safe in a worker thread); encoder inputs are filled by :meth:`encode`.  Float
        values are checked as the columns hold them for the feature matrix, as the input holds them (after a
        narrowing conversion) for named inputs."""
        out: dict[str, np.ndarray | Pieces] = {}
        n = batch.num_rows
        for c in compiled:
            if c.encoder is not None:
                continue
            if c.zero_copy and not batch.column(c.parts[0].index).null_count:
                values = values_of(batch.column(c.parts[0].index), c.parts[0], c.dtype)
                values = values.reshape((n, *c.row_shape))
                if c.dtype.kind == "f":
                    finite_checks(checks, c.parts[0].column, values.reshape(n, -1), None)
                out[c.name] = values
                continue
            pieces = []
            offset = 0
            for p in c.parts:
                arr = batch.column(p.index)
                null = null_rows(arr, p)
                values = values_of(arr, p, None).reshape(n, p.width)
                if c.dtype.kind != "f":
                    if null is not None:
                        checks.append(("null", p.column, null, np.zeros(n)))
                    range_checks(checks, p.column, values, c.dtype, null)
                else:
                    if not self._features and values.dtype != c.dtype:  # checked as the input holds them
                        with np.errstate(over="ignore", invalid="ignore"):
                            values = values.astype(c.dtype)
                    finite_checks(checks, p.column, values, null)
                pieces.append((offset, p.width, values))
                offset += p.width
            out[c.name] = tuple(pieces)
        return out

    def encode(self, batch: pa.RecordBatch, compiled: Sequence[CompiledInput], rows: np.ndarray | None, *,
               journal_at: int | None = None, learn: bool = True) -> dict[str, np.ndarray]:
        """The encoder inputs of the good ``rows`` (all when None), as full-batch arrays (other rows 0).

        Vocabularies learn from the good rows only, in order (not at all with ``learn=False``: predictions);
        ``journal_at`` (the stream's good-row number of the first good row) journals their updates for
        :meth:`commit`."""
        out: dict[str, np.ndarray] = {}
        n = batch.num_rows
        for c in compiled:
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
            ids = cast_ids(ids, c.dtype, c.name)
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
        ColumnMapping(model_inputs, inputs)
    except ValueError as exc:
        if isinstance(exc, StreamfitError):
            raise
        raise ModelError(str(exc)) from None


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


def assemble(n: int, c: CompiledInput, values: "np.ndarray | Pieces") -> np.ndarray:
    """One input's array ``[n, *row_shape]`` of what :meth:`ColumnMapping.extract` gave for it."""
    if isinstance(values, np.ndarray):
        return values
    buf = np.empty((n, c.width), dtype=c.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(0, n, BLOCK):  # row blocks: the destination rows stay in cache
            for offset, width, part in values:
                buf[r:r + BLOCK, offset:offset + width] = part[r:r + BLOCK]
    return buf.reshape((n, *c.row_shape))
