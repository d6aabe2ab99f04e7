"""One parameter vector in a chunk's step body: the optimizer's update emitted once for all weights.

A step's cost in a Scan is its node count, and an elementwise optimizer (Adam: about eleven nodes per weight)
emits its update once per weight tensor.  Here the body carries one vector ``theta`` (the weights, flattened and
concatenated) and its optimizer slots; the layers read their weights as slices of it, the weights' gradients are
flattened and concatenated, and the update is emitted once, over the vector.  Every element goes through the
same operations as in the per-weight graph (the rule is elementwise, its scalars shared), so the result is the
same.  Used where that holds: an elementwise rule (not ``shaped``), no learning-rate fold into the gradient
GEMMs (plain SGD keeps its folded update), a penalty on all weights or none (or on some, when it only adds to
their gradients: its term is added to those before the concatenation), dense weights only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from onnx import ModelProto, helper

from streamfit._engine.common.graph_builder import GraphBuilder, onnx_dtype
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import toposort
from streamfit._engine.prepare.running_stats import emit_running_stats
from streamfit.penalties import Penalty
from streamfit._engine.steps.step_graphs import (_label_input, _opsets, _row_weight_inputs, emit_updates,
                                                 folds_lr_into_gradients, rename_output)

__all__ = ["FlatLayout", "flat_step_graph", "THETA"]

THETA = "sfc_theta"


@dataclass(frozen=True)
class FlatLayout:
    """Where each weight lives in ``theta``: its name, offset and shape; and the optimizer's slot names."""

    weights: tuple[str, ...]
    offsets: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    slots: tuple[str, ...]
    size: int
    #: the vectors are columns ``[size, 1]`` (the lean linear step's, steps/scan_dense.py), else 1-D
    column: bool = False
    #: the vectors are rows ``[1, size]`` (the lean MLP step's, steps/scan_mlp.py)
    row: bool = False

    @classmethod
    def of(cls, weights: tuple[str, ...], shapes: tuple[tuple[int, ...], ...], slots: tuple[str, ...],
           **orientation: bool) -> "FlatLayout":
        """The layout of ``weights`` (of ``shapes``) end to end, in their order (``column=True``/``row=True``: the
        vectors' orientation)."""
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]]))
        return cls(weights, offsets, shapes, slots, int(sum(sizes)), **orientation)

    def state_names(self) -> list[str]:
        return [THETA] + [Names.slot(THETA, s) for s in self.slots]

    def pack(self, values: dict[str, np.ndarray], dtype: Any) -> dict[str, np.ndarray]:
        """``theta`` and its slots from the per-weight arrays (``values[w]``, ``values[w__slot]``)."""
        out = {}
        for name, suffix in [(THETA, "")] + [(Names.slot(THETA, s), s) for s in self.slots]:
            parts = [values[w if not suffix else Names.slot(w, suffix)].reshape(-1) for w in self.weights]
            vec = np.concatenate(parts).astype(dtype, copy=False)
            out[name] = vec.reshape(-1, 1) if self.column else vec.reshape(1, -1) if self.row else vec
        return out

    def unpack(self, flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The per-weight arrays (weights and their slots) of ``theta`` and its slots."""
        out = {}
        for name, suffix in [(THETA, "")] + [(Names.slot(THETA, s), s) for s in self.slots]:
            vec = flat[name].reshape(-1)
            for w, at, shape in zip(self.weights, self.offsets, self.shapes):
                size = int(np.prod(shape, dtype=np.int64))
                out[w if not suffix else Names.slot(w, suffix)] = vec[at:at + size].reshape(shape)
        return out


def _no_proximal(penalty: Any) -> bool:
    """The penalty only adds to the gradient (its proximal step is the identity): no L1 part, as defined."""
    return bool(penalty.l1 == 0 and type(penalty).proximal is Penalty.proximal)


def _theta_gradient(b: GraphBuilder, grads: list[str], weights: list[str], shapes: tuple[tuple[int, ...], ...],
                    penalty: Any, penalized: frozenset[str]) -> str:
    """The weights' gradients as one vector (``penalty``: its gradient term added to the penalized ones first)."""
    if penalty is not None:
        grads = [penalty.gradient(b, w, g) if w in penalized else g for w, g in zip(weights, grads)]
    minus_one = b.const(np.array([-1], np.int64), np.int64)
    # a gradient is shaped as its weight: a 1-D one (a bias) is concatenated as it is
    flat = [g if len(shape) == 1 else b.op("Reshape", g, minus_one) for g, shape in zip(grads, shapes)]
    return b.op("Concat", *flat, axis=0)


def flat_step_graph(tr: Any) -> tuple[ModelProto, FlatLayout] | None:
    """The small-batch fused step graph of ``tr`` with one parameter vector, or None where it does not apply."""
    pm, graphs, opt, penalty = tr._train_pm, tr.graphs, tr.optimizer, tr.penalty
    weights = list(pm.weights)
    partial = penalty is not None and bool(set(weights) - set(pm.penalized))
    if (graphs is None or tr.tables is not None or opt.shaped or not opt.slots and len(weights) < 2
            or folds_lr_into_gradients(opt, penalty) or len(weights) < 2
            or partial and not _no_proximal(penalty)):
        return None
    shapes = tuple(tuple(int(d) for d in pm.initial[w].shape) for w in weights)
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    layout = FlatLayout.of(tuple(weights), shapes, tuple(opt.slots))
    flat0 = np.concatenate([pm.initial[w].reshape(-1) for w in weights])
    if any(k not in opt.slots or v.shape != flat0.shape for k, v in opt.init_state(flat0).items()):
        return None  # state not elementwise per weight element
    model = ModelProto()
    model.CopyFrom(graphs.gradient)
    graph = model.graph
    yields = [n for n in graph.node if n.op_type == "YieldOp"]
    if len(yields) != 1:
        return None
    y_name, dy_name = yields[0].input[0], yields[0].output[0]
    elem = onnx_dtype(pm.dtype)
    b = GraphBuilder(pm.dtype, prefix="sfc_f_")
    existing = {i.name for i in graph.input}
    loss_out, dy = tr.loss.graph(b, y_name, Names.target, Names.loss_weight, Names.grad_weight)
    rename_output(b, loss_out, Names.loss, existing)
    rename_output(b, dy, dy_name, existing)
    theta_grad = _theta_gradient(b, list(graphs.grad_names), weights, shapes, penalty if partial else None,
                                 pm.penalized)
    flat_pm = replace(pm, weights=[THETA], initial={THETA: flat0},
                      penalized=frozenset({THETA}) if penalty is not None and not partial else frozenset())
    upd_inputs, upd_outputs = emit_updates(b, flat_pm, [theta_grad], opt, None if partial else penalty, None,
                                           existing | {THETA})
    # the weights as pieces of theta: one Split (a node costs per step what it costs, whatever it copies),
    # and a Reshape for each weight of more than one dimension
    pieces = [f"sfc_slice_{w}" if len(shape) != 1 else w for w, shape in zip(weights, shapes)]
    front = [helper.make_node("Split", [THETA, b.const(np.array(sizes, np.int64), np.int64)], pieces, axis=0)]
    for w, piece, shape in zip(weights, pieces, shapes):
        if len(shape) != 1:
            front.append(helper.make_node("Reshape", [piece, b.const(np.array(shape, np.int64), np.int64)], [w]))
    if pm.running_stats:
        rs_inputs, rs_outputs = emit_running_stats(b, pm.running_stats, Names)
        upd_inputs, upd_outputs = upd_inputs + rs_inputs, upd_outputs + rs_outputs
    position = list(graph.node).index(yields[0])
    nodes = list(graph.node)
    del nodes[position]
    del graph.node[:]
    graph.node.extend(front + nodes[:position] + list(b.nodes) + nodes[position:])
    graph.initializer.extend(b.initializers)
    kept = [i for i in graph.input if i.name not in set(weights)]
    del graph.input[:]
    graph.input.extend(kept + [helper.make_tensor_value_info(THETA, elem, [layout.size])]
                       + [_label_input(tr.loss, pm.dtype, len(tr._y_tail or ()) + 1)]
                       + _row_weight_inputs(pm.dtype, len(tr._y_tail or ()) + 1) + upd_inputs)
    del graph.output[:]
    y_shape = ["N"] + [f"d{i}" for i in range(1, len(tr._y_tail or ()) + 1)]
    graph.output.extend([helper.make_tensor_value_info(Names.loss, elem, []),
                         helper.make_tensor_value_info(y_name, elem, y_shape)]
                        + [o for o in upd_outputs if o.name != Names.check])
    del model.opset_import[:]
    model.opset_import.extend(_opsets(graphs.gradient))
    model.ir_version = min(model.ir_version or 10, 10)
    return toposort(model), layout

