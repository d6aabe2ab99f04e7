"""A lean Scan body for the steps of a hashed linear model (``Y = bias + sum_f table[ids_f]``).

At small batch sizes a chunk's cost is the body's node count (0.2-0.4 us per node and iteration here): the
generic body (:mod:`~streamfit._engine.steps.scan_tables`: the fused step graph, its loss, its gradient graph
and the tables' rows update spliced in) has ~65 nodes.  For the hashed linear models the whole step is small
enough to write by hand, and this module does, with the same update rule:

* the bias is one more row of the carried block, whose columns are the weight and its optimizer state side by
  side (``[rows + 1, 1 + slots]``): one ``Gather`` reads a row's ``F`` id positions and its bias, one
  ``ScatterND`` writes them back;
* a row's prediction is the sum of its gathered weights; a position's gradient is its distinct row's: at one
  row a step ``dl/dy * grad_weight`` times the position's multiplicity (an id twice in the row: twice the
  gradient), at several rows the sum over the step's positions of that row (``ScatterND`` add into a zero per
  block row, then ``Gather``; the bias's: over the step's rows), as the step path's rows update and bias gradient give it -- every copy of
  a row then computes the same new values;
* the optimizer's own update nodes (the emitter of dense weights and of the rows update) run once over the
  positions; a penalty (the standard :class:`~streamfit.penalties.Penalty`) is applied with a
  per-position coefficient, zero where the weight is not penalized (the bias);
* the loss is not computed in the body: the chunk computes every step's loss from the scanned-out predictions
  after the Scan, with the loss's own nodes.

The chunk graph keeps :func:`~streamfit._engine.steps.scan.build_chunk_model`'s inputs and outputs, so the
chunk's host side (blocks, feeds, write back, replay on a non-finite step) is unchanged.  Results equal the
step path's within float rounding: the prediction is one sum (the bias last, not added after the ids' sum),
and onnxruntime's Sqrt is not correctly rounded on 6 values or more (1-4 ulps), so its result depends on
how many rows it is given (the step path's distinct ids, here the positions and the bias).  23 nodes a step
at one row, 27 at several, with FTRL and an L2 penalty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.graph_builder import GraphBuilder, ranked_scalars
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import prune
from streamfit._engine.steps.scan_tables import table_names
from streamfit.penalties import Penalty

__all__ = ["LeanPlan", "lean_plan", "lean_chunk_model"]

_P = "sfl_"  # this module's names


@dataclass(frozen=True)
class LeanPlan:
    """What the lean body needs to know of a hashed linear trainer."""

    table: str
    bias: str
    fields: int
    slots: tuple[str, ...]
    #: per-position L2 and L1 coefficients of the F id positions and of the bias (0: not penalized)
    l2: tuple[float, float]
    l1: tuple[float, float]


def _const_int(pm: Any, name: str) -> list[int] | None:
    for init in pm.model.graph.initializer:
        if init.name == name:
            return [int(v) for v in numpy_helper.to_array(init).ravel()]
    return None


def _row_sum(pm: Any, table: str, ids: str, rows: str) -> str | None:
    """The name of each row's sum of its table rows ([N, 1]) when the model's nodes are ``Gather`` of the table,
    then ``ReduceSum`` over the fields (of [N, F, 1], or of it reshaped [N, F] keeping the axis), then one
    ``Add``; else None."""
    nodes = list(pm.model.graph.node)
    if len(nodes) not in (3, 4) or (nodes[0].op_type, list(nodes[0].input), list(nodes[0].output)) != \
            ("Gather", [table, ids], [rows]):
        return None
    source, keep = rows, 0
    if len(nodes) == 4:
        reshape = nodes[1]
        if reshape.op_type != "Reshape" or reshape.input[0] != rows or _const_int(pm, reshape.input[1]) != [0, -1]:
            return None
        source, keep = reshape.output[0], 1
    reduce = nodes[-2]
    kept = [a.i for a in reduce.attribute if a.name == "keepdims"]
    if reduce.op_type != "ReduceSum" or list(reduce.input[:1]) != [source] or len(reduce.input) != 2 \
            or _const_int(pm, reduce.input[1]) != [1] or kept != [keep]:
        return None
    return str(reduce.output[0])


def lean_plan(tr: Any) -> LeanPlan | None:
    """The plan of ``tr``'s lean body, or None when its model or rules are not the hashed linear ones."""
    sparse, pm = tr.tables, tr.prepared
    if sparse is None or len(sparse.tables) != 1 or sparse.fold or tr.optimizer.shaped:
        return None
    t = sparse.tables[0]
    if len(t.uses) != 1 or len(t.shape) != 2 or t.shape[1] != 1 or pm.buffers or pm.host or pm.train_differs:
        return None
    lin = _row_sum(pm, t.name, t.uses[0].ids, t.uses[0].rows)
    bias = next((w for w in pm.weights if w != t.name), None)
    last = pm.model.graph.node[-1]
    if lin is None or bias is None or last.op_type != "Add" or sorted(last.input) != sorted([bias, lin]) \
            or list(last.output) != [pm.output_name]:
        return None
    if tuple(pm.initial[bias].shape) != (1, 1) or [w for w in pm.weights if w not in (bias, t.name)]:
        return None
    slots = tuple(sparse.state[t.name])
    if list(tr.params.names) != [bias] + [Names.slot(bias, s) for s in slots]:
        return None
    ids = next(i for i in pm.inputs if i.name == t.uses[0].ids)
    if len(ids.shape) != 2 or not isinstance(ids.shape[1], int) or ids.shape[1] < 1:
        return None
    penalty = tr.penalty
    l2, l1 = (0.0, 0.0), (0.0, 0.0)
    if penalty is not None:
        if type(penalty).gradient is not Penalty.gradient or type(penalty).proximal is not Penalty.proximal:
            return None
        on = (t.name in sparse.penalized, bias in pm.penalized)
        l2 = tuple(penalty.l2 if p else 0.0 for p in on)  # type: ignore[assignment]
        l1 = tuple(penalty.l1 if p else 0.0 for p in on)  # type: ignore[assignment]
    return LeanPlan(t.name, bias, int(ids.shape[1]), slots, l2, l1)


def _vi(name: str, elem: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _body(tr: Any, plan: LeanPlan, elem: int, one_row: bool) -> onnx.GraphProto:
    """One step of ``B`` rows: block ``M`` [R, C], positions ``pf`` [B, F+1] (each row's ids, then the bias), their
    ScatterND indices [B, F+1, 1], then (one row) multiplicity times grad weight [1, F+1, 1], or (``B`` rows) the
    grad weights [B, 1]; the targets [B, 1]
    and the optimizer's scalars [1, 1, 1] -> the new block, the predictions [B, 1]."""
    b = GraphBuilder(tr.dtype, prefix=_P + "b_")
    F, C = plan.fields, 1 + len(plan.slots)
    scalars = {s: Names.scalar(s) for s in tr.optimizer.scalar_names}  # [1, 1, 1] each (see ranked_scalars)
    rows = b.op("Gather", "M", "pf", axis=0)  # [B, F + 1, C]
    if C > 1:
        parts = [b.name("col") for _ in range(C)]
        b.nodes.append(helper.make_node("Split", [rows], parts, axis=2, name=b.name("Split")))
    else:
        parts = [rows]
    w, state = parts[0], dict(zip(plan.slots, parts[1:]))
    if one_row:  # [1, 1]: the ids', then the bias (a node less than the reshape below)
        y = b.op("ReduceSum", w, b.const([1], np.int64), keepdims=0, out=_P + "y")
    else:  # [B, 1], summed as the model sums [N, F]
        flat = b.op("Reshape", w, b.const([0, -1], np.int64))
        y = b.op("ReduceSum", flat, b.const([1], np.int64), keepdims=1, out=_P + "y")
    _, dl = tr.loss.terms(b, y, "t")
    if one_row:  # an id twice in the row: twice the gradient
        g = b.op("Mul", dl, "cgw")  # [1, F + 1, 1]
    else:  # each distinct row's gradient: the sum over its positions in the step (the bias': over the rows)
        spread = b.op("Expand", b.op("Mul", dl, "gw"), _P + "pshape")  # [B, F + 1]
        g = b.op("Gather", b.op("ScatterND", _P + "zeros", "pidx", spread, reduction="add"), "pidx", axis=0)
    per_position = lambda pair: b.const(np.array([pair[0]] * F + [pair[1]]).reshape(F + 1, 1))  # noqa: E731
    if any(plan.l2):
        g = b.op("Add", g, b.op("Mul", w, per_position(plan.l2)))
    new, new_state = tr.optimizer.update(b, w, g, state, scalars)
    if any(plan.l1):
        shrunk = b.op("Relu", b.op("Sub", b.op("Abs", new), b.op("Mul", scalars["lr"], per_position(plan.l1))))
        new = b.op("Mul", b.op("Sign", new), shrunk)
    ranked_scalars(b, 0, 3)
    cols = [new] + [new_state[s] for s in plan.slots]
    new_rows = b.op("Concat", *cols, axis=2) if C > 1 else cols[0]
    b.op("ScatterND", "M", "pidx", new_rows, out=_P + "M_new")
    ints = TensorProto.INT64
    B = 1 if one_row else "sfl_B"  # one row: every value's shape known (scan_expose carries them as loop states)
    inputs = [_vi("M", elem, ["sfl_R", C]), _vi("pf", ints, [B, F + 1]), _vi("pidx", ints, [B, F + 1, 1])]
    inputs += [_vi("cgw", elem, [1, F + 1, 1])] if one_row else [_vi("gw", elem, [B, 1])]
    inputs += [_vi("t", elem, [B, 1])] + [_vi(s, elem, [1, 1, 1]) for s in scalars.values()]
    outputs = [_vi(_P + "M_new", elem, ["sfl_R", C]), _vi(_P + "y", elem, [B, 1])]
    graph = helper.make_graph(b.nodes, "streamfit_lean_step", inputs, outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    prune(model)  # the loss terms' per-row loss: computed after the Scan
    return model.graph


def _positions(b: GraphBuilder, tr: Any, plan: LeanPlan, scanned: list[str], block: str, one_row: bool
               ) -> tuple[str, list[str]]:
    """The outer graph's nodes making the Scan's per-step position inputs: (the bias row's index [1], the
    scanned names after the block: ``pf``, ``pidx``, then ``cgw`` or ``gw``)."""
    F = plan.fields
    pos = "sfc_x_" + next(n for n in scanned if n.startswith("sfc_pos_"))  # [S, B, F]: the chunk's local ids
    rows_r = b.op("Shape", block, start=0, end=1)  # [1]: the bias row's index
    bias_col = b.op("Expand", b.op("Reshape", rows_r, b.const([1, 1, 1], np.int64)),
                    b.op("Concat", b.op("Shape", pos, start=0, end=2), b.const([1], np.int64), axis=0))
    pf = b.op("Concat", pos, bias_col, axis=2)  # [S, B, F + 1]
    pidx = b.op("Unsqueeze", pf, b.const([3], np.int64))  # [S, B, F + 1, 1]
    if one_row:
        same = b.op("Equal", pidx, b.op("Unsqueeze", pf, b.const([2], np.int64)))  # [S, 1, F + 1, F + 1]
        mult = b.op("ReduceSum", b.op("Cast", same, to=b.elem), b.const([3], np.int64), keepdims=1)
        gw = b.op("Reshape", "sfc_x_" + Names.grad_weight, b.const([-1, 1, 1, 1], np.int64))
        return rows_r, [pf, pidx, b.op("Mul", mult, gw)]
    # outer-scope values the body reads: the positions' shape [B, F + 1] and a zero per block row (and the bias's)
    b.op("Shape", pf, start=1, end=3, out=_P + "pshape")
    b.op("ConstantOfShape", b.op("Add", rows_r, b.const([1], np.int64)), out=_P + "zeros",
         value=numpy_helper.from_array(np.zeros(1, tr.dtype)))
    return rows_r, [pf, pidx, b.op("Reshape", "sfc_x_" + Names.grad_weight, b.const([0, -1, 1], np.int64))]


def lean_chunk_model(tr: Any, plan: LeanPlan, state: list[str], scanned: list[str], per_step: list[str],
                     one_row: bool = True) -> ModelProto:
    """The chunk graph of :func:`~streamfit._engine.steps.scan.build_chunk_model` (same inputs and outputs for
    these ``state``, ``scanned`` and ``per_step`` names) with the lean body, for steps of one row or of more."""
    b = GraphBuilder(tr.dtype, prefix=_P + "o_")
    elem = b.elem
    X = lambda n: "sfc_x_" + n  # noqa: E731
    IN = lambda n: "sfc_in_" + n  # noqa: E731
    OUT = lambda n: "sfc_out_" + n  # noqa: E731
    blocks, _ = table_names(tr.tables)  # the table's block, then its state blocks
    dense = [plan.bias] + [Names.slot(plan.bias, s) for s in plan.slots]
    # the carried block: weight and state side by side, the bias as its last row
    table_block = b.op("Concat", *[IN(n) for n in blocks], axis=1) if len(blocks) > 1 else IN(blocks[0])
    bias_row = b.op("Concat", *[IN(n) for n in dense], axis=1) if len(dense) > 1 else IN(dense[0])
    M = b.op("Concat", table_block, bias_row, axis=0)
    rows_r, per_position = _positions(b, tr, plan, scanned, IN(blocks[0]), one_row)
    target = b.op("Reshape", X(Names.target), b.const([0, -1, 1], np.int64))  # [S, B, 1]
    sc = [b.op("Reshape", X(n), b.const([-1, 1, 1, 1], np.int64)) for n in per_step]  # [S, 1, 1, 1]
    scan_out = [_P + "M_final", _P + "ys"]
    scan_in = [M] + per_position + [target] + sc
    b.nodes.append(helper.make_node("Scan", scan_in, scan_out, num_scan_inputs=len(scan_in) - 1,
                                    body=_body(tr, plan, elem, one_row), name=_P + "scan"))
    b.op("Identity", scan_out[1], out="sfc_y")  # [S, B, 1]
    # every step's loss, from its predictions (before its update)
    per_row, _ = tr.loss.terms(b, scan_out[1], target)
    lw = b.op("Reshape", X(Names.loss_weight), b.const([0, -1, 1], np.int64))
    b.op("ReduceSum", b.op("Mul", per_row, lw), b.const([1, 2], np.int64), keepdims=0, out="sfc_losses")
    b.op("ReduceSum", scan_out[0], keepdims=0, out="sfc_check")
    # the final block back into the table's blocks and the bias
    table_rows = b.op("Slice", scan_out[0], b.const([0], np.int64), rows_r, b.const([0], np.int64))
    bias_rows = b.op("Slice", scan_out[0], rows_r, b.const([1 << 62], np.int64), b.const([0], np.int64))
    for source, names in ((table_rows, blocks), (bias_rows, dense)):
        if len(blocks) > 1:
            b.nodes.append(helper.make_node("Split", [source], [OUT(n) for n in names], axis=1, name=b.name("Split")))
        else:
            b.op("Identity", source, out=OUT(names[0]))
    inputs = [_vi(IN(n), elem, [1, 1] if n in dense else ["R", 1]) for n in state]
    integer = set(table_names(tr.tables)[1]) | {i.name for i in tr.prepared.inputs if i.dtype.kind in "iu"}
    if tr.loss.integer_labels:
        integer.add(Names.target)
    inputs += [_vi(X(n), TensorProto.INT64 if n in integer else elem, None) for n in scanned + per_step]
    outputs = [_vi(OUT(n), elem, [1, 1] if n in dense else ["R", 1]) for n in state]
    outputs += [_vi("sfc_losses", elem, ["S"]), _vi("sfc_y", elem, None), _vi("sfc_check", elem, [])]
    graph = helper.make_graph(b.nodes, "streamfit_lean_chunk", inputs, outputs, b.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
