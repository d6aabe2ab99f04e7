"""The reader of the hashed linear models' one-row path (``categorical=``): one event per call.

A per-event stream calls ``partial_fit``/``predict`` with a one-row Arrow table, record batch or dict of
columns.  The general path builds a record batch, compiles and runs the column plan (numpy hashing of a
``(1, fields)`` block, per-column checks) and the estimator's batch checks: about a millisecond per row,
where the step itself is two short session runs.  :class:`HashedRows` is what a fitted hashed model keeps
for such rows: per schema a :class:`RowLayout` (where the columns are, made once), per column a cache of
the ids of values seen, the ``ids``/``x`` arrays the trainer takes; :class:`~streamfit.models._rows.RowPath`
composes it with the model's target (a label or a scaled target) as it does the dense reader.  A row is read with a few Arrow calls
(all integer columns of one type as one tensor), hashed in Python (:func:`~streamfit.features._murmur.murmur3_int`
and the general path's own string hash: the same ids bit for bit), and handed to the trainer.  Anything
else -- a null, a non-finite or non-float dense value, a column kind the encoder has not seen, several
rows -- returns None and takes the general path, which validates it and names the column (the same
errors as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from streamfit._columns.memory import ModelInputs, holds_inputs
from streamfit.features._encoders import NULL_ID, _hash_str
from streamfit.features._murmur import murmur3_int
from streamfit.features._values import kind_of
from streamfit.models._fm_graph import DENSE, IDS
from streamfit.models._rows import PASSIVE_AGGRESSIVE

__all__ = ["HashedRow", "RowLayout"]

_F32 = np.dtype(np.float32)
_F32_MAX = float(np.finfo(np.float32).max)
_EXACT = float(2 ** 53)  # integers below this in magnitude are exact in float64
#: ids kept per column (a dict of value -> id); cleared when full (a click stream's values are Zipf-like:
#: the frequent ones come back at once)
_CACHE = 1 << 14
_INT64 = (-(1 << 63), 1 << 63)
_FLOATS = (pa.float32(), pa.float64())  # dense column types the column plan reads into the float32 input


@dataclass(frozen=True)
class RowLayout:
    """Where the model's columns are in one schema, and how a row of it is read (made once per schema)."""

    #: the categorical columns' indices in the batch, in the model's order
    categorical: list[int]
    #: the dense columns' indices
    dense: list[int]
    #: all categorical columns plain integers of one type: read as one tensor (else one scalar each)
    categorical_tensor: bool
    #: all dense columns of one float type: read as one tensor
    dense_tensor: bool
    #: every column of the schema an integer or float one: the whole row read as one float64 tensor (exact
    #: for the floats, and for the integers below 2**53 in magnitude, which is checked)
    whole: bool


def layout_of(schema: pa.Schema, categorical: tuple[str, ...], dense: tuple[str, ...],
              kinds: tuple[Any, ...]) -> RowLayout | None:
    """The layout of ``schema``, or None when its rows must take the general path (a column missing or
    named twice, a kind the encoder has not seen, a dense column that is not float)."""
    names = schema.names
    index: dict[str, int] = {}
    for c in (*categorical, *dense):
        if names.count(c) != 1:
            return None
        index[c] = names.index(c)
    cat_types = [schema.field(index[c]).type for c in categorical]
    if tuple(kind_of(t) for t in cat_types) != kinds:
        return None
    dense_types = [schema.field(index[c]).type for c in dense]
    if not all(t in _FLOATS for t in dense_types):
        return None
    plain_ints = all(pa.types.is_integer(t) for t in cat_types) and len(set(map(str, cat_types))) == 1
    whole = all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in schema.types)
    return RowLayout([index[c] for c in categorical], [index[c] for c in dense],
                     bool(categorical) and plain_ints, len(set(map(str, dense_types))) == 1, whole)


class HashedRow:
    """A one-row table, record batch or dict of columns as the hashed model's inputs, made once (and again
    when its encoder state or hashing parameters change: :meth:`current`)."""

    def __init__(self, est: Any) -> None:
        from streamfit.features._estimator import encoder_states

        self.categorical = tuple(est.categorical)
        self.dense = tuple(est.dense)
        self.params = _params(est)
        self.named = frozenset(self.categorical + self.dense)
        encoder = est._hashed_inputs()[IDS]
        self.state = encoder_states(est)[IDS]
        self.kinds = tuple(self.state.kinds)
        self.seeds = tuple(encoder.column_seed(k) for k in range(len(self.categorical)))
        self.modulus = encoder.buckets - 1
        self.cache: list[dict[Any, int]] = [{} for _ in self.categorical]
        self.ids = np.zeros((1, len(self.categorical)), np.int64)
        self.x = np.zeros((1, len(self.dense)), _F32)
        #: the model inputs as the trainer takes them (the arrays above, refilled per row)
        self.arrays: dict[str, np.ndarray] = {IDS: self.ids}
        if self.dense:
            self.arrays[DENSE] = self.x
        self._layouts: list[tuple[pa.Schema, RowLayout | None]] = []
        self._last: Any = None  # the Arrow row whose inputs are in ids/x

    @classmethod
    def offered(cls, X: Any) -> bool:
        """Whether ``X`` may be what this path takes (it reads a one-row Table, RecordBatch or dict of columns,
        and says per call whether it takes it)."""
        return True

    @classmethod
    def fits(cls, est: Any) -> bool:
        """Whether ``est`` can use a one-row path: a fitted hashed model whose encoder has seen every column."""
        from streamfit.features._estimator import encoder_states

        if est.__dict__.get("trainer_") is None or not est._hashed or not _plain_params(est):
            return False
        state = encoder_states(est).get(IDS)
        return state is not None and None not in state.kinds

    def current(self, est: Any) -> bool:
        """Whether this reader still fits ``est`` (hashing parameters and column kinds unchanged)."""
        return _plain_params(est) and _params(est) == self.params and tuple(self.state.kinds) == self.kinds

    # -- reading one row ------------------------------------------------------------------------------
    def _layout(self, schema: pa.Schema) -> RowLayout | None:
        for known, layout in self._layouts:
            if known is schema or known.equals(schema):
                return layout
        layout = layout_of(schema, self.categorical, self.dense, self.kinds)
        if len(self._layouts) >= 8:
            self._layouts.pop(0)
        self._layouts.append((schema, layout))
        return layout

    def read(self, X: Any) -> dict[str, np.ndarray] | None:
        """The model inputs of the one row ``X``, or None when it takes the general path."""
        kind = type(X)
        if X is self._last:  # the row just read (predict, then partial_fit of one event): Arrow data is immutable
            return self.arrays
        self._last = None
        if kind is pa.RecordBatch:
            arrays = self._batch(X)
        elif kind is pa.Table:
            if X.num_rows != 1:
                return None
            batches = X.to_batches()
            arrays = self._batch(batches[0]) if len(batches) == 1 else None
        else:
            return self._columns(X) if kind is dict or kind is ModelInputs else None
        if arrays is not None:
            self._last = X  # held: its id cannot be reused while it is compared
        return arrays

    def _batch(self, batch: pa.RecordBatch) -> dict[str, np.ndarray] | None:
        if batch.num_rows != 1:
            return None
        layout = self._layout(batch.schema)
        if layout is None:
            return None
        if layout.whole:
            try:
                row = batch.to_tensor().to_numpy().tolist()[0]
            except pa.ArrowException:  # a null: the column by column reads below decide
                row = None
            if row is not None:
                values = [row[i] for i in layout.categorical]
                if max(map(abs, values)) < _EXACT:  # every integer exact in float64 (else: read as integers)
                    if self.dense and not self._dense([row[i] for i in layout.dense]):
                        return None
                    return self._hashed([int(v) for v in values])
        try:
            if layout.categorical_tensor:
                values = batch.select(layout.categorical).to_tensor().to_numpy().tolist()[0]
            else:
                values = [batch.column(i)[0].as_py() for i in layout.categorical]
            if self.dense:
                if layout.dense_tensor:
                    dense = batch.select(layout.dense).to_tensor().to_numpy().tolist()[0]
                else:
                    dense = [batch.column(i)[0].as_py() for i in layout.dense]
                    if None in dense:
                        return None
                if not self._dense(dense):
                    return None
        except pa.ArrowException:  # a null in a tensor's columns: the general path decides
            return None
        return self._hashed(values)

    def _dense(self, values: list[float]) -> bool:
        """Write the dense values into the float32 input if they are finite there (else: the general path)."""
        if not math.isfinite(sum(values)) or max(map(abs, values)) > _F32_MAX:
            return False
        self.x[0] = values
        return True

    def _columns(self, X: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """A dict of columns: one-element lists or arrays of the types the general path's ``pa.array``
        gives the kinds the encoder saw (else: the general path)."""
        if holds_inputs(X, self.arrays):  # the model inputs themselves (the stream's column plan filled them)
            for a in X.values():
                if type(a) is not np.ndarray or a.ndim < 1 or a.shape[0] != 1:
                    return None
            return X  # type: ignore[return-value]
        if len(X) != len(self.categorical) + len(self.dense):
            for key, v in X.items():  # other columns (a label...) must make a one-row table as well
                if key not in self.named and _scalar(v, None) is _NO:
                    return None
        values = []
        for c, kind in zip(self.categorical, self.kinds):
            v = X.get(c, _NO)
            if v is _NO:
                return None
            value = _scalar(v, kind)
            if value is _NO or value is None:
                return None
            values.append(value)
        if self.dense:
            dense = []
            for c in self.dense:
                value = _scalar(X.get(c, _NO), "float")
                if value is _NO or value is None:
                    return None
                dense.append(value)
            if not self._dense(dense):
                return None
        return self._hashed(values)

    def _hashed(self, values: list[Any]) -> dict[str, np.ndarray]:
        """The ids of a row's categorical values (0 for a null), as the encoder computes them."""
        ids = []
        for k, v in enumerate(values):
            if v is None:
                ids.append(NULL_ID)
                continue
            cache = self.cache[k]
            i = cache.get(v)
            if i is None:
                h = _hash_str(v, self.seeds[k]) if type(v) is str else murmur3_int(v, self.seeds[k])
                i = 1 + h % self.modulus
                if len(cache) >= _CACHE:
                    cache.clear()
                cache[v] = i
            ids.append(i)
        self.ids[0] = ids
        return self.arrays

    def learn(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inputs the trainer steps on (no statistics: dense columns are used as given)."""
        return arrays

    def inputs(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return arrays


_NO = object()  # not a value the row path takes


def _scalar(v: Any, kind: str | None) -> Any:
    """The one value of a dict's column ``v`` if ``pa.array(v)`` makes a one-row column of ``kind``
    (``"int"``, ``"bool"``, ``"string"``, ``"float"``; None: any plain one), else ``_NO``."""
    t = type(v)
    if t is list:
        if len(v) != 1:
            return _NO
        x = v[0]
        tx = type(x)
        if tx is int:
            ok = kind in ("int", None) and _INT64[0] <= x < _INT64[1]
        elif tx is float:
            ok = kind in ("float", None)
        elif tx is str:
            ok = kind in ("string", None)
        elif tx is bool:
            ok = kind in ("bool", None)
        else:
            ok = False
        return x if ok else _NO
    if t is np.ndarray:
        if v.shape != (1,):
            return _NO
        k = v.dtype.kind
        ok = {"int": k in "iu", "bool": k == "b", "string": k == "U",
              "float": v.dtype in (np.float32, np.float64), None: k in "iufbU"}[kind]
        return v.item() if ok else _NO
    return _NO


def _params(est: Any) -> tuple[Any, ...]:
    return (tuple(est.categorical), tuple(est.dense), est.buckets, est.hash_seed)


def _plain_params(est: Any) -> bool:
    """No parameter that the general path refuses or treats per row (``inputs=``, passive-aggressive)."""
    d = est.__dict__
    return d.get("_inputs_param") is None and d.get("learning_rate") not in PASSIVE_AGGRESSIVE
