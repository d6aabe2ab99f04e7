"""Row-sparse training of embedding tables: a step reads and writes only the rows whose ids are in the batch.

A *table* is a trained initializer used only as the data input of ``Gather`` (axis 0) whose indices are a
model input: what ``nn.Embedding`` exports, and what the hashed linear models and factorization machines
build.  onnxruntime-training's gradient of a table is a dense table-sized tensor (``GatherGrad``), and a
dense update or a ping-pong copy of it costs O(table) per step.  So the training graph never holds a table:

* in the training graph each ``Gather(table, ids)`` is cut out: its output (the rows of every id position)
  becomes a graph input, and the gradient graph also returns its gradient;
* before each run the host finds the distinct ids of the batch (O(ids), no sort: a per-table scratch
  array), copies those rows of the table and of its optimizer state into a block (``np.take``), and fills
  the positions' rows from the block;
* after a finite fused run, a small *rows update* graph sums the positions' gradients per distinct id
  (``ScatterND`` with ``reduction="add"``: duplicates summed) and applies the optimizer's update nodes --
  the same emitter as for dense weights -- to the block and its state, with a finiteness check; only when
  that is finite too are the new rows and state written back in place (a refused step writes nothing).

Why this split: on CPU a table is host memory that the prediction session reads through a zero-copy
OrtValue, so the update is an in-place scatter of the touched rows -- nothing table-sized is made, copied
or swapped, and a step costs O(rows touched) whatever the table's size.  Keeping the arithmetic in a
graph gives the rows the exact rules of dense weights; the host only moves rows.  (Why not ORT's own
gradient of ``Gather`` over the block: its ``GatherGrad`` CPU kernel took 55 ms for 20K ids x 16 here,
``ScatterND`` 1.4 ms; and a separate graph keeps ``ScatterND``'s opset 16 out of the model's graph.)
For rows never touched the result is what the dense rule computes with a zero gradient for SGD, AdaGrad
and FTRL (FTRL: for rows that start at zero); Adam becomes lazy Adam (PyTorch's ``SparseAdam``: moments
of untouched rows do not decay; bias corrections use the global step).  The penalty is lazy too (applied
to a row when it is touched).  CPU only, fused step only: on CUDA and with ``step="forward_backward"``
(whose ``backward()`` returns dense gradients) tables are trained densely.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from streamfit._engine.common import ort_private as C
from streamfit._engine.common.names import Names
from streamfit._engine.prepare.model import PreparedModel
from streamfit._engine.runtime.device import make_session
from streamfit._engine.steps.row_snapshot import CowSnapshot
from streamfit._engine.steps.row_snapshot import row_items as _row_items
from streamfit._engine.steps.rows_update import rows_update_model
from streamfit._engine.steps.step_graphs import folds_lr_into_gradients
from streamfit._engine.steps.tables import SparseTable
from streamfit.exceptions import BadInputError
from streamfit.optim.base import Optimizer
from streamfit.penalties import Penalty

__all__ = ["TouchedRows", "SparseTables"]


@dataclass(frozen=True, eq=False)
class TouchedRows:
    """The rows of each table (and of its optimizer state) written since the tracker was last cleared.

    ``rows[table]``: sorted distinct int64 row indices; ``shapes[table]``: the table's shape.  What a delta
    checkpoint writes (see :mod:`streamfit.checkpoint._chain`).
    """

    rows: Mapping[str, np.ndarray]
    shapes: Mapping[str, tuple[int, ...]]

    @property
    def count(self) -> int:
        """Rows touched, all tables."""
        return sum(int(r.size) for r in self.rows.values())


def _suffix(table: str, what: str) -> str:
    return Names.table(table, what)


class _Staged:
    """One batch shape's buffers: per table the block of touched rows and its state (inputs of the rows
    update), the new ones (its outputs), the index of each position's row, the positions' rows (inputs of
    the fused graph) and their gradients (its outputs); and the distinct ids, set by ``gather``."""

    def __init__(self, owner: "SparseTables", xs: tuple[np.ndarray, ...]) -> None:
        device = owner.device
        self.inputs: dict[str, tuple[C.OrtValue, np.ndarray]] = {}  # rows update graph
        self.outputs: dict[str, tuple[C.OrtValue, np.ndarray]] = {}
        self.fused_inputs: dict[str, tuple[C.OrtValue, np.ndarray]] = {}
        self.fused_outputs: dict[str, tuple[C.OrtValue, np.ndarray]] = {}
        self.uniq: list[np.ndarray] = [np.zeros(0, np.int64) for _ in owner.tables]
        for t, slots, grads in zip(owner.tables, owner._slots, owner.grad_names):
            k = sum(int(xs[i].size) for i, _ in slots)
            w = _suffix(t.name, "rows")
            names = [w] + [Names.slot(w, slot) for slot in owner.state[t.name]]
            tails = [t.shape[1:]] + [v.shape[1:] for v in owner.state[t.name].values()]
            for name, tail in zip(names, tails):
                self.inputs[name] = device.staging((k,) + tuple(tail), owner.dtype)
                self.outputs[Names.new(name)] = device.staging((k,) + tuple(tail), owner.dtype)
            self.inputs[_suffix(t.name, "inv")] = device.staging((k,), np.int64)
            for j, ((i, _), use, grad) in enumerate(zip(slots, t.uses, grads)):
                shape = tuple(xs[i].shape) + t.shape[1:]
                self.fused_inputs[use.rows] = device.staging(shape, owner.dtype)
                self.fused_outputs[grad] = pair = device.staging(shape, owner.dtype)
                self.inputs[_suffix(t.name, f"grad{j}")] = pair  # the update reads what the fused run wrote
        session = owner.session
        self.io = C.io_binding(session)
        for name, value in owner.scalars.values.items():
            if name in owner.session_inputs:
                self.io.bind_ortvalue_input(name, value)
        for name, (value, _) in self.inputs.items():
            self.io.bind_ortvalue_input(name, value)
        for name, (value, _) in self.outputs.items():
            self.io.bind_ortvalue_output(name, value)
        #: the blocks (and new blocks) as 1-D arrays of rows, for row-wise take/put
        self.items = {name: _row_items(pair[1]) for name, pair in {**self.inputs, **self.outputs}.items()
                      if name in owner._block_names}
        self.position_items = {name: _row_items(pair[1].reshape((-1,) + pair[1].shape[len(xs[i].shape):]))
                               for t, slots in zip(owner.tables, owner._slots)
                               for (i, _), use in zip(slots, t.uses)
                               for name, pair in [(use.rows, self.fused_inputs[use.rows])]}
        #: per table: the names gather and update use (made once: a step of one row would pay them each time)
        self.inv_names = [_suffix(t.name, "inv") for t in owner.tables]
        self.block_names = [_suffix(t.name, "rows") for t in owner.tables]
        self.state_items = [[(Names.slot(w, slot), Names.slot(t.name, slot)) for slot in owner.state[t.name]]
                            for t, w in zip(owner.tables, self.block_names)]
        self.new_items = [[(Names.new(w), t.name)] + [(Names.new(name), source) for name, source in items]
                          for t, w, items in zip(owner.tables, self.block_names, self.state_items)]
        self.check = np.zeros((), owner.dtype)
        self._check_value = C.from_numpy(self.check, C.cpu_device())
        self.io.bind_ortvalue_output(Names.check, self._check_value)


class SparseTables:
    """The tables and their optimizer state as host arrays, whose touched rows each step reads and writes.

    ``gather`` stages a batch's touched rows (before the fused run), ``update`` runs the rows update and
    writes the new rows back (after a finite fused run).  ``values`` are zero-copy OrtValues of the tables
    (bound by the prediction session).
    """

    def __init__(self, tables: tuple[SparseTable, ...], pm: PreparedModel, optimizer: Optimizer,
                 penalty: Penalty | None, device: Any, scalars: Any, options: Any) -> None:
        self.tables = tables
        self.optimizer = optimizer
        self.penalty = penalty
        self.dtype = pm.dtype
        self.device = device
        self.scalars = scalars
        self.penalized = {t.name for t in tables if t.name in pm.penalized}
        self.arrays: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.values: dict[str, C.OrtValue] = {}
        self._rows: dict[str, np.ndarray] = {}  # per table and state array: its rows as one 1-D array of items
        self._touched: dict[str, np.ndarray] = {}  # per table: rows written since clear_touched()
        self._lend: str | None = None  # read()/read_state() inside lend(): "live" arrays or "empty" ones
        self._snapshots: list[CowSnapshot] = []  # open copy-on-write snapshots (a full checkpoint being written)
        #: per (table, rows): rows of the table and its state as the optimizer starts them (a chunk's scratch rows)
        self.chunk_scratch: dict[tuple[str, int], list[np.ndarray]] = {}
        for t in tables:
            array = pm.initial[t.name]  # prepare_model's own copy: it becomes the live table (not copied again)
            if not (array.flags.c_contiguous and array.flags.writeable):
                array = np.ascontiguousarray(array).copy()
            self.arrays[t.name] = array
            self.state[t.name] = {k: np.ascontiguousarray(v) for k, v in optimizer.init_state(array).items()}
            self.values[t.name] = C.from_numpy(array, device.ort_device())
            self._rows[t.name] = _row_items(array)
            for slot, arr in self.state[t.name].items():
                self._rows[Names.slot(t.name, slot)] = _row_items(arr)
            self._touched[t.name] = np.zeros(t.shape[0], np.bool_)
        input_index = {i.name: k for k, i in enumerate(pm.inputs)}
        #: per table, per use: the index of its ids input among the model inputs, and its name
        self._slots: list[list[tuple[int, str]]] = [[(input_index[u.ids], u.ids) for u in t.uses] for t in tables]
        #: the fused graph's inputs to ask gradients for (the rows of the id positions), in table/use order
        self.rows_names = [u.rows for t in tables for u in t.uses]
        self.grad_names: list[list[str]] = []  # their gradients' names, set by :meth:`set_grad_names`
        self.fold = folds_lr_into_gradients(optimizer, penalty)
        self.model = rows_update_model(tables, self.state, self.dtype, optimizer, penalty, self.penalized, fold=self.fold,
                                       decay=penalty is not None and penalty.l2 > 0)
        self.session = make_session(self.model.SerializeToString(), options, device, pm.dtype)
        self.session_inputs = {i.name for i in self.session.get_inputs()}
        self._arange = np.zeros(0, np.int64)
        self._keys = np.zeros(0, np.int64)
        self.touched_rows = 0  # distinct rows of the last staged batch (all tables)
        self._names = Names
        self._block_names = set()
        for t in tables:
            w = _suffix(t.name, "rows")
            for name in [w] + [Names.slot(w, slot) for slot in self.state[t.name]]:
                self._block_names |= {name, Names.new(name)}

    def set_grad_names(self, names: Sequence[str]) -> None:
        """The gradient graph's names of the gradients of :attr:`rows_names` (same order)."""
        it = iter(names)
        self.grad_names = [[next(it) for _ in t.uses] for t in self.tables]

    # -- a step --------------------------------------------------------------------------------------
    def staged(self, xs: tuple[np.ndarray, ...]) -> _Staged:
        """New buffers for a batch whose model inputs are staged in ``xs`` (bound once per batch shape)."""
        return _Staged(self, xs)

    def gather(self, xs: tuple[np.ndarray, ...], staged: _Staged) -> None:
        """Stage the touched rows (and state) of a batch whose model inputs are in ``xs``; raises
        :class:`~streamfit.exceptions.BadInputError` for an id outside its table."""
        touched = 0
        for n, (t, slots) in enumerate(zip(self.tables, self._slots)):
            table = self.arrays[t.name]
            rows = table.shape[0]
            inv = staged.inputs[staged.inv_names[n]][1]
            if inv.size <= _FEW:  # a few ids (a batch of one row): Python on their values beats numpy's calls
                uniq = _distinct_few(xs, slots, rows, inv, t.name)
            else:
                parts = []
                for i, ids_name in slots:
                    ids = xs[i]
                    lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
                    if lo < -rows or hi >= rows:
                        _out_of_range(ids, rows, ids_name, t.name)
                    flat = ids.reshape(-1)
                    parts.append(np.where(flat < 0, flat + rows, flat) if lo < 0 else flat)  # from the end, as Gather
                flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
                uniq = _distinct(flat, rows, inv, self)  # sorted: the rows are read and written in address order
            staged.uniq[n] = uniq
            u = len(uniq)
            touched += u
            block = staged.items[staged.block_names[n]]
            self._rows[t.name].take(uniq, out=block[:u])
            for name, source in staged.state_items[n]:
                self._rows[source].take(uniq, out=staged.items[name][:u])
            at = 0
            for (i, _), use in zip(slots, t.uses):
                count = xs[i].size
                block.take(inv[at:at + count], out=staged.position_items[use.rows])
                at += count
        self.touched_rows = touched

    def update(self, staged: _Staged) -> bool:
        """After a finite fused run: the rows update; writes the new rows and state back if all are finite."""
        C.raw_session(self.session).run_with_iobinding(staged.io, None)
        if not math.isfinite(staged.check.item()):
            return False
        for t, uniq, items in zip(self.tables, staged.uniq, staged.new_items):
            u = len(uniq)
            for snap in tuple(self._snapshots):  # the rows' values at the snapshot's step, saved aside before they change
                for _, target in items:
                    snap.before_write(target, uniq)
            for name, target in items:  # sorted distinct rows: one pass in order
                self._rows[target].put(uniq, staged.items[name][:u])
            self._touched[t.name][uniq] = True
        return True

    # -- copy-on-write snapshots (full checkpoints) ----------------------------------------------------
    def snapshot(self) -> CowSnapshot:
        """The tables and their optimizer state frozen now, without a copy (see :mod:`streamfit._engine.steps.row_snapshot`):
        keyed by table name and ``<table>__<slot>``; open until read through or closed."""
        live = dict(self.arrays)
        for st in self.state_arrays().values():
            live.update(st)
        snap = CowSnapshot(live, on_close=self._detach)
        self._snapshots.append(snap)
        return snap

    def _detach(self, snap: CowSnapshot) -> None:
        with contextlib.suppress(ValueError):
            self._snapshots.remove(snap)

    @property
    def open_snapshots(self) -> int:
        """Copy-on-write snapshots still being written."""
        return len(self._snapshots)

    # -- touched rows (for delta checkpoints) --------------------------------------------------------
    def touched(self) -> TouchedRows:
        """The rows written since :meth:`clear_touched` (steps, and every row on a :meth:`write`)."""
        return TouchedRows({name: np.flatnonzero(mask) for name, mask in self._touched.items()},
                           {t.name: t.shape for t in self.tables})

    def clear_touched(self) -> None:
        for mask in self._touched.values():
            mask.fill(False)

    @contextlib.contextmanager
    def lend(self, mode: str) -> Iterator[None]:
        """Inside: :meth:`read`/:meth:`read_state` return the live arrays (``"live"``: not copied, the caller
        must not keep or mutate them) or empty ones of zero rows (``"empty"``: a model skeleton)."""
        if mode not in ("live", "empty"):
            raise ValueError(f"lend mode must be 'live' or 'empty', got {mode!r}")
        self._lend = mode
        try:
            yield
        finally:
            self._lend = None

    @property
    def lending(self) -> bool:
        """Inside :meth:`lend`."""
        return self._lend is not None

    def _out(self, a: np.ndarray) -> np.ndarray:
        if self._lend == "live":
            return a
        return np.zeros((0,) + a.shape[1:], a.dtype) if self._lend == "empty" else a.copy()

    # -- state ---------------------------------------------------------------------------------------
    def read(self) -> dict[str, np.ndarray]:
        return {name: self._out(a) for name, a in self.arrays.items()}

    def read_state(self) -> dict[str, np.ndarray]:
        """The tables' optimizer state, named as the Trainer names dense state (``<table>__<slot>``)."""
        slot = self._names.slot
        return {slot(name, k): self._out(v) for name, st in self.state.items() for k, v in st.items()}

    def state_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """Per table, its live optimizer state arrays by their Trainer names (``<table>__<slot>``)."""
        slot = self._names.slot
        return {name: {slot(name, k): v for k, v in st.items()} for name, st in self.state.items()}

    def state_names(self) -> set[str]:
        return {self._names.slot(name, k) for name, st in self.state.items() for k in st}

    def write(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            for snap in tuple(self._snapshots):
                snap.before_write_all(name)
            _copy_into(self.arrays[name], value, name)
            self._touched[name].fill(True)

    def write_state(self, values: Mapping[str, np.ndarray]) -> None:
        for name, st in self.state.items():
            for k, arr in st.items():
                key = self._names.slot(name, k)
                if key in values:
                    for snap in tuple(self._snapshots):
                        snap.before_write_all(key)
                    _copy_into(arr, values[key], key)
                    self._touched[name].fill(True)


#: at most this many ids in a step (all uses of a table): distinct ids found in Python (:func:`_distinct_few`)
_FEW = 64


def _distinct_few(xs: tuple[np.ndarray, ...], slots: Sequence[tuple[int, str]], rows: int, inv: np.ndarray,
                  table: str) -> np.ndarray:
    """:func:`_distinct` of a few ids (the uses' ids in ``xs``, concatenated) on Python ints: the same sorted
    distinct ids and the same ``inv``, the same error for an id outside the table, in a handful of calls."""
    flat: list[int] = []
    negative = False
    for i, ids_name in slots:
        values = xs[i].reshape(-1).tolist()
        if values:
            lo = min(values)
            if lo < -rows or max(values) >= rows:
                _out_of_range(xs[i], rows, ids_name, table)
            negative = negative or lo < 0
        flat += values
    if negative:  # from the end, as Gather
        flat = [v + rows if v < 0 else v for v in flat]
    uniq = sorted(set(flat))
    where = {v: k for k, v in enumerate(uniq)}
    inv[:] = [where[v] for v in flat]
    return np.array(uniq, np.int64)


def _distinct(flat: np.ndarray, rows: int, inv: np.ndarray, owner: "SparseTables") -> np.ndarray:
    """The distinct ids of ``flat`` (in ``0..rows-1``), sorted; writes into ``inv`` the index in them of
    each position.  One sort of packed ``id << b | position`` keys (SIMD ``np.sort``; no table-sized
    scratch, so nothing per step grows with the table), or a stable argsort when they do not fit 63 bits."""
    size = flat.size
    if size == 0:
        return flat[:0].astype(np.int64)
    if owner._arange.size < size:
        owner._arange = np.arange(size, dtype=np.int64)
        owner._keys = np.empty(size, np.int64)
    bits = max(1, (size - 1).bit_length())
    if (rows - 1) >> (63 - bits) == 0:
        keys = owner._keys[:size]
        np.copyto(keys, flat, casting="unsafe")  # int32 ids widen before the shift
        keys <<= bits
        keys |= owner._arange[:size]
        keys.sort()
        ids = keys >> bits
        pos = keys & ((1 << bits) - 1)
    else:
        pos = np.argsort(flat, kind="stable")
        ids = flat[pos].astype(np.int64, copy=False)
    first = np.empty(size, bool)
    first[0] = True
    np.not_equal(ids[1:], ids[:-1], out=first[1:])
    block_row = np.cumsum(first)
    block_row -= 1
    inv[pos] = block_row
    return ids[first]


def _out_of_range(ids: np.ndarray, rows: int, input_name: str, table: str) -> None:
    flat = ids.reshape(-1)
    bad = int(np.flatnonzero((flat < -rows) | (flat >= rows))[0])
    pos = np.unravel_index(bad, ids.shape)
    where = f", position {tuple(int(p) for p in pos[1:])}" if ids.ndim > 1 else ""
    raise BadInputError(f"input {input_name!r}: id {int(flat[bad])} at row {int(pos[0])}{where} is outside the "
                        f"table {table!r} of {rows} rows (expected -{rows}..{rows - 1})", reason="out_of_range",
                        column=input_name)


def _copy_into(target: np.ndarray, value: Any, name: str) -> None:
    value = np.asarray(value)
    if value.shape != target.shape:
        raise ValueError(f"{name!r}: shape {value.shape} does not match {target.shape}")
    np.copyto(target, value, casting="same_kind")
