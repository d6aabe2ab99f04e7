"""Checkpoints of large tables that scale with what changed: a full snapshot, then deltas of touched rows.

A *chain* is a full checkpoint (its tables whole, in ``state.npz``) followed by delta checkpoints, each
holding, for every table, only the rows written since the checkpoint before it (``delta.npz``: sorted
row indices and their new values), plus everything small (dense weights, counters) in full.  Reading
checkpoint ``n`` of a chain = the full, then every delta up to ``n`` applied in order.  Each delta names
its parent by step *and* by the parent's manifest checksum, so a chain is never stitched from
checkpoints of different runs; one damaged link makes every later checkpoint of its chain unreadable,
and a reader falls back to the newest checkpoint whose whole chain verifies.

The model file of a chain checkpoint is a *skeleton*: the ONNX model with its tables' initializers
empty (zero rows).  ``model_fill`` names, for each such initializer, the array whose value fills it;
:func:`fill_model` does so when the model bytes are asked for (export, publish), never when resuming.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from streamfit.exceptions import CheckpointError

__all__ = ["ArrayBlocks", "RowDelta", "TableArrays", "ChainLink", "fill_model", "apply_delta", "DELTA_ROWS", "DELTA_VALUES"]

#: member-name suffixes in ``delta.npz``: ``<array>#rows`` (int64) and ``<array>#values``
DELTA_ROWS = "#rows"
DELTA_VALUES = "#values"


@dataclass(frozen=True, eq=False)
class RowDelta:
    """The rows of one large array written since the previous checkpoint: their indices and new values.

    ``rows`` are sorted, distinct int64 indices along axis 0 of an array of ``shape``; ``values`` has
    ``len(rows)`` rows of ``shape[1:]``.  Both must be copies the caller no longer mutates.

    Attributes
    ----------
    shape
        The whole array's shape.
    rows
        The sorted, distinct row indices.
    values
        Their new values.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit.checkpoint._chain import apply_delta
    >>> d = RowDelta((4, 2), np.array([1, 3]), np.ones((2, 2), np.float32))
    >>> base = np.zeros((4, 2), np.float32); apply_delta(base, d, "t"); base[:, 0].tolist()
    [0.0, 1.0, 0.0, 1.0]
    """

    shape: tuple[int, ...]
    rows: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        rows = np.asarray(self.rows)
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise CheckpointError(f"RowDelta rows must be a 1-D integer array, got {rows.dtype} {rows.shape}")
        object.__setattr__(self, "rows", rows.astype(np.int64, copy=False))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        values = np.asarray(self.values)
        if values.dtype.hasobject:
            raise CheckpointError("RowDelta values hold Python objects; checkpoints refuse pickle")
        if values.shape != (len(rows), *self.shape[1:]):
            raise CheckpointError(f"RowDelta values have shape {values.shape}, expected "
                                  f"{(len(rows), *self.shape[1:])} for {len(rows)} rows of {self.shape}")
        object.__setattr__(self, "values", values)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.values.nbytes)


@dataclass(frozen=True, eq=False)
class ArrayBlocks:
    """A large array of a full checkpoint given as consecutive blocks of rows, read once by the writer, so
    that it is never copied whole (a copy-on-write snapshot of a live table: see :mod:`streamfit._engine.steps.row_snapshot`).

    ``blocks()`` yields arrays of ``shape[1:]`` rows whose lengths add up to ``shape[0]`` (each may be a
    reused buffer: consumed before the next is asked for); ``release()`` frees the snapshot behind it
    (idempotent; called by the store after the write, and by whoever drops an unwritten one).

    Attributes
    ----------
    shape, dtype
        The whole array's shape and element type.
    blocks
        A callable yielding consecutive row blocks (see above).
    release
        A callable freeing the snapshot behind the blocks (idempotent).

    Examples
    --------
    >>> import numpy as np
    >>> a = np.arange(6.0).reshape(3, 2)
    >>> blocks = ArrayBlocks(a.shape, a.dtype, lambda: iter((a[:2], a[2:])))
    >>> blocks.nbytes, sum(len(b) for b in blocks.blocks())
    (48, 3)
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    blocks: Callable[[], Iterator[np.ndarray]]
    release: Callable[[], None] = field(default=lambda: None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.dtype.hasobject:
            raise CheckpointError("ArrayBlocks of Python objects; checkpoints refuse pickle")
        if not self.shape:
            raise CheckpointError("ArrayBlocks needs an array of rows (at least one dimension)")

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class TableArrays:
    """The large arrays of a checkpoint being saved (what :meth:`CheckpointStore.save` takes as ``tables``).

    A full (``parent is None``): ``arrays`` maps each table array name to its whole value.  A delta:
    ``arrays`` maps each name to a :class:`RowDelta` relative to checkpoint ``parent``, which must be the
    newest committed checkpoint of the store and of the same chain.  ``model_fill`` maps each ONNX
    initializer left empty in the model bytes to the array that fills it.

    Attributes
    ----------
    arrays
        ``{name: array}`` (a full; an :class:`ArrayBlocks` streams one) or ``{name: RowDelta}`` (a delta).
    parent
        None for a full; the newest committed checkpoint's step for a delta.
    model_fill
        ``{initializer left empty in the model bytes: array name}``.
    compact
        Write a delta as a full checkpoint (its parent's chain resolved from disk, these rows applied): ends a
        long chain.
    """

    arrays: Mapping[str, "np.ndarray | ArrayBlocks | RowDelta"]
    parent: int | None = None
    model_fill: Mapping[str, str] = field(default_factory=dict)
    #: a delta to be written as a full: the store resolves the parent's chain from disk and applies these
    #: rows, in the writer's thread (so a full never copies the live tables on the training thread)
    compact: bool = False

    def __post_init__(self) -> None:
        kinds = {isinstance(v, RowDelta) for v in self.arrays.values()}
        if self.parent is None and True in kinds:
            raise CheckpointError("a full checkpoint's tables must be whole arrays, not RowDelta")
        if self.parent is not None and False in kinds:
            raise CheckpointError(f"a delta checkpoint (parent {self.parent}) takes a RowDelta for every table")
        for name, value in self.arrays.items():
            if not isinstance(value, (np.ndarray, ArrayBlocks, RowDelta)):
                raise CheckpointError(f"table {name!r} is {type(value).__name__}, expected a numpy array, "
                                      "ArrayBlocks or RowDelta")
        if self.compact and self.parent is None:
            raise CheckpointError("compact=True writes a delta as a full: it needs a parent")
        unknown = sorted(set(self.model_fill.values()) - set(self.arrays))
        if unknown:
            raise CheckpointError(f"model_fill names arrays {unknown} that are not tables of this checkpoint")

    @property
    def is_delta(self) -> bool:
        return self.parent is not None

    @property
    def streamed(self) -> bool:
        """Some table is given as :class:`ArrayBlocks` (readable once, by the writer)."""
        return any(isinstance(v, ArrayBlocks) for v in self.arrays.values())

    def release(self) -> None:
        """Release every :class:`ArrayBlocks` (its snapshot); idempotent."""
        for value in self.arrays.values():
            if isinstance(value, ArrayBlocks):
                value.release()


@dataclass(frozen=True)
class ChainLink:
    """A checkpoint's place in its chain, as its manifest's ``tables`` section says.

    Attributes
    ----------
    kind
        ``"full"`` or ``"delta"``.
    base, depth
        The step of the chain's full checkpoint, and the deltas from it to this one (0 for the full).
    parent, parent_manifest_sha256
        A delta's previous checkpoint step and the SHA-256 of its manifest; None for a full.
    tables
        ``{array name: {"dtype", "shape"}}`` of each whole table array.
    model_fill
        ``{initializer: array name}``: the model's initializers left empty, filled from the tables.
    rows
        A delta's rows per table.
    """

    kind: str  # "full" or "delta"
    base: int  # step of the chain's full checkpoint
    depth: int  # deltas from the full to this one (0 for the full)
    parent: int | None
    parent_manifest_sha256: str | None
    tables: Mapping[str, Mapping[str, Any]]  # array name -> {"dtype", "shape"} of the whole array
    model_fill: Mapping[str, str]
    rows: Mapping[str, int]  # delta: rows held per table

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "base": self.base, "depth": self.depth, "parent": self.parent,
                "parent_manifest_sha256": self.parent_manifest_sha256,
                "tables": {k: dict(v) for k, v in self.tables.items()}, "model_fill": dict(self.model_fill),
                "rows": dict(self.rows)}

    @classmethod
    def from_json(cls, value: Any, step: int) -> "ChainLink":
        """Parse a manifest's ``tables`` section; :class:`ValueError` naming what is wrong.

        Parameters
        ----------
        value
            The manifest's ``tables`` section.
        step
            The checkpoint's step (for the messages and checks).
        """
        if not isinstance(value, dict):
            raise ValueError(f"'tables' is {type(value).__name__}, expected an object")
        kind = value.get("kind")
        if kind not in ("full", "delta"):
            raise ValueError(f"'tables.kind' is {kind!r}, expected 'full' or 'delta'")
        ints = {k: value.get(k) for k in ("base", "depth")}
        for k, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"'tables.{k}' is {v!r}, expected an int >= 0")
        parent, psha = value.get("parent"), value.get("parent_manifest_sha256")
        if kind == "full":
            if parent is not None or value["depth"] != 0 or value["base"] != step:
                raise ValueError("a full checkpoint has no parent, depth 0 and its own step as base")
        else:
            if not isinstance(parent, int) or isinstance(parent, bool) or not value["base"] <= parent < step:
                raise ValueError(f"'tables.parent' is {parent!r}, expected a step in [base, {step})")
            if not isinstance(psha, str) or len(psha) != 64 or value["depth"] < 1:
                raise ValueError("a delta checkpoint names its parent's manifest checksum and has depth >= 1")
        tables, fill, rows = value.get("tables"), value.get("model_fill"), value.get("rows")
        if not isinstance(tables, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("shape"), list) and "dtype" in e for e in tables.values()):
            raise ValueError("'tables.tables' is not an object of {dtype, shape}")
        if not isinstance(fill, dict) or not all(isinstance(v, str) and v in tables for v in fill.values()):
            raise ValueError("'tables.model_fill' does not map initializers to tables")
        if not isinstance(rows, dict) or (kind == "delta" and set(rows) != set(tables)) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in rows.values()):
            raise ValueError("'tables.rows' does not count the rows of every table")
        return cls(kind, value["base"], value["depth"], parent, psha, tables, fill, rows)


def apply_delta(target: np.ndarray, delta: RowDelta, name: str) -> None:
    """Write ``delta``'s rows into ``target`` in place (a whole array of ``delta.shape``)."""
    if target.shape != delta.shape:
        raise CheckpointError(f"delta of {name!r} is for shape {delta.shape}, the array is {target.shape}")
    if delta.rows.size and (delta.rows[0] < 0 or delta.rows[-1] >= delta.shape[0]):
        raise CheckpointError(f"delta of {name!r} has rows outside 0..{delta.shape[0] - 1}")
    target[delta.rows] = delta.values


def fill_model(skeleton: bytes, model_fill: Mapping[str, str], arrays: Mapping[str, np.ndarray]) -> bytes:
    """The model bytes with each empty initializer of ``model_fill`` set to its array's value."""
    if not model_fill:
        return skeleton
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(skeleton)
    missing = set(model_fill)
    for init in model.graph.initializer:
        if init.name in model_fill:
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arrays[model_fill[init.name]]), init.name))
            missing.discard(init.name)
    if missing:
        raise CheckpointError(f"the checkpoint's model has no initializers {sorted(missing)} to fill")
    return model.SerializeToString()
