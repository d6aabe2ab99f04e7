"""Column encoders: categorical columns -> integer ids (:class:`Hashed`, :class:`Vocabulary`) and
variable-length list columns -> fixed-length rows (:class:`Padded`, :class:`Lengths`, :class:`Mask`).

An encoder is a parameter object (what to do; cloned like any estimator parameter).  What it learns
lives in an :class:`EncoderState` (the column kinds seen, a vocabulary), saved in checkpoints as plain
arrays.  Id 0 is reserved for nulls by both categorical encoders; :class:`Vocabulary` reserves 1 for
values it does not hold (unseen, below ``min_count``, or the vocabulary is full).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from streamfit.features._murmur import murmur3, murmur3_arrow, murmur3_bytes, murmur3_concat, murmur3_int64
from streamfit.features._values import Categorical, categorical, kind_of

__all__ = ["Encoder", "EncoderState", "Hashed", "Vocabulary", "Padded", "Lengths", "Mask", "NULL_ID", "OOV_ID"]

NULL_ID = 0
OOV_ID = 1


class EncodeProblem(Exception):
    """A column cannot be encoded as asked (its type); the column plan turns it into bad input."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column = column
        self.message = message


def _columns(columns: "str | Sequence[str]", owner: str) -> tuple[str, ...]:
    cols = (columns,) if isinstance(columns, str) else tuple(columns)
    if not cols or not all(isinstance(c, str) and c for c in cols):
        raise ValueError(f"{owner}: columns must be a column name or a non-empty list of names, got {columns!r}")
    if len(set(cols)) != len(cols):
        raise ValueError(f"{owner}: columns {list(cols)} name a column twice")
    return cols


class EncoderState:
    """What an encoder learned: the kind of each column (fixed by the first batch: an int column that
    becomes a string column would change every id) and, for a vocabulary, its table."""

    def __init__(self, n_columns: int) -> None:
        self.kinds: list[str | None] = [None] * n_columns

    def check_kind(self, k: int, column: str, kind: str) -> None:
        seen = self.kinds[k]
        if seen is None:
            self.kinds[k] = kind
        elif seen != kind:
            raise EncodeProblem(column, f"column '{column}' holds {kind} values, but it held {seen} values "
                                        f"when the encoder first saw it (ids would change)")

    def to_dict(self) -> dict[str, Any]:
        return {"kinds": [k or "" for k in self.kinds]}

    def load_dict(self, state: Mapping[str, Any]) -> None:
        kinds = [str(k) or None for k in state["kinds"]]
        if len(kinds) != len(self.kinds):
            raise ValueError(f"encoder state has {len(kinds)} columns, expected {len(self.kinds)}")
        self.kinds = kinds

    def copy(self) -> "EncoderState":
        new = type(self).__new__(type(self))
        new.__dict__.update({k: (v.copy() if isinstance(v, (list, dict)) else v) for k, v in self.__dict__.items()})
        return new


class Encoder:
    """Base of the column encoders: ``columns`` in, ``width`` values per row out."""

    columns: tuple[str, ...]

    @property
    def width(self) -> int:
        return len(self.columns)

    def new_state(self) -> EncoderState:
        return EncoderState(len(self.columns))

    def encode(self, state: EncoderState, arrays: Sequence[pa.Array], *, journal_at: int | None = None,
               length: int | None = None) -> np.ndarray:
        """``(n, width)`` int64 ids of the rows of ``arrays`` (one per column).

        Parameters
        ----------
        state
            The encoder's state (:meth:`new_state`, or the one a trainer keeps).
        arrays
            One Arrow array per column of ``columns``, of the same rows.
        journal_at
            The stream's good-row number of the first row, for an encoder whose state journals its updates; None:
            no journal.
        length
            The width a list encoder pads to when it has no ``length`` of its own (the model input's last dimension).
        """
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted((k, repr(v)) for k, v in self.__dict__.items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({args})"

    def _categoricals(self, state: EncoderState, arrays: Sequence[pa.Array]) -> list[Categorical]:
        out = []
        for k, (name, arr) in enumerate(zip(self.columns, arrays)):
            kind = kind_of(arr.type)
            if kind is None:
                raise EncodeProblem(name, f"column '{name}' is {arr.type}, expected string, large_string, "
                                          f"dictionary, integer or bool values for {type(self).__name__}")
            state.check_kind(k, name, kind)
            out.append(categorical(arr))
        return out


class Hashed(Encoder):
    """Ids by a stable hash: the same id for the same value in every process, restart and machine.

    ``id = 1 + murmur3(value, seed=murmur3(column name, seed)) % (buckets - 1)``, 0 for nulls, where
    murmur3 is MurmurHash3 x86 32-bit of the UTF-8 bytes of a string or the 8 little-endian bytes of an
    integer (integers widened to int64, bool to 0/1), as onnxruntime's ``com.microsoft.MurmurHash3``
    computes it: the exported model hashes raw columns in its graph with that same kernel; training hashes
    in numpy (:mod:`streamfit.features._murmur`), bit-identical.  Each column hashes with its own seed, so
    equal values in two columns get unrelated ids.  A dictionary column hashes each dictionary value once
    per batch.

    Parameters
    ----------
    columns
        A column name, or several: each hashes with its own seed into the same table of ``buckets`` ids.
    buckets
        Ids in the table (>= 2; id 0 is for nulls, so values take ``1 .. buckets - 1``).
    seed
        The base seed of the columns' hash seeds (0 <= seed < 2**32).

    Examples
    --------
    >>> import pyarrow as pa
    >>> enc = Hashed("city", buckets=1000)
    >>> enc.encode(enc.new_state(), [pa.array(["paris", None, "paris", "oslo"])]).ravel().tolist()
    [596, 0, 596, 808]
    """

    def __init__(self, columns: "str | Sequence[str]", buckets: int, seed: int = 0) -> None:
        self.columns = _columns(columns, "Hashed")
        if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer)) or buckets < 2:
            raise ValueError(f"Hashed: buckets must be an int >= 2 (id 0 is for nulls), got {buckets!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 32:
            raise ValueError(f"Hashed: seed must be an int in [0, 2**32), got {seed!r}")
        self.buckets = int(buckets)
        self.seed = int(seed)

    def column_seed(self, k: int) -> int:
        """The hash seed of column ``k`` (from its name and :attr:`seed`).

        Parameters
        ----------
        k
            The column's index in ``columns``.
        """
        return _column_seed(self.columns[k], self.seed)

    def ids_of(self, values: np.ndarray, k: int) -> np.ndarray:
        """int64 ids of non-null values (str or integers) of column ``k``.

        Parameters
        ----------
        values
            The non-null values of the column (str or integers).
        k
            The column's index in ``columns`` (its seed).
        """
        return 1 + murmur3(values, self.column_seed(k)).astype(np.int64) % (self.buckets - 1)

    def encode(self, state: EncoderState, arrays: Sequence[pa.Array], *, journal_at: int | None = None,
               length: int | None = None) -> np.ndarray:
        """``(n, columns)`` ids.  Integer and bool columns hash as one numpy block (:func:`murmur3_int64`),
        string columns as another (:func:`murmur3_strings`, over the Arrow offsets and bytes; a few values in
        Python, cached per value), a dictionary column's values once; all bit-identical to the kernel, and
        no string reaches onnxruntime (whose Python binding would keep every one of them alive).

        Parameters
        ----------
        state
            The encoder's state (:meth:`new_state`, or the one a trainer keeps).
        arrays
            One Arrow array per column of ``columns``, of the same rows.
        journal_at
            The stream's good-row number of the first row, for an encoder whose state journals its updates; None:
            no journal.
        length
            The width a list encoder pads to when it has no ``length`` of its own (the model input's last dimension).
        """
        n = len(arrays[0]) if len(arrays) else 0
        out = np.empty((n, len(arrays)), dtype=np.int64)
        block: list[int] = []  # plain integer/bool columns, hashed together
        values: list[np.ndarray] = []
        strings: list[int] = []  # plain string columns, hashed together
        texts: list[pa.Array] = []
        kinds = state.kinds
        m = self.buckets - 1
        for k, arr in enumerate(arrays):
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            kind, dictionary = _route(arr.type)
            if kind is None:
                name = self.columns[k]
                raise EncodeProblem(name, f"column '{name}' is {arr.type}, expected string, large_string, "
                                          f"dictionary, integer or bool values for Hashed")
            if kinds[k] != kind:
                state.check_kind(k, self.columns[k], kind)
            if dictionary:
                out[:, k] = self._dictionary_ids(arr, kind, k)
            elif kind != "string":
                block.append(k)
                values.append(_ints(arr))
            else:
                strings.append(k)
                texts.append(arr)
        if strings and n * len(strings) <= _SMALL:
            for k, arr in zip(strings, texts):
                seed = self.column_seed(k)
                out[:, k] = [0 if v is None else 1 + _hash_str(v, seed) % m for v in arr.to_pylist()]
        elif strings:
            ids = (1 + murmur3_concat(texts, [self.column_seed(k) for k in strings]).astype(np.int64) % m) \
                .reshape(len(strings), n)
            for j, arr in enumerate(texts):
                if arr.null_count:
                    ids[j, _nulls(arr)] = NULL_ID
            if len(strings) == len(arrays):
                return ids.T.copy()
            out[:, strings] = ids.T
        if block:
            stacked = np.stack(values, axis=1) if n else np.zeros((0, len(block)), np.int64)
            hashed = 1 + murmur3_int64(stacked, _column_seeds(self.columns, self.seed, tuple(block))) \
                .astype(np.int64) % m
            for j, k in enumerate(block):  # nulls
                if arrays[k].null_count:
                    hashed[:, j] = np.where(_nulls(arrays[k]), NULL_ID, hashed[:, j])
            if len(block) == len(arrays):
                return hashed
            out[:, block] = hashed
        return out

    def _dictionary_ids(self, arr: pa.DictionaryArray, kind: str, k: int) -> np.ndarray:
        """Ids of a dictionary column: its dictionary's values hashed once, looked up by the indices."""
        values, seed = arr.dictionary, self.column_seed(k)
        hashed = murmur3_arrow(values, seed) if kind == "string" else murmur3_int64(_ints(values), seed)
        table = 1 + hashed.astype(np.int64) % (self.buckets - 1)
        if values.null_count:  # a null stored in the dictionary itself
            table[_nulls(values)] = NULL_ID
        indices = arr.indices
        if not len(table):
            return np.zeros(len(arr), dtype=np.int64)
        ids = table[indices.fill_null(0).to_numpy(zero_copy_only=False) if indices.null_count
                    else indices.to_numpy(zero_copy_only=False)]
        if indices.null_count:
            ids[_nulls(indices)] = NULL_ID
        return ids


#: at most this many string values in a batch (rows x string columns) hash in Python, each cached: below it,
#: numpy's cost per call is more than the hash
_SMALL = 32


@lru_cache(maxsize=256)
def _route(t: pa.DataType) -> tuple[str | None, bool]:
    """(kind, is a dictionary) of a column type, computed once per type."""
    return kind_of(t), pa.types.is_dictionary(t)


def _ints(arr: pa.Array) -> np.ndarray:
    """An integer or bool column's values as int64 (nulls as 0; uint64 wraps, as the kernel's int64 does)."""
    if arr.null_count:
        arr = arr.fill_null(0 if not pa.types.is_boolean(arr.type) else False)
    values = arr.to_numpy(zero_copy_only=False)
    return values.astype(np.int64, copy=False)


def _nulls(arr: "pa.Array | pa.ChunkedArray") -> np.ndarray:
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


@lru_cache(maxsize=1 << 16)
def _hash_str(value: str, seed: int) -> int:
    return murmur3_bytes(value.encode("utf-8"), seed)


@lru_cache(maxsize=256)
def _column_seeds(columns: tuple[str, ...], seed: int, block: tuple[int, ...]) -> np.ndarray:
    return np.array([_column_seed(columns[k], seed) for k in block], dtype=np.uint32)


@lru_cache(maxsize=4096)
def _column_seed(column: str, seed: int) -> int:
    """The hash seed of a column (computed once: an encode of one row otherwise pays one hash run per column)."""
    return murmur3_bytes(column.encode("utf-8"), seed)


class VocabularyState(EncoderState):
    """A vocabulary: per column, value -> id (admitted values) and value -> count (not yet admitted).

    Updates are journaled by the stream's good-row number so that the state saved with a checkpoint holds
    exactly the rows trained before it, however far the stream was read ahead (:meth:`commit_to`)."""

    def __init__(self, n_columns: int) -> None:
        super().__init__(n_columns)
        self.ids: list[dict[Any, int]] = [{} for _ in range(n_columns)]
        self.pending: list[dict[Any, int]] = [{} for _ in range(n_columns)]
        self.size = 2  # next id (0: null, 1: out of vocabulary)
        #: (row, column, value, id or 0 for "one more sighting") of the live state, not yet committed
        self.journal: list[tuple[int, int, Any, int]] = []

    def copy(self) -> "VocabularyState":
        new = VocabularyState(len(self.ids))
        new.kinds = list(self.kinds)
        new.ids = [dict(d) for d in self.ids]
        new.pending = [dict(d) for d in self.pending]
        new.size = self.size
        return new

    def apply(self, column: int, value: Any, id_: int) -> None:
        if id_:
            self.ids[column][value] = id_
            self.pending[column].pop(value, None)
            self.size = max(self.size, id_ + 1)
        else:
            self.pending[column][value] = self.pending[column].get(value, 0) + 1

    def take_journal(self, rows: int) -> list[tuple[int, int, Any, int]]:
        """Remove and return the journal entries of the first ``rows`` good rows of the stream."""
        cut = 0
        while cut < len(self.journal) and self.journal[cut][0] < rows:
            cut += 1
        taken, self.journal = self.journal[:cut], self.journal[cut:]
        return taken

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**super().to_dict(), "size": self.size}
        for k, kind in enumerate(self.kinds):
            dt = np.str_ if kind == "string" else np.int64
            for part, table in (("ids", self.ids[k]), ("pending", self.pending[k])):
                keys = list(table)
                out[f"{part}_{k}_keys"] = np.array(keys, dtype=dt) if keys else np.zeros(0, dtype=dt)
                out[f"{part}_{k}_values"] = np.array([table[v] for v in keys], dtype=np.int64)
        return out

    def load_dict(self, state: Mapping[str, Any]) -> None:
        super().load_dict(state)
        self.size = int(state["size"])
        for k, kind in enumerate(self.kinds):
            for part in ("ids", "pending"):
                keys = np.asarray(state[f"{part}_{k}_keys"])
                values = np.asarray(state[f"{part}_{k}_values"]).tolist()
                keys_list = [str(v) for v in keys.tolist()] if kind == "string" else [int(v) for v in keys.tolist()]
                getattr(self, part)[k] = dict(zip(keys_list, values))
        self.journal = []


class Vocabulary(Encoder):
    """Ids assigned on first sight: 2, 3, ... in the order values are admitted; 0 for nulls, 1 for values
    not in the vocabulary (unseen by a model being served, seen fewer than ``min_count`` times, or met
    once ``max_size`` ids are taken).  ``min_count`` is Monolith's frequency filter: rare values share
    the out-of-vocabulary id instead of each taking an embedding row.  Several columns share one id space.
    The exported model looks values up with ``ai.onnx.ml.LabelEncoder``.

    Parameters
    ----------
    columns
        A column name, or several sharing one id space.
    min_count
        Times a value must be seen before it gets an id of its own (1: on first sight).
    max_size
        The most ids, 0 and 1 included (>= 3); None: no limit.

    Examples
    --------
    >>> import pyarrow as pa
    >>> enc = Vocabulary("city", min_count=2)
    >>> state = enc.new_state()
    >>> enc.encode(state, [pa.array(["paris", "oslo", "paris", None, "oslo", "rome"])]).ravel().tolist()
    [1, 1, 2, 0, 3, 1]
    """

    def __init__(self, columns: "str | Sequence[str]", min_count: int = 1, max_size: int | None = None) -> None:
        self.columns = _columns(columns, "Vocabulary")
        if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 1:
            raise ValueError(f"Vocabulary: min_count must be an int >= 1, got {min_count!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer))
                                     or max_size < 3):
            raise ValueError(f"Vocabulary: max_size must be None or an int >= 3 (ids 0 and 1 are reserved), "
                             f"got {max_size!r}")
        self.min_count = int(min_count)
        self.max_size = None if max_size is None else int(max_size)

    def new_state(self) -> VocabularyState:
        return VocabularyState(len(self.columns))

    def encode(self, state: EncoderState, arrays: Sequence[pa.Array], *, journal_at: int | None = None,
               length: int | None = None) -> np.ndarray:
        """Ids of the rows; the vocabulary learns from them (row by row, in order).  ``journal_at``: the
        stream's good-row number of the first row, to journal the updates (see :class:`VocabularyState`).

        Parameters
        ----------
        state
            The encoder's state (:meth:`new_state`, or the one a trainer keeps).
        arrays
            One Arrow array per column of ``columns``, of the same rows.
        journal_at
            The stream's good-row number of the first row, for an encoder whose state journals its updates; None:
            no journal.
        length
            The width a list encoder pads to when it has no ``length`` of its own (the model input's last dimension).
        """
        assert isinstance(state, VocabularyState)
        cats = self._categoricals(state, arrays)
        n = len(cats[0].index) if cats else 0
        out = np.empty((n, len(cats)), dtype=np.int64)
        # the rows' values of all columns in row order: admissions happen in that order
        events: list[tuple[int, int, Any]] = []  # (row, column, value) of sightings that change the state
        positions: list[dict[Any, int]] = []
        for k, cat in enumerate(cats):
            uniques = cat.uniques.tolist()
            positions.append({v: u for u, v in enumerate(uniques)})
            table = np.array([state.ids[k].get(v, OOV_ID) for v in uniques] or [0], dtype=np.int64)
            unknown = np.flatnonzero(table[: len(uniques)] == OOV_ID) if uniques else np.zeros(0, np.int64)
            if len(unknown) and (self.max_size is None or state.size < self.max_size):
                rows = np.flatnonzero(np.isin(cat.index, unknown))
                need = {int(u): self.min_count - state.pending[k].get(uniques[u], 0) for u in unknown.tolist()}
                seen: dict[int, int] = {}
                for r in rows.tolist():  # at most min_count sightings per new value change anything
                    u = int(cat.index[r])
                    c = seen.get(u, 0)
                    if c < need[u]:
                        seen[u] = c + 1
                        events.append((r, k, uniques[u]))
            out[:, k] = np.where(cat.index >= 0, table[np.maximum(cat.index, 0)], NULL_ID)
        if not events:
            return out
        events.sort(key=lambda e: (e[0], e[1]))
        for r, k, value in events:
            if value in state.ids[k]:
                continue
            count = state.pending[k].get(value, 0) + 1
            full = self.max_size is not None and state.size >= self.max_size
            if full:
                continue
            if count >= self.min_count:
                id_ = state.size
                state.apply(k, value, id_)
                later = np.flatnonzero(cats[k].index[r:] == positions[k][value]) + r
                out[later, k] = id_
            else:
                id_ = 0
                state.apply(k, value, 0)
            if journal_at is not None:
                state.journal.append((journal_at + r, k, value, id_))
        return out

    def lookup(self, state: EncoderState, arrays: Sequence[pa.Array]) -> np.ndarray:
        """Ids of the rows as the vocabulary stands, learning nothing (predictions): unknown values, and
        values not yet admitted, get the unknown id.

        Parameters
        ----------
        state
            The vocabulary's state.
        arrays
            One Arrow array per column of ``columns``.
        """
        assert isinstance(state, VocabularyState)
        probe = EncoderState(len(self.columns))  # the kinds are checked, not fixed, by a prediction
        probe.kinds = list(state.kinds)
        cats = self._categoricals(probe, arrays)
        n = len(cats[0].index) if cats else 0
        out = np.empty((n, len(cats)), dtype=np.int64)
        for k, cat in enumerate(cats):
            table = np.array([state.ids[k].get(v, OOV_ID) for v in cat.uniques.tolist()] or [0], dtype=np.int64)
            out[:, k] = np.where(cat.index >= 0, table[np.maximum(cat.index, 0)], NULL_ID)
        return out

    def commit(self, committed: EncoderState, live: EncoderState, rows: int) -> None:
        """Apply to ``committed`` the live updates of the stream's first ``rows`` good rows.

        Parameters
        ----------
        committed, live
            The state a checkpoint holds, and the one training updated.
        rows
            Good rows of the stream whose updates to apply (those trained up to the checkpoint).
        """
        assert isinstance(committed, VocabularyState) and isinstance(live, VocabularyState)
        for k, kind in enumerate(live.kinds):
            if committed.kinds[k] is None:
                committed.kinds[k] = kind
        for _, k, value, id_ in live.take_journal(rows):
            committed.apply(k, value, id_)


class _ListEncoder(Encoder):
    def __init__(self, column: str, length: int | None = None) -> None:
        (self.column,) = _columns(column, type(self).__name__)
        if length is not None and (isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1):
            raise ValueError(f"{type(self).__name__}: length must be None (the model input's) or an int >= 1, "
                             f"got {length!r}")
        self.length = None if length is None else int(length)

    @property
    def columns(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.column,)

    def lists(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(offsets into ``values``, lengths, values) of a list column; null lists are empty.  ``values`` is the
        whole child array (a slice's offsets point into it)."""
        t = arr.type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise EncodeProblem(self.column, f"column '{self.column}' is {t}, expected a variable-length list "
                                             f"(list or large_list) for {type(self).__name__}")
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        lengths = np.diff(offsets)
        if arr.null_count:
            lengths = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lengths)
        return offsets, lengths, arr.values


class Padded(_ListEncoder):
    """A variable-length list column (multi-valued ids, token sequences) as ``(n, length)`` rows: each list
    truncated to its first ``length`` values or padded with ``pad``; a null list is all padding.
    ``length=None`` takes the model input's last dimension.  Feed :class:`Lengths` or :class:`Mask`
    of the same column to another input when the model needs to know where the padding starts.

    Parameters
    ----------
    column
        The list column.
    length
        Values per row; None: the model input's last dimension.
    pad
        The value of the padding.

    Examples
    --------
    >>> import pyarrow as pa
    >>> Padded("ids", length=3, pad=-1).encode(None, [pa.array([[5, 6], [], None, [1, 2, 3, 4]])]).tolist()
    [[5, 6, -1], [-1, -1, -1], [-1, -1, -1], [1, 2, 3]]
    """

    def __init__(self, column: str, length: int | None = None, pad: float = 0) -> None:
        super().__init__(column, length)
        if isinstance(pad, bool) or not isinstance(pad, (int, float, np.integer, np.floating)):
            raise ValueError(f"Padded: pad must be a number, got {pad!r}")
        self.pad = pad

    @property
    def width(self) -> int:
        if self.length is None:
            raise ValueError("Padded(length=None) takes its length from the model input")
        return self.length

    def encode(self, state: Any, arrays: Sequence[pa.Array], *, journal_at: int | None = None,
               length: int | None = None, dtype: Any = None) -> np.ndarray:
        L = self.length or length
        if L is None:
            raise EncodeProblem(self.column, f"Padded('{self.column}') needs a length: the model input's last "
                                             "dimension is not fixed; pass length=")
        offsets, lengths, values = self.lists(arrays[0])
        if values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).null_count:
            raise EncodeProblem(self.column, f"column '{self.column}' has null list elements, expected values "
                                             "(a null list is padding, a null element is not)")
        kind = values.type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
            raise EncodeProblem(self.column, f"column '{self.column}' is a list of {kind}, expected numbers "
                                             "(encode strings with Hashed or Vocabulary first)")
        flat = values.to_numpy(zero_copy_only=False)
        dt = np.dtype(dtype) if dtype is not None else flat.dtype
        n = len(lengths)
        out = np.full((n, L), self.pad, dtype=dt)
        take = np.minimum(lengths, L)
        row = np.repeat(np.arange(n), take)
        col = np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take)
        out[row, col] = flat[np.repeat(offsets[:-1], take) + col]
        return out


class Lengths(_ListEncoder):
    """The number of values of each list of a list column (at most ``length`` when given), as ``(n, 1)``.

    Parameters
    ----------
    column
        The list column.
    length
        The most a length may say (the ``length`` of the :class:`Padded` beside it); None: no bound.
    """

    @property
    def width(self) -> int:
        return 1

    def encode(self, state: Any, arrays: Sequence[pa.Array], *, journal_at: int | None = None,
               length: int | None = None) -> np.ndarray:
        _, lengths, _ = self.lists(arrays[0])
        L = self.length
        return (lengths if L is None else np.minimum(lengths, L)).reshape(-1, 1)


class Mask(_ListEncoder):
    """``(n, length)`` 1 where a padded list (:class:`Padded` of the same column) holds a value, 0 in the
    padding; ``length=None`` takes the model input's last dimension.

    Parameters
    ----------
    column
        The list column.
    length
        Values per row, as the :class:`Padded` of the same column; None: the model input's last dimension.
    """

    @property
    def width(self) -> int:
        if self.length is None:
            raise ValueError("Mask(length=None) takes its length from the model input")
        return self.length

    def encode(self, state: Any, arrays: Sequence[pa.Array], *, journal_at: int | None = None,
               length: int | None = None) -> np.ndarray:
        L = self.length or length
        if L is None:
            raise EncodeProblem(self.column, f"Mask('{self.column}') needs a length: pass length=")
        _, lengths, _ = self.lists(arrays[0])
        return (np.arange(L)[None, :] < lengths[:, None]).astype(np.int64)
