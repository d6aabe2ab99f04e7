"""The step graphs: the gradient graphs joined with the loss, the penalty and the optimizer.

The gradient graph (:mod:`~streamfit._engine.gradient`) has a ``YieldOp`` where dL/dY enters.  The
forward/backward strategy runs it through a ``TrainingAgent`` and adds a separate loss graph and update graph.  The fused strategy replaces the ``YieldOp`` with the loss
nodes and appends the update nodes, so forward, loss, backward and update are one session run.
Both use the same loss/penalty/optimizer emitters, hence the same arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from streamfit._engine.common.graph_builder import GraphBuilder, onnx_dtype, ranked_scalars
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import attrs, rename_tensor, toposort
from streamfit._engine.gradient.graphs import GradientGraphs
from streamfit._engine.gradient.rewrites import bias_grads_as_matmul, replace_relu_grad
from streamfit._engine.prepare.model import PreparedModel
from streamfit._engine.prepare.running_stats import emit_running_stats
from streamfit._engine.steps.check_plan import CheckPlan
from streamfit.exceptions import ModelError
from streamfit.losses.base import Loss
from streamfit.optim.base import Optimizer
from streamfit.penalties import Penalty

__all__ = ["build_fused", "build_loss_model", "build_update_model", "emit_updates", "emit_sgd_folded",
           "folds_lr_into_gradients", "sample_weight_shape", "rename_output", "BOUND_MIN_SIZE", "MAX_SEPARATE_SCALARS"]

_OPSET = 17
_IR = 8


def _value_info(name: str, elem: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _label_input(loss: Loss, dtype: np.dtype, y_rank: int) -> onnx.ValueInfoProto:
    if loss.integer_labels:
        return _value_info(Names.target, TensorProto.INT64, ["N"])
    return _value_info(Names.target, onnx_dtype(dtype), ["N"] + [f"d{i}" for i in range(1, y_rank)])


def sample_weight_shape(n: int, y_rank: int) -> tuple[int, ...]:
    """Per-row weights broadcast against per-row losses: (N,) for 1-D outputs, (N, 1) otherwise."""
    return (n,) if y_rank <= 1 else (n, 1)


def rename_output(b: GraphBuilder, old: str, new: str, graph_inputs: set[str]) -> None:
    """Give the node that produces ``old`` the output name ``new`` (Identity when ``old`` is an input)."""
    if old in graph_inputs:
        b.op("Identity", old, out=new)
        return
    rename_tensor(b.nodes, old, new)


def emit_updates(b: GraphBuilder, pm: PreparedModel, grads: list[str], optimizer: Optimizer,
                 penalty: Penalty | None, loss: str | None, graph_inputs: set[str]
                 ) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Append penalty + optimizer nodes for every weight and the finiteness check.

    Returns (new inputs: state slots and scalars, new outputs: updated weights/state and the check).
    """
    elem = onnx_dtype(pm.dtype)
    scalars = {s: Names.scalar(s) for s in optimizer.scalar_names}
    inputs = [_value_info(name, elem, []) for name in scalars.values()]
    outputs: list[onnx.ValueInfoProto] = []
    sums: list[str] = [] if loss is None else [loss]
    for w, g in zip(pm.weights, grads):
        shape = list(pm.initial[w].shape)
        use_penalty = penalty if penalty is not None and w in pm.penalized else None
        if use_penalty is not None:
            g = use_penalty.gradient(b, w, g)
        state = {slot: Names.slot(w, slot) for slot in optimizer.slots}
        slot_shapes = {k: list(v.shape) for k, v in optimizer.init_state(pm.initial[w]).items()}
        inputs += [_value_info(name, elem, slot_shapes[slot]) for slot, name in state.items()]
        w_new, new_state = optimizer.update(b, w, g, state, scalars,
                                            **({"shape": tuple(shape)} if optimizer.shaped else {}))
        if use_penalty is not None:
            w_new = use_penalty.proximal(b, w_new, scalars["lr"])
        produced = {**new_state, "": w_new}
        for slot, value in produced.items():
            target = Names.new(state[slot] if slot else w)
            rename_output(b, value, target, graph_inputs | set(scalars.values()) | set(state.values()))
            outputs.append(_value_info(target, elem, slot_shapes[slot] if slot else shape))
            sums.append(b.op("ReduceSum", target, keepdims=0))
    check = b.op("Sum", *sums, out=Names.check) if len(sums) > 1 else b.op("Identity", sums[0], out=Names.check)
    outputs.append(_value_info(check, elem, []))
    return inputs, outputs


def _row_weight_inputs(dtype: np.dtype, y_rank: int) -> list[onnx.ValueInfoProto]:
    shape: list[Any] = ["N"] if y_rank <= 1 else ["N", 1]
    return [_value_info(Names.loss_weight, onnx_dtype(dtype), shape),
            _value_info(Names.grad_weight, onnx_dtype(dtype), shape)]


def folds_lr_into_gradients(optimizer: Optimizer, penalty: Penalty | None) -> bool:
    """Plain SGD with at most an L2 penalty, as the optimizer and the penalty declare it
    (:meth:`~streamfit.optim.Optimizer.folds_into_gradients`, :meth:`~streamfit.Penalty.folds_into_decay`):
    the fused step backpropagates lr-scaled gradients (the grad weights carry the lr) and its update rides on
    the gradient GEMMs."""
    return optimizer.folds_into_gradients() and (penalty is None or penalty.folds_into_decay())


#: Weights at least this large are checked by a bound in the small-batch graph (a ReduceSum over them
#: costs more than two ReduceSumSquare over the small operands of their gradient).
BOUND_MIN_SIZE = 4096
#: Up to this many check scalars are separate outputs that the step reads (a Sum node costs ~0.4 us).
MAX_SEPARATE_SCALARS = 8


def _scalar_outputs(b: GraphBuilder, terms: list[str], prefix: str, elem: int) -> list[onnx.ValueInfoProto]:
    """Graph outputs ``<prefix><i>`` for the scalars ``terms`` (made by ``b``'s nodes), summed if many."""
    if len(terms) > MAX_SEPARATE_SCALARS:
        terms = [b.op("Sum", *terms)]
    outputs = []
    for i, term in enumerate(terms):
        rename_output(b, term, f"{prefix}{i}", set())
        outputs.append(_value_info(f"{prefix}{i}", elem, []))
    return outputs


def emit_sgd_folded(b: GraphBuilder, graph: onnx.GraphProto, pm: PreparedModel, grads: list[str],
                    penalty: Penalty | None, large_batch: bool, host_checks: bool = False
                    ) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], CheckPlan]:
    """SGD on lr-scaled gradients: ``w_new = decay * w - g``, folded into the Gemm that makes ``g``.

    The backward already yields ``lr * g`` (dL/dY was scaled by lr/N), so a weight whose gradient is a
    plain Gemm becomes ``Gemm(A, B, C=w, alpha=-alpha, beta=1)``: the update costs no extra pass over
    the weights.  At large batches a vector-shaped weight keeps a separate Sub (its folded GEMV is slower).

    The finiteness check reads every new weight once (a ReduceSum), which at small batches costs as much
    as the update of a large weight.  So in the small-batch graph a large folded weight is checked by a
    bound instead: ``|alpha * A @ B|`` is at most ``|alpha| * ||A||_F * ||B||_F``, and the graph outputs
    the sums of squares of the operands (``bound_in0``, ``bound_in1`` outputs).  The step (see
    :class:`~streamfit._engine.steps.fused.FusedStep`) keeps a bound on those weights' magnitude, and checks
    them exactly whenever the bound does not prove them finite.  With ``host_checks`` (CPU, where the
    step can read the new values directly) a single-element weight gets no ReduceSum either: the step
    reads its new value.  Returns the inputs, outputs and what the step must check itself (the
    :class:`~streamfit._engine.steps.check_plan.CheckPlan`: bounded and host-read weights; empty when none).
    """
    elem = onnx_dtype(pm.dtype)
    producers = {out: node for node in graph.node for out in node.output}
    consumers = _use_counts(graph)
    inputs = [_value_info(Names.scalar("lr"), elem, [])]
    outputs, sums = [], []  # the loss is an output of its own, checked by the step
    l2 = penalty is not None and penalty.l2 > 0
    if l2:
        inputs.append(_value_info(Names.decay, elem, []))
    bounded: list[str] = []
    host: list[str] = []
    operands: tuple[dict[str, None], dict[str, None]] = ({}, {})  # ordered sets of the Gemm operands
    alpha_max = 0.0
    for w, g in zip(pm.weights, grads):
        shape = list(pm.initial[w].shape)
        new = Names.new(w)
        base = b.op("Mul", w, Names.decay) if l2 and w in pm.penalized else w
        gemm = producers.get(g)
        foldable = gemm is not None and (gemm.op_type == "Gemm" and len(gemm.input) == 2
                    and consumers.get(g, 0) == 0 and not (large_batch and min(shape or [1]) <= 1))
        alpha = 1.0
        if gemm is not None and foldable:
            alpha = _fold_into_gemm(gemm, base, new)
        else:
            b.op("Sub", base, g, out=new)
        outputs.append(_value_info(new, elem, shape))
        if gemm is not None and foldable and not large_batch and int(np.prod(shape)) >= BOUND_MIN_SIZE:
            bounded.append(w)
            operands[0][gemm.input[0]] = None
            operands[1][gemm.input[1]] = None
            alpha_max = max(alpha_max, abs(alpha))
        elif host_checks and int(np.prod(shape)) == 1:
            host.append(w)
        else:
            sums.append(b.op("ReduceSum", new, keepdims=0))
    outputs += _scalar_outputs(b, sums, Names.check + "_", elem)
    if not bounded:
        return inputs, outputs, CheckPlan(host=tuple(host))
    for names, prefix in zip(operands, (Names.bound_in0, Names.bound_in1)):
        outputs += _scalar_outputs(b, [b.op("ReduceSumSquare", name, keepdims=0) for name in names], prefix, elem)
    return inputs, outputs, CheckPlan(bounded=tuple(bounded), alpha=alpha_max, host=tuple(host))


def _use_counts(graph: onnx.GraphProto) -> dict[str, int]:
    """How many node inputs read each tensor of ``graph``."""
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    return consumers


def _fold_into_gemm(gemm: onnx.NodeProto, base: str, new: str) -> float:
    """Turn the Gemm that makes a weight's lr-scaled gradient into its update, in place:
    ``Gemm(A, B) -> Gemm(A, B, C=base, alpha=-alpha, beta=1)`` writing ``new``; return the Gemm's ``alpha``."""
    found = attrs(gemm)
    alpha = float(found.get("alpha", 1.0))
    gemm.input.append(base)
    del gemm.attribute[:]
    gemm.attribute.extend([helper.make_attribute(k, v) for k, v in found.items() if k not in ("alpha", "beta")])
    gemm.attribute.extend([helper.make_attribute("alpha", -alpha), helper.make_attribute("beta", 1.0)])
    gemm.output[0] = new
    return alpha


def _opsets(model: ModelProto) -> list[onnx.OperatorSetIdProto]:
    versions = {imp.domain: imp.version for imp in model.opset_import}
    versions[""] = max(versions.get("", 0), versions.pop("ai.onnx", 0), 13)
    versions.setdefault("com.microsoft", 1)
    return [helper.make_opsetid(d, v) for d, v in versions.items()]


def build_fused(pm: PreparedModel, graphs: GradientGraphs, loss: Loss, optimizer: Optimizer,
                penalty: Penalty | None, y_rank: int, large_batch: bool = False, host_checks: bool = False
                ) -> ModelProto:
    """One graph: forward, loss and dL/dY (in place of the YieldOp), backward, update and check.

    ``large_batch`` swaps kernels that are slow on big tensors for multi-threaded equivalents (they
    cost more than they save at batch 1, so the engine keeps one graph of each kind).
    """
    grad_model = ModelProto()
    grad_model.CopyFrom(graphs.gradient)
    if large_batch:
        replace_relu_grad(grad_model, pm.dtype)
        bias_grads_as_matmul(grad_model, pm.dtype, graphs.shapes, _batch_dim(pm, graphs.shapes))
    graph = grad_model.graph
    yields = [n for n in graph.node if n.op_type == "YieldOp"]
    if len(yields) != 1:
        raise ModelError(f"expected one YieldOp in the gradient graph, found {len(yields)}")
    yield_node = yields[0]
    y_name, dy_name = yield_node.input[0], yield_node.output[0]
    b = GraphBuilder(pm.dtype, prefix="sf_f_")
    new_inputs = [_label_input(loss, pm.dtype, y_rank)] + _row_weight_inputs(pm.dtype, y_rank)
    fold = folds_lr_into_gradients(optimizer, penalty)
    loss_out, dy = loss.graph(b, y_name, Names.target, Names.loss_weight, Names.grad_weight)
    ranked_scalars(b, 0, y_rank)  # the loss's constants shaped as Y (onnxruntime broadcasts a 0-d one slowly)
    existing = {i.name for i in graph.input}
    rename_output(b, loss_out, Names.loss, existing)
    rename_output(b, dy, dy_name, existing)
    plan = CheckPlan()
    if fold:
        upd_inputs, upd_outputs, plan = emit_sgd_folded(b, graph, pm, graphs.grad_names, penalty, large_batch,
                                                         host_checks)
    else:
        upd_inputs, upd_outputs = emit_updates(b, pm, graphs.grad_names, optimizer, penalty, Names.loss, existing)
    if pm.running_stats:
        produced = {o for n in graph.node for o in n.output}
        missing = [t for s in pm.running_stats for t in (s.batch_mean, s.batch_var, s.centered) if t not in produced]
        if missing:
            raise ModelError(f"the gradient graph lost the batch statistics {missing[:3]} the running statistics need")
        rs_inputs, rs_outputs = emit_running_stats(b, pm.running_stats, Names)
        upd_inputs, upd_outputs = upd_inputs + rs_inputs, upd_outputs + rs_outputs
    position = list(graph.node).index(yield_node)
    nodes = list(graph.node)
    nodes[position:position + 1] = []
    # loss nodes right where the YieldOp was; update nodes after the backward (topological order kept)
    loss_nodes = [n for n in b.nodes]
    del graph.node[:]
    graph.node.extend(nodes[:position] + loss_nodes + nodes[position:])
    graph.initializer.extend(b.initializers)
    graph.input.extend(new_inputs + upd_inputs)
    del graph.output[:]
    y_shape = ["N"] + [f"d{i}" for i in range(1, y_rank)]
    graph.output.extend([_value_info(Names.loss, onnx_dtype(pm.dtype), []), _value_info(y_name, onnx_dtype(pm.dtype), y_shape)]
                        + upd_outputs + [_value_info(g, onnx_dtype(pm.dtype), None) for g in graphs.input_grad_names])
    del grad_model.opset_import[:]
    grad_model.opset_import.extend(_opsets(graphs.gradient))
    grad_model.ir_version = min(grad_model.ir_version or 10, 10)
    plan.attach(grad_model)  # the graph carries what the step that runs it must check itself
    return toposort(grad_model)


def _batch_dim(pm: PreparedModel, shapes: dict[str, list]) -> "int | str | None":
    dims = shapes.get(pm.input_name)
    return dims[0] if dims else None


def build_loss_model(loss: Loss, dtype: np.dtype, y_rank: int) -> ModelProto:
    """The forward/backward strategy's loss graph: (Y, target, loss and grad weights) -> (loss, dL/dY)."""
    b = GraphBuilder(dtype, prefix="sf_l_")
    y = Names.y
    loss_out, dy = loss.graph(b, y, Names.target, Names.loss_weight, Names.grad_weight)
    rename_output(b, loss_out, Names.loss, set())
    rename_output(b, dy, Names.dy, set())
    elem = onnx_dtype(dtype)
    y_shape = ["N"] + [f"d{i}" for i in range(1, y_rank)]
    graph = helper.make_graph(
        b.nodes, "streamfit_loss",
        [_value_info(y, elem, y_shape), _label_input(loss, dtype, y_rank)] + _row_weight_inputs(dtype, y_rank),
        [_value_info(Names.loss, elem, []), _value_info(Names.dy, elem, y_shape)], b.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR)


def build_update_model(pm: PreparedModel, optimizer: Optimizer, penalty: Penalty | None) -> ModelProto:
    """The forward/backward strategy's update graph: (weights, gradients, state, scalars) -> new ones."""
    b = GraphBuilder(pm.dtype, prefix="sf_u_")
    elem = onnx_dtype(pm.dtype)
    grads = [Names.grad(w) for w in pm.weights]
    base_inputs = []
    for w, g in zip(pm.weights, grads):
        shape = list(pm.initial[w].shape)
        base_inputs += [_value_info(w, elem, shape), _value_info(g, elem, shape)]
    names = {vi.name for vi in base_inputs}
    inputs, outputs = emit_updates(b, pm, grads, optimizer, penalty, None, names)
    graph = helper.make_graph(b.nodes, "streamfit_update", base_inputs + inputs, outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR)
    return toposort(model)
