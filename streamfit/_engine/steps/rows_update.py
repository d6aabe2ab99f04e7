"""The rows update graph of the tables trained row-sparsely: the positions' gradients summed per distinct id
(``ScatterND``, ``reduction="add"``) and the optimizer's update nodes (the dense weights' emitter) applied to the
block of touched rows and its state, with a finiteness check (see :mod:`streamfit._engine.steps.sparse_tables`)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from streamfit._engine.common.graph_builder import GraphBuilder, ranked_scalars
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import toposort
from streamfit._engine.steps.step_graphs import rename_output
from streamfit._engine.steps.tables import SparseTable
from streamfit.optim.base import Optimizer
from streamfit.penalties import Penalty

__all__ = ["rows_update_model"]


def _update(b: GraphBuilder, t: SparseTable, w: str, g: str, slots: Mapping[str, str], scalars: Mapping[str, str],
            optimizer: Optimizer, penalty: Penalty | None, fold: bool, factor: str | None) -> dict[str, str]:
    """The nodes of one table's update: its new rows (key ``""``) and new state by slot.  ``penalty``: when it
    applies to the table; ``factor``: the folded SGD step's decay factor, when it applies."""
    if fold:
        return {"": b.op("Sub", w if factor is None else b.op("Mul", w, factor), g)}
    if penalty is not None:
        g = penalty.gradient(b, w, g)
    kw = {"shape": (-1, *t.shape[1:])} if optimizer.shaped else {}
    new, new_state = optimizer.update(b, w, g, slots, scalars, **kw)
    if penalty is not None:
        new = penalty.proximal(b, new, scalars["lr"])
    return {**new_state, "": new}


def rows_update_model(tables: tuple[SparseTable, ...], state: Mapping[str, Mapping[str, np.ndarray]],
                      dtype: np.dtype, optimizer: Optimizer, penalty: Penalty | None, penalized: "set[str]", *,
                      fold: bool, decay: bool) -> onnx.ModelProto:
    """The rows update graph: per table, ``(block, its state, inv, gradients of the positions) -> (new block,
    new state)``, and ``sf_check`` (finite iff all new values are).

    ``state``: each table's optimizer state arrays by slot; ``penalized``: the tables the penalty applies to.
    ``fold``: plain SGD on lr-scaled gradients (the fused SGD step's), ``decay`` its L2 factor input."""
    b = GraphBuilder(dtype, prefix="sf_r_")
    elem = b.elem
    inputs = [helper.make_tensor_value_info(Names.scalar(s), elem, []) for s in optimizer.scalar_names]
    if fold and decay:
        inputs.append(helper.make_tensor_value_info(Names.decay, elem, []))
    outputs, sums = [], []
    for t in tables:
        w, inv, k = Names.table(t.name, "rows"), Names.table(t.name, "inv"), f"k_{t.name}"
        tail = list(t.shape[1:])
        first = len(b.nodes)
        # the scalars shaped as the rows (see ranked_scalars)
        rank = 1 + len(tail) if tail and not optimizer.shaped and all(
            v.ndim == 1 + len(tail) for v in state[t.name].values()) else 1
        ones = b.const([1] * rank, np.int64)
        scalars = {s: b.op("Reshape", Names.scalar(s), ones) if rank > 1 else Names.scalar(s)
                   for s in optimizer.scalar_names}
        slots = {slot: Names.slot(w, slot) for slot in state[t.name]}
        shapes = {slot: [k, *v.shape[1:]] for slot, v in state[t.name].items()}
        inputs += [helper.make_tensor_value_info(w, elem, [k, *tail]),
                   helper.make_tensor_value_info(inv, onnx.TensorProto.INT64, [k])]
        inputs += [helper.make_tensor_value_info(slots[slot], elem, shapes[slot]) for slot in slots]
        grads = []
        for j, _ in enumerate(t.uses):
            g_in = Names.table(t.name, f"grad{j}")
            inputs.append(helper.make_tensor_value_info(g_in, elem, None))
            grads.append(b.op("Reshape", g_in, b.const([-1, *tail], np.int64)))
        g_pos = grads[0] if len(grads) == 1 else b.op("Concat", *grads, axis=0)
        zeros = b.op("ConstantOfShape", b.op("Shape", w), value=numpy_helper.from_array(np.zeros(1, dtype)))
        g = b.op("ScatterND", zeros, b.op("Unsqueeze", inv, b.const([1], np.int64)), g_pos, reduction="add")
        table_penalized = penalty is not None and t.name in penalized
        factor = None
        if fold and decay and table_penalized:
            factor = b.op("Reshape", Names.decay, ones) if rank > 1 else Names.decay
        produced = _update(b, t, w, g, slots, scalars, optimizer, penalty if table_penalized else None, fold, factor)
        ranked_scalars(b, first, rank)
        for slot, value in produced.items():
            target = Names.new(slots[slot] if slot else w)
            rename_output(b, value, target, {w, *slots.values(), *scalars.values()})
            outputs.append(helper.make_tensor_value_info(target, elem, shapes[slot] if slot else [k, *tail]))
            sums.append(b.op("ReduceSum", target, keepdims=0))
    check = b.op("Sum", *sums, out=Names.check) if len(sums) > 1 else b.op("Identity", sums[0], out=Names.check)
    outputs.append(helper.make_tensor_value_info(check, elem, []))
    graph = helper.make_graph(b.nodes, "streamfit_rows_update", inputs, outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return toposort(model)
