"""Row-sparse tables in a chunk of steps: the chunk's distinct rows as one small block the Scan carries.

A table of a million rows cannot be loop state (a Scan copies its state every iteration).  So the host
gathers the rows the chunk's ids touch (and their optimizer state) once into a block of ``U`` rows, and the step
body works on the block:

* the rows of the step's id positions are ``Gather(block, local ids)`` (what the step path copies on the host);
* after the fused step, the rows update graph of :mod:`~streamfit._engine.steps.sparse_tables` (the same nodes
  the step path runs) updates the whole block from the positions' gradients (``ScatterND`` adds them per row);
* a per-step mask of the rows this step touched keeps every other row (and its state) as it was
  (``Where``), so untouched rows follow the step path's lazy rules exactly (Adam's moments do not decay,
  penalties apply to touched rows only).

After a finite chunk the block and its state are written back into the tables once, with the touched-rows
and copy-on-write snapshot bookkeeping of the step path.
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
    return Names.table(table, "rows")


def _pos(table: str, use: int) -> str:
    return f"sfc_pos_{table}_{use}"


def _mask(table: str) -> str:
    return f"sfc_mask_{table}"


def table_names(sparse: Any) -> tuple[list[str], list[str]]:
    """(the carried names: each table's block and its state blocks; the scanned names: each use's local ids,
    each table's flat local ids (``<table>__inv``) and its touched-rows mask)."""
    state, scanned = [], []
    for t in sparse.tables:
        w = _block(t.name)
        state += [w] + [Names.slot(w, slot) for slot in sparse.state[t.name]]
        scanned += [_pos(t.name, j) for j in range(len(t.uses))] + [Names.table(t.name, "inv"), _mask(t.name)]
    return state, scanned


def with_tables(step: ModelProto, sparse: Any) -> ModelProto:
    """``step`` (a fused step graph whose table rows are inputs) with the tables' block update in it: inputs
    gain the blocks, their state, the local ids and masks (:func:`table_names`); outputs the new blocks."""
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
    have = {i.name for i in graph.input}
    front: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    for t, grads in zip(sparse.tables, sparse.grad_names):
        w = _block(t.name)
        for j, use in enumerate(t.uses):
            front.append(helper.make_node("Gather", [w, _pos(t.name, j)], [use.rows], axis=0,
                                          name=f"sfc_gather_{t.name}_{j}"))
            graph.input.append(helper.make_tensor_value_info(_pos(t.name, j), onnx.TensorProto.INT64, None))
            rename[Names.table(t.name, f"grad{j}")] = grads[j]
        graph.input.append(rows_inputs[Names.table(t.name, "inv")])
        graph.input.append(helper.make_tensor_value_info(_mask(t.name), onnx.TensorProto.BOOL, None))
        for name in [w] + [Names.slot(w, slot) for slot in sparse.state[t.name]]:
            graph.input.append(rows_inputs[name])
    for name, vi in rows_inputs.items():  # the optimizer scalars the rows update reads and the step may not
        if name not in have and name not in rename and not any(i.name == name for i in graph.input):
            graph.input.append(vi)
    rows_outputs = {o.name for o in rows_model.graph.output}
    keep_names = set(rows_inputs) - set(rename)

    def local(name: str) -> str:
        if not name or name in keep_names:
            return name
        return rename.get(name, _PREFIX + name)

    back: list[onnx.NodeProto] = []
    for init in rows_model.graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = local(init.name)
        graph.initializer.append(copy)
    for node in rows_model.graph.node:
        copy_node = onnx.NodeProto()
        copy_node.CopyFrom(node)
        copy_node.input[:] = [local(n) for n in node.input]
        copy_node.output[:] = [local(n) for n in node.output]
        copy_node.name = _PREFIX + (node.name or f"n{len(back)}")
        back.append(copy_node)
    masks: dict[tuple[str, int], str] = {}
    for t in sparse.tables:
        w = _block(t.name)
        named = [(w, len(t.shape))] + [(Names.slot(w, slot), arr.ndim) for slot, arr in sparse.state[t.name].items()]
        for name, rank in named:
            new = Names.new(name)
            assert new in rows_outputs
            key = (t.name, rank)
            if key not in masks:
                if rank == 1:
                    masks[key] = _mask(t.name)
                else:
                    axes = f"sfc_axes_{rank}"
                    if not any(i.name == axes for i in graph.initializer):
                        graph.initializer.append(onnx.numpy_helper.from_array(np.arange(1, rank, dtype=np.int64), axes))
                    masks[key] = f"sfc_mask_{t.name}_r{rank}"
                    back.append(helper.make_node("Unsqueeze", [_mask(t.name), axes], [masks[key]]))
            back.append(helper.make_node("Where", [masks[key], local(new), name], [new], name=f"sfc_keep_{name}"))
            graph.output.append(helper.make_tensor_value_info(new, elem, None))
    nodes = front + list(graph.node) + back
    del graph.node[:]
    graph.node.extend(nodes)
    versions = {o.domain: o.version for o in model.opset_import}
    versions[""] = max(versions.get("", 0), 16)  # ScatterND with reduction
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in versions.items())
    return model


@dataclass
class TableBlocks:
    """One chunk's blocks: per table the distinct rows its ids touch, the block of those rows and their state,
    and the Scan's per-step inputs (local ids per use, flat local ids, the touched mask)."""

    uniq: list[np.ndarray]
    carried: dict[str, np.ndarray]
    scanned: dict[str, np.ndarray]

    @classmethod
    def gather(cls, sparse: Any, arrays: tuple[np.ndarray, ...], steps: int, batch_size: int) -> "TableBlocks":
        """The blocks of the first ``steps * batch_size`` rows of the model inputs ``arrays``; raises the step
        path's :class:`~streamfit.exceptions.BadInputError` for an id outside its table."""
        m = steps * batch_size
        uniqs: list[np.ndarray] = []
        carried: dict[str, np.ndarray] = {}
        scanned: dict[str, np.ndarray] = {}
        for t, slots in zip(sparse.tables, sparse._slots):
            rows = t.shape[0]
            parts = []
            for i, ids_name in slots:
                ids = np.asarray(arrays[i][:m])
                if ids.size and (int(ids.min()) < -rows or int(ids.max()) >= rows):
                    _out_of_range(ids, rows, ids_name, t.name)
                ids = ids.astype(np.int64).reshape(steps, -1)
                parts.append(np.where(ids < 0, ids + rows, ids))
            flat = np.concatenate(parts, axis=1)  # [steps, positions]: the uses in order, as the step path
            uniq, inv = np.unique(flat, return_inverse=True)
            inv = inv.reshape(flat.shape).astype(np.int64)
            uniqs.append(uniq)
            w = _block(t.name)
            carried[w] = np.ascontiguousarray(sparse.arrays[t.name][uniq])
            for slot, arr in sparse.state[t.name].items():
                carried[Names.slot(w, slot)] = np.ascontiguousarray(arr[uniq])
            at = 0
            for j, (i, _) in enumerate(slots):
                width = parts[j].shape[1]
                scanned[_pos(t.name, j)] = np.ascontiguousarray(inv[:, at:at + width]).reshape(
                    (steps, batch_size) + arrays[i].shape[1:])
                at += width
            scanned[Names.table(t.name, "inv")] = inv
            mask = np.zeros((steps, len(uniq)), np.bool_)
            np.put_along_axis(mask, inv, True, axis=1)
            scanned[_mask(t.name)] = mask
        return cls(uniqs, carried, scanned)

    def write_back(self, sparse: Any, new: dict[str, np.ndarray]) -> None:
        """The chunk's final blocks (by block name) into the tables and their state, as the step path writes a
        step's rows (snapshots saved aside first, rows marked touched)."""
        for t, uniq in zip(sparse.tables, self.uniq):
            w = _block(t.name)
            items = [(w, t.name)] + [(Names.slot(w, slot), Names.slot(t.name, slot)) for slot in sparse.state[t.name]]
            for snap in tuple(sparse._snapshots):
                for _, target in items:
                    snap.before_write(target, uniq)
            sparse.arrays[t.name][uniq] = new[w]
            for slot, arr in sparse.state[t.name].items():
                arr[uniq] = new[Names.slot(w, slot)]
            sparse._touched[t.name][uniq] = True
