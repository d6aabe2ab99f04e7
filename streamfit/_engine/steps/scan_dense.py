"""A lean step for a ready-made linear model: the body of its chunks of small steps (one row a step or a few).

A node in a Scan body costs a fraction of a microsecond per step whatever it computes, so the chunk of a linear
model is as fast as its body is short.  The generic body (the fused step graph with one parameter vector,
:mod:`~streamfit._engine.steps.scan_flat`) spends nodes on slicing the vector into weights, on the bias's
separate gradient and on the concatenation of the gradients; this one carries ``theta = [coef; intercept]`` as a
column and appends a 1 to each row (a concatenation :mod:`~streamfit._engine.steps.scan_lift` moves out of the
loop), so that

- the score is one product ``[x, 1] @ theta``, and for one row the loss gradient one Gemm (``p * gw - y * gw``,
  the second term computed before the loop);
- SGD's update is one Gemm (``theta - [x, 1]^T e``, the rate folded into the row weights);
- Adam's gradient takes its L2 term in the same Gemm (``+ theta * l2`` on the coefficients only) and the bias's
  gradient through the rows' 1s, each moment's update is one Gemm (``alpha * g + beta * m``), and its bias
  corrections are folded into the step's rate and epsilon, computed per step before the loop
  (``(step_size / c) * m / (sqrt(v) + eps / c)``).

The logistic body is 4 nodes with SGD and 12 with Adam and L2 at one row a step (the generic ones: 7 and 25 once
onnxruntime has fused them), 5 and 13 at several; on onnxruntime-training, Adam's seven update nodes are its one
kernel node (:mod:`~streamfit._engine.steps.fused_adam`): 6 and 7.  It rounds differently from the generic step
graph (a Gemm adds its two products with one rounding where the step graph rounds each, and sums the bias's
gradient in its own order).  So the same steps run one per call run the same nodes: a step of one row
:func:`row_step_graph`, of several :func:`batch_step_graph` (up to the large-batch graph's size).  A chunk of
several rows a step then gives the bits of its steps given one call each (tested); of one row a step, within
float32 rounding (``rtol=1e-6``, tested: the one-row body's loss gradient is one Gemm, the row step's two nodes).
Against the generic step graph (a trainer with ``lean_steps`` off), a lean step is within float32 rounding.  That
matters most with Adam: a bias gradient that cancels to a few ulps is turned by its normalized step into a step
of the size of the rate, so a body that summed it otherwise than its step run on its own would move apart.

Used for ready-made linear models only (``MatMul`` + ``Add`` after the running standardization, one output), with
a binary log loss or a squared error, plain SGD without a penalty or Adam with none or an L2 one, float32, dense
inputs, fewer rows a step than the large-batch graph's; anything else keeps the generic body.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from onnx import ModelProto, TensorProto, helper

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import prune, toposort
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan_flat import THETA, FlatLayout
from streamfit._engine.steps.step_graphs import (_label_input, _opsets, _row_weight_inputs, folds_lr_into_gradients,
                                                 rename_output)

__all__ = ["DensePlan", "adam_update", "batch_step_graph", "dense_plan", "dense_step_graph", "lean_applies",
           "row_loss", "row_step_graph"]

#: the score's product: a Gemm without its third input costs onnxruntime less per call than a MatMul of the same
#: tiny shapes (0.23 against 0.29 us in a Scan body, bench/lean_bodies.py's kind)
SCORE_OP = "Gemm"

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
    folds = folds_lr_into_gradients(opt, penalty)  # the fused step's choice, known before it is built
    if type(opt) is SGD and penalty is None and folds:  # momentum is another class
        return "sgd"
    if type(opt) is Adam and not folds and (penalty is None or penalty.l1 == 0):
        return "adam"
    return None


@dataclass(frozen=True)
class DensePlan:
    """What the lean step of a linear model reads: its input, its two weights, the rule, the column layout."""

    x: str
    coef: str
    intercept: str
    #: the model standardizes its input first (``(x - sf_mean) / sf_scale``)
    standardized: bool
    #: "sgd" or "adam"
    rule: str
    layout: FlatLayout
    #: Adam's update is onnxruntime-training's kernel (:mod:`.fused_adam`): the steps read the step number
    fused_adam: bool = False

    def row_scalars(self, dtype: Any) -> dict[str, np.ndarray]:
        """The host scalars the one-row step reads besides the optimizer's (Adam: its folded rate and epsilon), as
        zero arrays for :class:`~streamfit._engine.runtime.buffers.HostScalars` to bind."""
        if self.rule != "adam":
            return {}
        if self.fused_adam:
            return {fused_adam.STEP: np.zeros((), dtype)}
        return {ROW_RATE: np.zeros((1, 1), dtype), ROW_EPS: np.zeros((), dtype)}

    def columns(self) -> dict[str, list[str]]:
        """The values the step carries as one column each: ``theta`` and its optimizer slots, by their members
        (for :meth:`~streamfit._engine.runtime.buffers.PingPong.columns`)."""
        members = [self.coef, self.intercept]
        out = {THETA: members}
        for s in self.layout.slots:
            out[Names.slot(THETA, s)] = [Names.slot(m, s) for m in members]
        return out


def lean_applies(tr: Any) -> bool:
    """Whether trainer ``tr`` may run a hand-written lean step (this module's, or an MLP's:
    :mod:`~streamfit._engine.steps.scan_mlp`): lean steps on (``Trainer.lean_steps``), the fused step on CPU and not
    from an artifact, a dense float32 model of one output without running statistics, a loss of ``_LOSSES``."""
    pm = tr._train_pm
    y_tail = tr.__dict__.get("_y_tail")
    return bool(tr.lean_steps and tr.device.kind == "cpu" and tr.artifact is None and tr.step_kind == "fused"
                and tr.tables is None and not pm.running_stats and not tr.prepared.train_differs
                and pm.dtype == np.float32 and type(tr.loss).__name__ in _LOSSES
                and (y_tail is None or tuple(y_tail) == (1,)) and not tr.optimizer.summed_gradient)


def dense_plan(tr: Any) -> DensePlan | None:
    """The lean step's plan for trainer ``tr`` (known from its model, loss, optimizer and penalty, before any step
    is built), or None where it does not apply."""
    if not lean_applies(tr):
        return None
    pm = tr._train_pm
    linear, rule = _linear(pm), _rule(tr)
    if linear is None or rule is None:
        return None
    x_name, coef, intercept, std = linear
    d = int(pm.initial[coef].shape[0])
    slots = tuple(tr.optimizer.slots) if rule == "adam" else ()
    layout = FlatLayout.of((coef, intercept), ((d, 1), (1,)), slots, column=True)
    return DensePlan(x_name, coef, intercept, std, rule, layout, rule == "adam" and fused_adam.applies(tr))


def adam_update(b: GraphBuilder, opt: Any, g: str, rates: tuple[str, str] | None, row: bool, kernel: bool
                ) -> dict[str, str]:
    """Adam's new ``theta`` and moments from gradient ``g`` (a column ``[size, 1]``, or a row ``[1, size]``: ``row``),
    each moment's update one Gemm (``alpha * g + beta * m``), and the step's bias corrections folded into its rate
    and epsilon: ``step_size * m / (sqrt(v) * c + eps) = (step_size / c) * m / (sqrt(v) + eps / c)``, computed per
    step before the loop from the scanned ``step_size`` and ``inv_sqrt_bc2``, or given (``rates``: the ``[1, 1]``
    rate and the 0-d epsilon, from the host).  With ``kernel``, one node of onnxruntime-training's Adam kernel
    instead, reading the rate and the step number (:mod:`~streamfit._engine.steps.fused_adam`)."""
    m_in, v_in = (Names.slot(THETA, s) for s in opt.slots)
    if kernel:  # onnxruntime-training's one node (fused_adam.py): the rate and step number, from the host or scanned
        w, m, v = fused_adam.update(b, opt, THETA, g, m_in, v_in, Names.scalar("lr"), fused_adam.STEP)
        return {THETA: w, m_in: m, v_in: v}
    one = b.const(np.ones((1, 1), np.float32))

    def moment(x: str, slot: str, beta: float) -> str:
        a, c = (one, x) if row else (x, one)
        return b.op("Gemm", a, c, slot, alpha=1.0 - beta, beta=beta)

    b1, b2 = opt.betas()
    m, v = moment(g, m_in, b1), moment(b.op("Mul", g, g), v_in, b2)
    if rates is None:
        c = Names.scalar("inv_sqrt_bc2")
        rate = b.op("Unsqueeze", b.op("Div", Names.scalar("step_size"), c), b.const([0, 1], np.int64))
        eps = b.op("Div", b.const(np.float32(opt.eps)), c)
    else:
        rate, eps = rates
    ratio = b.op("Div", m, b.op("Add", b.op("Sqrt", v), eps))
    a, c = (rate, ratio) if row else (ratio, rate)
    return {THETA: b.op("Gemm", a, c, THETA, alpha=-1.0, beta=1.0), m_in: m, v_in: v}


def adam_scalar_inputs(kernel: bool, standalone: bool) -> list[Any]:
    """The scalar inputs :func:`adam_update` reads: the rate and step number (:mod:`.fused_adam`'s kernel), else
    the folded rate and epsilon of a step run on its own (``standalone``) or the two per-step scalars they are
    folded from in a Scan."""
    f32 = TensorProto.FLOAT
    if kernel:
        return [helper.make_tensor_value_info(n, f32, []) for n in (Names.scalar("lr"), fused_adam.STEP)]
    if standalone:
        return [helper.make_tensor_value_info(ROW_RATE, f32, [1, 1]), helper.make_tensor_value_info(ROW_EPS, f32, [])]
    return [helper.make_tensor_value_info(Names.scalar(s), f32, []) for s in ("step_size", "inv_sqrt_bc2")]


#: the batch step's column of 1s (``[N, 1]``: :func:`batch_step_graph`), bound per batch size
ONES = "sf_ones_column"

#: the host scalars of the one-row step run on its own (Adam's rate and epsilon with its bias corrections folded
#: in, which a Scan computes before its loop): :meth:`DensePlan.row_scalars`
ROW_RATE, ROW_EPS = Names.scalar("row_rate"), Names.scalar("row_eps")


def dense_step_graph(tr: Any, rows: int | None = 1, standalone: bool = False
                     ) -> tuple[ModelProto, FlatLayout] | None:
    """The lean step of ``rows`` rows of ``tr`` (see the module docstring), or None where it does not apply.  Of
    more than one row, the loss gradient is a difference and a product instead of one Gemm, and the weight
    gradient's Gemm sums it over the rows (the bias's through the rows' 1s).  ``standalone``: a step run on its own,
    whose loss gradient is a difference and a product too (the Gemm's ``y * gw`` would be two more nodes here) and
    whose Adam rates come from the host (``ROW_RATE``, ``ROW_EPS``).  ``rows=None`` (standalone only): a batch of
    any number of rows, whose 1s are an input (``ONES``, ``[N, 1]``)."""
    plan = tr.__dict__["_dense"] if "_dense" in tr.__dict__ else dense_plan(tr)  # the trainer's, made once
    if plan is None:
        return None
    pm = tr._train_pm
    x_name, coef, intercept, std, rule, layout = (plan.x, plan.coef, plan.intercept, plan.standardized, plan.rule,
                                                  plan.layout)
    d = layout.size - 1
    size = layout.size
    b = GraphBuilder(pm.dtype, prefix="sfc_d_")
    f32 = TensorProto.FLOAT
    x = x_name
    if std:
        x = b.op("Div", b.op("Sub", x_name, Names.scaler_mean), Names.scaler_scale)
    # the rows' 1s: a constant, so that scan_lift moves the concatenation out of the loop (a batch of any size: given)
    ones = ONES if rows is None else b.const(np.ones((rows, 1), np.float32))
    n_rows: Any = "N" if rows is None else rows
    xa = b.op("Concat", x, ones, axis=1)
    y = pm.output_name
    b.nodes.append(helper.make_node(SCORE_OP, [xa, THETA], [y]))
    f = _LOSSES[type(tr.loss).__name__]
    score = b.op(f, y) if f else y
    if rows == 1 and not standalone:  # (f(score) - y) * gw, y * gw computed before the loop (no state in it)
        e = b.op("Gemm", score, Names.grad_weight, b.op("Neg", b.op("Mul", Names.target, Names.grad_weight)))
    else:  # as the step graph rounds it
        e = b.op("Mul", b.op("Sub", score, Names.target), Names.grad_weight)
    loss_out, _ = tr.loss.graph(b, y, Names.target, Names.loss_weight, Names.grad_weight)
    outputs = [helper.make_tensor_value_info(Names.loss, f32, []), helper.make_tensor_value_info(y, f32, [n_rows, 1])]
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
            decay = b.op("Mul", THETA, b.const(mask))
        else:
            decay = None
        # the bias's gradient through the rows' 1s, in the same Gemm: a chunk's steps of several rows and the
        # same batches given one per call (batch_step_graph) run these nodes alike, so they round alike
        g = b.op("Gemm", xa, e, *([decay] if decay else []), transA=1)
        new.update(adam_update(b, opt, g, (ROW_RATE, ROW_EPS) if standalone else None, False, plan.fused_adam))
    existing = {x_name, THETA, Names.target, Names.loss_weight, Names.grad_weight}
    rename_output(b, loss_out, Names.loss, existing)
    for name, value in new.items():
        rename_output(b, value, Names.new(name), existing)
        outputs.append(helper.make_tensor_value_info(Names.new(name), f32, [size, 1]))
    inputs = [helper.make_tensor_value_info(x_name, f32, [n_rows, d])]
    if rows is None:
        inputs.append(helper.make_tensor_value_info(ONES, f32, ["N", 1]))
    if std:
        inputs += [helper.make_tensor_value_info(n, f32, [d]) for n in (Names.scaler_mean, Names.scaler_scale)]
    inputs += [helper.make_tensor_value_info(n, f32, [size, 1]) for n in layout.state_names()]
    inputs += [_label_input(tr.loss, pm.dtype, 2)] + _row_weight_inputs(pm.dtype, 2)
    if rule == "adam":
        inputs += adam_scalar_inputs(plan.fused_adam, standalone)
    graph = helper.make_graph(list(b.nodes), "streamfit_dense_step", inputs, outputs,
                              initializer=list(b.initializers))
    model = helper.make_model(graph, opset_imports=_opsets(pm.model), ir_version=min(pm.model.ir_version or 10, 10))
    return toposort(model), layout


def row_step_graph(tr: Any) -> ModelProto | None:
    """The lean step of one row run on its own (not in a Scan): :func:`dense_step_graph` with a finiteness
    check of the new state (``sf_check``: the sum of the new theta; with Adam, the dot product of the new theta
    and its second moment (``[1, 1]``), which is finite when the first moment is, and may overflow on finite
    values: the step then checks the values exactly), without the loss (a dozen nodes for one number:
    :func:`row_loss` computes it from the output) and the nodes nothing reads."""
    return _standalone(tr, 1)


def batch_step_graph(tr: Any) -> ModelProto | None:
    """The lean step of a batch of several rows run on its own: the nodes of a chunk's step of that many rows
    (so the chunk equals its steps given one call each, up to the last step of a call), its loss kept, its 1s an
    input (``ONES``), the finiteness check of :func:`row_step_graph`."""
    return _standalone(tr, None)


def _standalone(tr: Any, rows: int | None) -> ModelProto | None:
    built = dense_step_graph(tr, rows, standalone=True)
    if built is None:
        return None
    model, layout = built
    g = model.graph
    checked = [Names.new(THETA)] + ([Names.new(Names.slot(THETA, layout.slots[1]))] if layout.slots else [])
    b = GraphBuilder(np.float32, prefix="sfc_r_")
    if len(checked) > 1:  # theta . v: one node, not finite when either is not (v >= 0: inf * 0 is NaN)
        b.op("Gemm", *checked, transA=1, out=Names.check)
    else:
        b.op("ReduceSum", checked[0], keepdims=0, out=Names.check)
    g.node.extend(b.nodes)
    g.initializer.extend(b.initializers)
    outputs = [o for o in g.output if o.name != Names.loss or rows is None]
    del g.output[:]
    g.output.extend(outputs + [helper.make_tensor_value_info(Names.check, TensorProto.FLOAT,
                                                             [1, 1] if len(checked) > 1 else [])])
    g.name = "streamfit_dense_row_step" if rows == 1 else "streamfit_dense_batch_step"
    prune(model)
    return model


def row_loss(loss: Any, staging: Any) -> Callable[[], float]:
    """The loss of the one row in ``staging`` (its output, target and loss weight, read when called), as the loss
    graph computes it (in float64 here: a reported value, within rounding of the graph's)."""
    y, t, lw = (a.reshape(-1) for a in (staging.y, staging.t, staging.lw))
    log1p, exp = math.log1p, math.exp
    y0, t0, w0 = y.item, t.item, lw.item  # item(0): a Python float, without a numpy scalar between
    if type(loss).__name__ == "BinaryLogLoss":  # softplus(z) - t * z
        def value() -> float:
            z = y0(0)
            return w0(0) * ((z if z > 0.0 else 0.0) + log1p(exp(-abs(z))) - t0(0) * z)
    else:  # SquaredError: its 1/2 is in the loss weight
        def value() -> float:
            r = y0(0) - t0(0)
            return w0(0) * r * r
    return value
