"""A lean step for a ready-made multi-layer perceptron: the body of its chunks of small steps.

The generic body of an MLP (:mod:`~streamfit._engine.steps.scan_flat`: the gradient builder's graph, the loss's
nodes, one parameter vector) is 37 nodes for one hidden layer, at 0.2-0.5 us a node and iteration whatever it
computes.  For the ready-made MLPs the step is small enough to write by hand, with the same update rule:

- the parameters are one **row** ``theta = [1, size]`` (the weights flattened in the model's order) and so are
  Adam's moments: onnxruntime broadcasts a scalar over a ``[1, n]`` row in one vectorized pass, and over a
  ``[n, 1]`` column element by element (11 us against 1.3 us for a ``Mul`` of 1101 values here);
- a layer is one Gemm (``h @ W + b``), the output layer one Gemm against its weight row (``h @ w^T + b``); a
  weight's gradient is one Gemm with its L2 term as ``C``; a bias's gradient is its layer's error (summed over the
  rows by a ReduceSum when a step has several, as the step graph sums it); the activation's gradient is in
  standard ops (:mod:`~streamfit._engine.gradient.activations`: relu's mask one multi-threaded ``HardSigmoid``,
  where onnxruntime's ``ReluGrad`` kernel is single-threaded);
- at one row a step the loss gradient is one Gemm (``f(score) * gw - y * gw``, the second term computed before
  the loop); at several, a difference and a product, as the step graph rounds it;
- Adam's moments are one Gemm each (``alpha * g + beta * m``), its bias corrections folded into the step's rate
  and epsilon before the loop, as in :mod:`~streamfit._engine.steps.scan_dense`.

One hidden layer of 100 relu units on 9 features: 23 nodes at one row a step and 26 at several, against the
generic 37.  A Gemm rounds its two products once where the step graph rounds each, so a chunk equals one step per
call within float32 rounding, not bit for bit: Adam's normalized step lets the difference wander (largest weight
difference 2.4e-7 after 90 one-row steps, 1.4e-6 after 3000, on a 4-16-8-1 relu/tanh regressor with L2; tested
at 5e-6).

Used for dense ``[standardize ->] (MatMul -> Add -> activation)* -> MatMul -> Add`` models of one output with
relu, tanh, logistic or no activation, a binary log loss or a squared error, Adam with no penalty or an L2 one,
float32, on CPU, at fewer rows a step than the large-batch graph's; anything else keeps the generic body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import toposort
from streamfit._engine.gradient.activations import relu_grad, sigmoid_grad, tanh_grad
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan_dense import _LOSSES, adam_scalar_inputs, adam_update, lean_applies
from streamfit._engine.steps.scan_flat import THETA, FlatLayout
from streamfit._engine.steps.step_graphs import (_label_input, _opsets, _row_weight_inputs, folds_lr_into_gradients,
                                                 rename_output)

__all__ = ["MLPPlan", "mlp_plan", "mlp_step_graph"]

_ACTIVATIONS = ("Relu", "Tanh", "Sigmoid")


@dataclass(frozen=True)
class Layer:
    """One layer of the perceptron: its weight and bias (graph names), and the activation after it (None: none)."""

    coef: str
    intercept: str
    activation: str | None


@dataclass(frozen=True)
class MLPPlan:
    """What the lean step of an MLP reads: its input, whether it standardizes it, its layers, the layout."""

    x: str
    standardized: bool
    layers: tuple[Layer, ...]
    layout: FlatLayout


def _layers(pm: Any) -> tuple[bool, tuple[Layer, ...]] | None:
    """(standardized?, layers) of a ``[standardize ->] (MatMul -> Add -> act)* -> MatMul -> Add`` model, or None."""
    nodes = list(pm.model.graph.node)
    x = pm.input_name
    std = [n.op_type for n in nodes[:2]] == ["Sub", "Div"]
    if std:
        sub, div = nodes[0], nodes[1]
        if (list(sub.input) != [x, Names.scaler_mean] or list(div.input) != [sub.output[0], Names.scaler_scale]):
            return None
        x, nodes = div.output[0], nodes[2:]
    layers: list[Layer] = []
    i = 0
    while i < len(nodes):
        if i + 1 >= len(nodes):
            return None
        mm, add = nodes[i], nodes[i + 1]
        if mm.op_type != "MatMul" or add.op_type != "Add" or mm.input[0] != x or add.input[0] != mm.output[0]:
            return None
        x, i = add.output[0], i + 2
        act = None
        if i < len(nodes) and nodes[i].op_type in _ACTIVATIONS and nodes[i].input[0] == x:
            act, x, i = nodes[i].op_type, nodes[i].output[0], i + 1
        layers.append(Layer(mm.input[1], add.input[1], act))
    if len(layers) < 2 or layers[-1].activation is not None or x != pm.output_name:
        return None
    if sorted(pm.weights) != sorted(w for layer in layers for w in (layer.coef, layer.intercept)):
        return None
    width = None
    for layer in layers:
        c, b = pm.initial[layer.coef].shape, pm.initial[layer.intercept].shape
        if len(c) != 2 or b != (c[1],) or (width is not None and c[0] != width):
            return None
        width = c[1]
    return (std, tuple(layers)) if width == 1 else None


def mlp_plan(tr: Any) -> MLPPlan | None:
    """The lean step's plan for trainer ``tr`` (from its model, loss, optimizer and penalty), or None where it does
    not apply."""
    from streamfit.optim import Adam

    pm, opt, penalty = tr._train_pm, tr.optimizer, tr.penalty
    if (not lean_applies(tr) or type(opt) is not Adam or folds_lr_into_gradients(opt, penalty)
            or (penalty is not None and penalty.l1 != 0)):
        return None
    found = _layers(pm)
    if found is None:
        return None
    std, layers = found
    weights = tuple(w for layer in layers for w in (layer.coef, layer.intercept))
    shapes = tuple(tuple(int(d) for d in pm.initial[w].shape) for w in weights)
    return MLPPlan(pm.input_name, std, layers, FlatLayout.of(weights, shapes, tuple(opt.slots), row=True))


def _activation_grad(b: GraphBuilder, act: str, dy: str, y: str) -> str:
    """dL/dz of a layer from dL/dh and its output h = act(z), in standard ops."""
    def op(op_type: str, inputs: list[str], out: str | None = None, *, hint: str = "", **attrs: Any) -> str:
        return b.op(op_type, *inputs, out=out, **attrs)  # (hint: the builder names its values)

    def const(name: str, value: float) -> str:
        return b.const(np.float32(value))

    out = b.name("dz")
    if act == "Relu":
        return relu_grad(op, const, np.float32, dy, y, out)
    if act == "Tanh":
        return tanh_grad(op, const, dy, y, out)
    return sigmoid_grad(op, const, dy, y, out)


def mlp_step_graph(tr: Any, rows: int = 1) -> tuple[ModelProto, FlatLayout] | None:
    """The lean step of ``rows`` rows of ``tr`` (0: any number above one; see the module docstring), or None where
    it does not apply.  Of more than one row, the loss gradient is a difference and a product instead of one Gemm,
    and a bias's gradient the sum of its layer's errors over the rows (a ReduceSum, as the step graph sums it: a sum
    that cancels to a few ulps is turned by Adam's normalized step into a step of the size of the rate, so its
    rounding must be the step graph's)."""
    plan = mlp_plan(tr)
    if plan is None:
        return None
    batch: int | str = rows if rows > 0 else "N"  # 0: any number of rows above one (the chunk graphs' key)
    pm, opt, penalty = tr._train_pm, tr.optimizer, tr.penalty
    layout, layers = plan.layout, plan.layers
    b = GraphBuilder(pm.dtype, prefix="sfc_m_")
    f32 = TensorProto.FLOAT
    # the weights as pieces of the row theta: one Split, a Reshape for each hidden layer's matrix; the output
    # layer's [H, 1] weight is read as the row [1, H] it is in theta
    pieces = [b.name("piece") for _ in layout.weights]
    sizes = b.const([int(np.prod(s)) for s in layout.shapes], np.int64)
    b.nodes.append(helper.make_node("Split", [THETA, sizes], pieces, axis=1))
    view = dict(zip(layout.weights, pieces))
    for layer, shape in zip(layers[:-1], layout.shapes[0::2]):
        view[layer.coef] = b.op("Reshape", view[layer.coef], b.const(shape, np.int64))
    x = plan.x
    if plan.standardized:
        x = b.op("Div", b.op("Sub", plan.x, Names.scaler_mean), Names.scaler_scale)
    # forward: the inputs of each layer kept for its gradient
    h, inputs = x, []
    for layer in layers[:-1]:
        inputs.append(h)
        z = b.op("Gemm", h, view[layer.coef], view[layer.intercept])
        h = b.op(layer.activation, z) if layer.activation else z
    inputs.append(h)
    out = layers[-1]
    y = pm.output_name
    b.nodes.append(helper.make_node("Gemm", [h, view[out.coef], view[out.intercept]], [y], transB=1))
    f = _LOSSES[type(tr.loss).__name__]
    score = b.op(f, y) if f else y
    if rows == 1:  # dL/dY: (f(score) - y) * gw, y * gw computed before the loop (no state in it)
        e = b.op("Gemm", score, Names.grad_weight, b.op("Neg", b.op("Mul", Names.target, Names.grad_weight)))
    else:  # as the step graph rounds it
        e = b.op("Mul", b.op("Sub", score, Names.target), Names.grad_weight)
    loss_out, _ = tr.loss.graph(b, y, Names.target, Names.loss_weight, Names.grad_weight)
    l2 = penalty.l2 if penalty is not None else 0.0

    def decay(w: str) -> list[str]:  # the L2 term of a penalized weight's gradient, added as the Gemm's C
        return [b.op("Mul", view[w], b.const(np.float32(l2)))] if l2 != 0 and w in pm.penalized else []

    def bias_grad(w: str, err: str) -> str:  # a bias's gradient: its layer's error, summed over the rows
        g = err if rows == 1 else b.op("ReduceSum", err, b.const([0], np.int64), keepdims=1)
        term = decay(w)
        return b.op("Add", g, term[0]) if term else g

    grads: dict[str, str] = {}
    # the output layer: dL/dw = e^T h (a row, as its weight is held), dL/db = sum(e)
    grads[out.coef] = b.op("Gemm", e, inputs[-1], *decay(out.coef), transA=1)
    grads[out.intercept] = bias_grad(out.intercept, e)
    dh = b.op("Gemm", e, view[out.coef])  # (a plan has a hidden layer at least)
    for k in range(len(layers) - 2, -1, -1):
        layer = layers[k]
        # the activation's output is the next layer's input
        dz = _activation_grad(b, layer.activation, dh, inputs[k + 1]) if layer.activation else dh
        g = b.op("Gemm", inputs[k], dz, *decay(layer.coef), transA=1)
        grads[layer.coef] = b.op("Reshape", g, b.const([1, -1], np.int64))
        grads[layer.intercept] = bias_grad(layer.intercept, dz)
        if k > 0:
            dh = b.op("Gemm", dz, view[layer.coef], transB=1)
    g = b.op("Concat", *[grads[w] for w in layout.weights], axis=1)
    kernel = fused_adam.applies(tr)
    new = adam_update(b, opt, g, None, True, kernel)
    existing = {plan.x, THETA, Names.target, Names.loss_weight, Names.grad_weight}
    rename_output(b, loss_out, Names.loss, existing)
    outputs = [helper.make_tensor_value_info(Names.loss, f32, []), helper.make_tensor_value_info(y, f32, [batch, 1])]
    for name, value in new.items():
        rename_output(b, value, Names.new(name), existing)
        outputs.append(helper.make_tensor_value_info(Names.new(name), f32, [1, layout.size]))
    d = layout.shapes[0][0]
    graph_inputs = [helper.make_tensor_value_info(plan.x, f32, [batch, d])]
    if plan.standardized:
        graph_inputs += [helper.make_tensor_value_info(n, f32, [d]) for n in (Names.scaler_mean, Names.scaler_scale)]
    graph_inputs += [helper.make_tensor_value_info(n, f32, [1, layout.size]) for n in layout.state_names()]
    graph_inputs += [_label_input(tr.loss, pm.dtype, 2)] + _row_weight_inputs(pm.dtype, 2)
    graph_inputs += adam_scalar_inputs(kernel, standalone=False)
    graph = helper.make_graph(list(b.nodes), "streamfit_mlp_step", graph_inputs, outputs,
                              initializer=list(b.initializers))
    model = helper.make_model(graph, opset_imports=_opsets(pm.model), ir_version=min(pm.model.ir_version or 10, 10))
    return toposort(model), layout
