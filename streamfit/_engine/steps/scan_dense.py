"""A lean one-row step for a ready-made linear model: the body of its chunks at ``batch_size=1``.

A node in a Scan body costs a fraction of a microsecond per row whatever it computes, so the per-row chunk of a
linear model is as fast as its body is short.  The generic body (the fused step graph with one parameter
vector, :mod:`~streamfit._engine.steps.scan_flat`) spends nodes on slicing the vector into weights, on the
bias's separate gradient and on the concatenation of the gradients; this one carries ``theta = [coef; intercept]``
as a column and appends a 1 to each row, so that

- the score is one product ``[x, 1] @ theta`` and the loss gradient one Gemm (``p * gw - y * gw``, the second
  term computed before the loop);
- SGD's update is one Gemm (``theta - [x, 1]^T e``, the rate folded into the row weights);
- Adam's gradient takes its L2 term in the same Gemm (``+ theta * l2`` on the coefficients only), and each
  moment's update is one Gemm (``alpha * g + beta * m``); the step itself is Adam's own (``Adam._step``).

The logistic body is 5 nodes with SGD and 15 with Adam (the generic ones: 7 and 25 once onnxruntime has fused
them).  It rounds differently from the step path: a Gemm adds its two products with one rounding where the step
graph rounds each, and the bias's gradient is summed with the coefficients'.  So a chunk equals one step per call
within float32 rounding (``rtol=1e-6``, tested), not bit for bit as the generic body does.

Used for ready-made linear models only (``MatMul`` + ``Add`` after the running standardization, one output), with
a binary log loss or a squared error, plain SGD without a penalty or Adam with none or an L2 one, one row a
step, float32, dense inputs; anything else keeps the generic body.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import toposort
from streamfit._engine.steps.scan_flat import THETA, FlatLayout
from streamfit._engine.steps.step_graphs import _label_input, _opsets, _row_weight_inputs, rename_output

__all__ = ["dense_step_graph"]

#: the losses whose gradient with respect to the score is ``(f(score) - target) * grad_weight``: f per loss
_LOSSES = {"BinaryLogLoss": "Sigmoid", "SquaredError": None}


def _linear(pm: Any) -> tuple[str, str, str, bool] | None:
    """(input, coef, intercept, standardized?) of a ``[standardize ->] MatMul -> Add`` model of one output."""
    nodes = list(pm.model.graph.node)
    ops = [n.op_type for n in nodes]
    std = ops[:2] == ["Sub", "Div"]
    if std:
        sub, div = nodes[0], nodes[1]
        if (list(sub.input) != [pm.input_name, Names.scaler_mean] or div.input[0] != sub.output[0]
                or div.input[1] != Names.scaler_scale):
            return None
        nodes = nodes[2:]
    if [n.op_type for n in nodes] != ["MatMul", "Add"]:
        return None
    mm, add = nodes
    x = div.output[0] if std else pm.input_name
    if mm.input[0] != x or add.input[0] != mm.output[0] or add.output[0] != pm.output_name:
        return None
    coef, intercept = mm.input[1], add.input[1]
    if sorted(pm.weights) != sorted([coef, intercept]):
        return None
    c, b = pm.initial[coef].shape, pm.initial[intercept].shape
    if len(c) != 2 or c[1] != 1 or b != (1,):
        return None
    return pm.input_name, coef, intercept, std


def _rule(tr: Any) -> str | None:
    """"sgd" or "adam" when the trainer's optimizer and penalty are those this step writes, else None."""
    from streamfit.optim import SGD, Adam

    opt, penalty = tr.optimizer, tr.penalty
    if type(opt) is SGD and penalty is None and tr._lr_in_grad_weights:  # momentum is another class
        return "sgd"
    if type(opt) is Adam and not tr._lr_in_grad_weights and (penalty is None or penalty.l1 == 0):
        return "adam"
    return None


def dense_step_graph(tr: Any) -> tuple[ModelProto, FlatLayout] | None:
    """The lean one-row step of ``tr`` (see the module docstring), or None where it does not apply."""
    pm = tr._train_pm
    if (tr.tables is not None or pm.running_stats or tr.prepared.train_differs or pm.dtype != np.float32
            or type(tr.loss).__name__ not in _LOSSES or tuple(tr._y_tail or ()) != (1,) or tr._summed_gradient):
        return None
    linear, rule = _linear(pm), _rule(tr)
    if linear is None or rule is None:
        return None
    x_name, coef, intercept, std = linear
    d = int(pm.initial[coef].shape[0])
    size = d + 1
    slots = tuple(tr.optimizer.slots) if rule == "adam" else ()
    layout = FlatLayout((coef, intercept), (0, d), ((d, 1), (1,)), slots, size, column=True)
    b = GraphBuilder(pm.dtype, prefix="sfc_d_")
    f32 = TensorProto.FLOAT
    x = x_name
    if std:
        x = b.op("Div", b.op("Sub", x_name, Names.scaler_mean), Names.scaler_scale)
    xa = b.op("Concat", x, b.const(np.ones((1, 1), np.float32)), axis=1)
    y = pm.output_name
    b.nodes.append(helper.make_node("MatMul", [xa, THETA], [y]))
    f = _LOSSES[type(tr.loss).__name__]
    score = b.op(f, y) if f else y
    neg_yg = b.op("Neg", b.op("Mul", Names.target, Names.grad_weight))  # before the loop: no state in it
    e = b.op("Gemm", score, Names.grad_weight, neg_yg)  # (f(score) - y) * gw
    loss_out, _ = tr.loss.graph(b, y, Names.target, Names.loss_weight, Names.grad_weight)
    outputs = [helper.make_tensor_value_info(Names.loss, f32, []), helper.make_tensor_value_info(y, f32, [1, 1])]
    new = {}
    if rule == "sgd":
        new[THETA] = b.op("Gemm", xa, e, THETA, transA=1, alpha=-1.0, beta=1.0)
    else:
        opt, penalty = tr.optimizer, tr.penalty
        if penalty is not None and penalty.l2 != 0:
            mask = np.zeros((size, 1), np.float32)
            if coef in pm.penalized:
                mask[:d] = penalty.l2
            if intercept in pm.penalized:
                mask[d] = penalty.l2
            g = b.op("Gemm", xa, e, b.op("Mul", THETA, b.const(mask)), transA=1)
        else:
            g = b.op("Gemm", xa, e, transA=1)
        one = b.const(np.ones((1, 1), np.float32))
        m_in, v_in = (Names.slot(THETA, s) for s in opt.slots)
        m = b.op("Gemm", g, one, m_in, alpha=1.0 - opt.beta1, beta=opt.beta1)
        v = b.op("Gemm", b.op("Mul", g, g), one, v_in, alpha=1.0 - opt.beta2, beta=opt.beta2)
        new[THETA] = opt._step(b, THETA, m, v, {s: Names.scalar(s) for s in ("step_size", "inv_sqrt_bc2")})
        new[m_in], new[v_in] = m, v
    existing = {x_name, THETA, Names.target, Names.loss_weight, Names.grad_weight}
    rename_output(b, loss_out, Names.loss, existing)
    for name, value in new.items():
        rename_output(b, value, Names.new(name), existing)
        outputs.append(helper.make_tensor_value_info(Names.new(name), f32, [size, 1]))
    inputs = [helper.make_tensor_value_info(x_name, f32, [1, d])]
    if std:
        inputs += [helper.make_tensor_value_info(n, f32, [d]) for n in (Names.scaler_mean, Names.scaler_scale)]
    inputs += [helper.make_tensor_value_info(n, f32, [size, 1]) for n in layout.state_names()]
    inputs += [_label_input(tr.loss, pm.dtype, 2)] + _row_weight_inputs(pm.dtype, 2)
    if rule == "adam":
        inputs += [helper.make_tensor_value_info(Names.scalar(s), f32, []) for s in ("step_size", "inv_sqrt_bc2")]
    graph = helper.make_graph(list(b.nodes), "streamfit_dense_step", inputs, outputs,
                              initializer=list(b.initializers))
    model = helper.make_model(graph, opset_imports=_opsets(pm.model), ir_version=min(pm.model.ir_version or 10, 10))
    return toposort(model), layout
