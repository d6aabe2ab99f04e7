"""Row-sparse tables in a chunk of steps: the chunk's distinct rows as one small block the Scan carries.

A table of a million rows cannot be loop state (a Scan copies its state every iteration).  So the host
gathers the rows the chunk's ids touch (and their optimizer state) once into a block of ``U`` rows, plus ``P``
scratch rows (``P``: a step's id positions), and the step body works on the block:

* the rows of the step's id positions are ``Gather(block, local ids)`` (what the step path copies on the host);
* the step's distinct rows, padded to ``P`` with the scratch rows, are gathered from the block (and its state),
  and the rows update graph of :mod:`~streamfit._engine.steps.sparse_tables` -- the nodes the step path runs on
  its distinct rows -- updates them from the positions' gradients (``ScatterND`` sums a row's positions);
* ``ScatterND`` writes them back into the block.  A row the step did not touch is not read or written (the lazy
  rules of the step path: Adam's moments of untouched rows do not decay, penalties apply to touched rows), and a
  step costs O(its ids) plus a copy of the block.

After a finite chunk the block and its state (without the scratch rows) are written back into the tables once,
with the touched-rows and copy-on-write snapshot bookkeeping of the step path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper

from streamfit._engine.common.names import Names
from streamfit._engine.steps.sparse_tables import _out_of_range

__all__ = ["with_tables", "TableBlocks", "table_names"]

_PREFIX = "sfr_"  # the spliced rows update's own names


def _block(table: str) -> str:
    """The carried block of a table's rows (the rows update's own input ``<table>__rows`` is the step's rows)."""
    return f"sfc_block_{table}"


def _rows(table: str) -> str:
    return Names.table(table, "rows")


def _pos(table: str, use: int) -> str:
    return f"sfc_pos_{table}_{use}"


def _uniq(table: str) -> str:
    return f"sfc_uniq_{table}"


def _carried(sparse: Any, t: Any) -> list[tuple[str, str]]:
    """(the carried block name, the rows update's name) of a table's rows and of each state slot."""
    return [(_block(t.name), _rows(t.name))] + [(Names.slot(_block(t.name), slot), Names.slot(_rows(t.name), slot))
                                               for slot in sparse.state[t.name]]


def table_names(sparse: Any) -> tuple[list[str], list[str]]:
    """(the carried names: each table's block and its state blocks; the scanned names: each use's local ids,
    each table's step-local ids of the positions (``<table>__inv``) and the step's distinct rows, padded)."""
    state, scanned = [], []
    for t in sparse.tables:
        state += [block for block, _ in _carried(sparse, t)]
        scanned += [_pos(t.name, j) for j in range(len(t.uses))] + [Names.table(t.name, "inv"), _uniq(t.name)]
    return state, scanned


def with_tables(step: ModelProto, sparse: Any) -> ModelProto:
    """``step`` (a fused step graph whose table rows are inputs) with the tables' block update in it: inputs
    gain the blocks, their state and the local ids (:func:`table_names`); outputs the new blocks."""
    model = ModelProto()
    model.CopyFrom(step)
    graph = model.graph
    rows_model = sparse.model
    elem = step.graph.output[0].type.tensor_type.elem_type
    rows_inputs = {i.name: i for i in rows_model.graph.input}
    produced_rows = {u.rows for t in sparse.tables for u in t.uses}
    kept_inputs = [i for i in graph.input if i.name not in produced_rows]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    front: list[onnx.NodeProto] = []
    back: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    one = "sfc_axes_1"
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), one))
    for t, grads in zip(sparse.tables, sparse.grad_names):
        block = _block(t.name)
        for j, use in enumerate(t.uses):
            front.append(helper.make_node("Gather", [block, _pos(t.name, j)], [use.rows], axis=0,
                                          name=f"sfc_gather_{t.name}_{j}"))
            graph.input.append(helper.make_tensor_value_info(_pos(t.name, j), onnx.TensorProto.INT64, None))
            rename[Names.table(t.name, f"grad{j}")] = grads[j]
        graph.input.append(rows_inputs[Names.table(t.name, "inv")])
        graph.input.append(helper.make_tensor_value_info(_uniq(t.name), onnx.TensorProto.INT64, None))
        where = f"sfc_where_{t.name}"
        back.append(helper.make_node("Unsqueeze", [_uniq(t.name), one], [where]))
        for carried, rows in _carried(sparse, t):
            like = rows_inputs[rows]
            graph.input.append(helper.make_tensor_value_info(carried, elem, _dims(like)))
            # the step's distinct rows (and their state), read from the block; written back after the update
            front.append(helper.make_node("Gather", [carried, _uniq(t.name)], [rows], axis=0))
            back.append(helper.make_node("ScatterND", [carried, where, _PREFIX + Names.new(rows)],
                                         [Names.new(carried)], name=f"sfc_put_{carried}"))
            graph.output.append(helper.make_tensor_value_info(Names.new(carried), elem, _dims(like)))
    scalars = {i.name for i in graph.input}
    for name, vi in rows_inputs.items():  # the optimizer scalars the rows update reads and the step may not
        if name not in scalars and name not in rename and name not in {r for t in sparse.tables
                                                                         for _, r in _carried(sparse, t)} \
                and not name.endswith("__inv"):
            graph.input.append(vi)
            scalars.add(name)
    keep_names = set(rows_inputs) - set(rename)

    def local(name: str) -> str:
        if not name or name in keep_names:
            return name
        return rename.get(name, _PREFIX + name)

    for init in rows_model.graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = local(init.name)
        graph.initializer.append(copy)
    spliced = []
    for k, node in enumerate(rows_model.graph.node):
        copy_node = onnx.NodeProto()
        copy_node.CopyFrom(node)
        copy_node.input[:] = [local(n) for n in node.input]
        copy_node.output[:] = [local(n) for n in node.output]
        copy_node.name = _PREFIX + (node.name or f"n{k}")
        spliced.append(copy_node)
    nodes = front + list(graph.node) + spliced + back
    del graph.node[:]
    graph.node.extend(nodes)
    versions = {o.domain: o.version for o in model.opset_import}
    versions[""] = max(versions.get("", 0), 16)  # ScatterND with reduction (the rows update)
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in versions.items())
    return model


def _dims(vi: onnx.ValueInfoProto) -> list[Any]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


@dataclass
class TableBlocks:
    """One chunk's blocks: per table the distinct rows its ids touch, the block of those rows and their state
    (plus scratch rows), and the Scan's per-step inputs (local ids per use, step-local ids, the step's rows)."""

    uniq: list[np.ndarray]
    carried: dict[str, np.ndarray]
    scanned: dict[str, np.ndarray]

    @classmethod
    def gather(cls, sparse: Any, arrays: tuple[np.ndarray, ...], steps: int, batch_size: int,
               lean: bool = False) -> "TableBlocks":
        """The blocks of the first ``steps * batch_size`` rows of the model inputs ``arrays``; raises the step
        path's :class:`~streamfit.exceptions.BadInputError` for an id outside its table.  ``lean``: for the lean
        body (:mod:`~streamfit._engine.steps.scan_lean`), which reads the positions' block rows only (no scratch
        rows; the step-local ids are left empty)."""
        m = steps * batch_size
        uniqs: list[np.ndarray] = []
        carried: dict[str, np.ndarray] = {}
        scanned: dict[str, np.ndarray] = {}
        for t, slots in zip(sparse.tables, sparse._slots):
            rows = t.shape[0]
            parts = []
            for i, ids_name in slots:
                ids = np.asarray(arrays[i][:m])
                lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
                if lo < -rows or hi >= rows:
                    _out_of_range(ids, rows, ids_name, t.name)
                ids = ids.astype(np.int64, copy=False).reshape(steps, -1)
                parts.append(np.where(ids < 0, ids + rows, ids) if lo < 0 else ids)
            flat = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)  # [steps, positions], uses in order
            uniq, inv = _local_ids(flat)
            uniqs.append(uniq)
            u, p = len(uniq), flat.shape[1]
            sources = [sparse.arrays[t.name]] + list(sparse.state[t.name].values())
            extra = 0 if lean else p  # the generic body's p scratch rows, which start as the optimizer starts
            scratch = [] if lean else _scratch(sparse, t, p)
            for k, ((block, _), source) in enumerate(zip(_carried(sparse, t), sources)):
                carried[block] = out = np.empty((u + extra,) + source.shape[1:], source.dtype)
                np.take(source, uniq, axis=0, out=out[:u])
                if extra:
                    out[u:] = scratch[k]
            if lean:  # the lean body sums a step's positions per block row itself
                step_rows = step_inv = np.zeros((steps, 0), np.int64)
            else:
                step_rows, step_inv = _step_rows(inv, u)
            at = 0
            for j, (i, _) in enumerate(slots):
                width = parts[j].shape[1]
                scanned[_pos(t.name, j)] = np.ascontiguousarray(inv[:, at:at + width]).reshape(
                    (steps, batch_size) + arrays[i].shape[1:])
                at += width
            scanned[Names.table(t.name, "inv")] = step_inv
            scanned[_uniq(t.name)] = step_rows
        return cls(uniqs, carried, scanned)

    def write_back(self, sparse: Any, new: dict[str, np.ndarray]) -> None:
        """The chunk's final blocks (by block name) into the tables and their state, as the step path writes a
        step's rows (snapshots saved aside first, rows marked touched)."""
        for t, uniq in zip(sparse.tables, self.uniq):
            targets = [t.name] + [Names.slot(t.name, slot) for slot in sparse.state[t.name]]
            arrays = [sparse.arrays[t.name]] + list(sparse.state[t.name].values())
            for snap in tuple(sparse._snapshots):
                for target in targets:
                    snap.before_write(target, uniq)
            for (block, _), array in zip(_carried(sparse, t), arrays):
                array[uniq] = new[block][:len(uniq)]
            sparse._touched[t.name][uniq] = True


def _local_ids(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct ids of ``flat`` (int64, >= 0) and each position's index among them (shaped as
    ``flat``): one sort of packed ``id << b | position`` keys, as the step path's distinct ids."""
    size = flat.size
    if size == 0:
        return np.zeros(0, np.int64), np.zeros(flat.shape, np.int64)
    bits = max(1, (size - 1).bit_length())
    keys = flat.reshape(-1)
    if int(keys.max()) >> (62 - bits):
        uniq, inv = np.unique(keys, return_inverse=True)
        return uniq, inv.reshape(flat.shape).astype(np.int64)
    packed = (keys << bits) | np.arange(size, dtype=np.int64)
    packed.sort()
    ids = packed >> bits
    first = np.empty(size, bool)
    first[0] = True
    np.not_equal(ids[1:], ids[:-1], out=first[1:])
    inv = np.empty(size, np.int64)
    inv[packed & ((1 << bits) - 1)] = np.cumsum(first) - 1
    return ids[first], inv.reshape(flat.shape)


def _scratch(sparse: Any, t: Any, p: int) -> list[np.ndarray]:
    """``p`` rows of the table and of each state slot as the optimizer starts them (kept per table and size)."""
    cache = sparse.chunk_scratch
    key = (t.name, p)
    if key not in cache:
        rows = np.zeros((p,) + t.shape[1:], sparse.arrays[t.name].dtype)
        state = sparse.optimizer.init_state(rows)
        cache[key] = [rows] + [np.asarray(state[slot], sparse.state[t.name][slot].dtype) for slot in sparse.state[t.name]]
    return cache[key]


def _step_rows(inv: np.ndarray, u: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step (a row of ``inv``: each position's block row): its distinct block rows in order, padded to the
    positions' count with the scratch rows ``u, u+1, ...``, and each position's index among them.  One sort of
    packed ``(step, block row, position)`` keys for all steps."""
    steps, p = inv.shape
    size = steps * p
    bits = max(1, (size - 1).bit_length())
    keys = (np.arange(steps, dtype=np.int64)[:, None] * u + inv).reshape(-1)
    if (steps * max(u, 1)) >> (62 - bits):  # too wide to pack: a stable argsort of the keys
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
    else:
        packed = (keys << bits) | np.arange(size, dtype=np.int64)
        packed.sort()
        order = packed & ((1 << bits) - 1)
        ordered = packed >> bits
    first = np.empty(size, bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    count = np.cumsum(first)  # distinct (step, row) pairs up to each sorted position
    # the sorted keys hold each step's p positions together, in step order: step s at s*p .. s*p + p - 1
    rank = (count.reshape(steps, p) - count[::p, None]).reshape(-1)
    step_inv = np.empty(size, np.int64)
    step_inv[order] = rank
    step_rows = np.broadcast_to(np.arange(u, u + p, dtype=np.int64), (steps, p)).copy()
    where = np.flatnonzero(first)
    step_of = where // p
    step_rows[step_of, rank[where]] = ordered[where] - step_of * u
    return step_rows, step_inv.reshape(steps, p)
