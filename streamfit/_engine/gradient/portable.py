"""Portable step graphs: training-only kernels of ORT's gradient graphs rewritten into inference ops.

onnxruntime-training 1.19.2 is the last training build; inference builds (plain ``onnxruntime``, the newest
included) lack the training kernels its gradient builder emits (``ReluGrad``, ``ConvGrad``, ``GatherGrad``,
...).  :func:`make_portable` rewrites each into standard ONNX ops (or ``com.microsoft`` contrib ops that
inference builds implement, such as ``FusedMatMul``), with the same arithmetic up to float rounding, so a
step graph built with onnxruntime-training runs on any onnxruntime >= 1.19.  :data:`REWRITTEN` lists what
is rewritten, :data:`CANNOT` what cannot be and why; :func:`portability_report` says whether a graph
still needs onnxruntime-training at train time.

Which kernels: what the zoo's 61 exports and the ready-made models produce (``bench/op_census.py``
counts them); the rewrites are ordered by how many of those models each unblocks.  The pass is applied
only where portable graphs are asked for (``Trainer(portable=True)``, compiled artifacts): at small
batches ORT's fused kernels are faster than their spelled-out forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import attrs, default_opset
from streamfit._engine.gradient.rewrites import decompose_fused_matmul, float64_activation_grads, replace_relu_grad

__all__ = ["REWRITTEN", "CANNOT", "INFERENCE_CONTRIB", "PortabilityReport", "make_portable", "portability_report", "SplitGraphs", "split_at_yield",
           "needs_training_build"]

MS = "com.microsoft"

#: ``com.microsoft`` ops with CPU kernels in inference builds (checked in onnxruntime 1.19.2 and 1.31.1) that
#: streamfit's graphs may hold: kept as they are.
INFERENCE_CONTRIB: frozenset[str] = frozenset({
    "FusedMatMul", "FusedGemm", "TransposeMatMul", "MurmurHash3", "Gelu", "FastGelu", "BiasGelu", "QuickGelu",
    "FusedConv", "SkipLayerNormalization", "Attention", "MultiHeadAttention", "Range", "Trilu", "ExpandDims",
    "GatherND", "Inverse", "Unique", "CDist", "Pad", "EmbedLayerNormalization",
})

#: Training-only kernels rewritten by :func:`make_portable` -> what they become (models of the zoo and
#: ready-made models holding them, from ``bench/op_census.py``).
REWRITTEN: dict[str, str] = {
    "ReluGrad": "dY * HardSigmoid(Y * 2^126) (float32; Mul + Clip otherwise) -- 36 models",
    "ConvGrad": "dX: ConvTranspose + Pad to X's size; dW: Conv of X and dY with roles swapped (group 1); "
                "dB: ReduceSum -- 15",
    "TanhGrad": "dY * (1 - Y^2) -- 15",
    "Scale": "Mul / Div by the scale -- 13",
    "ConcatTraining": "Concat (+ the input lengths from Shape) -- 10",
    "SplitTraining": "Split",
    "GatherGrad": "ScatterND add into zeros (axis 0) -- 10",
    "DivGrad": "dA = sum_to(dY / B), dB = sum_to(-dY * A / B^2) -- 9",
    "MaxPoolGrad": "ScatterElements add of dY at MaxPool's indices -- 6",
    "SigmoidGrad": "dY * Y * (1 - Y) -- 5",
    "DropoutGrad": "dY * mask / (1 - ratio) -- 5",
    "LayerNormalizationGrad": "the closed form from X, mean and 1/std -- 5",
    "LeakyReluGrad": "Where(Y > 0, dY, alpha * dY) -- 4",
    "GeluGrad": "dY * (Phi(x) + x phi(x)) -- 4",
    "BroadcastGradientArgs": "axes where the padded shapes differ from the broadcast shape -- 3",
    "SoftmaxGrad_13": "Y * (dY - sum(dY * Y)) -- 3",
    "SoftmaxGrad": "as SoftmaxGrad_13, over the coerced trailing axes",
    "LogSoftmaxGrad_13": "dY - exp(Y) * sum(dY)",
    "LogSoftmaxGrad": "as LogSoftmaxGrad_13, over the coerced trailing axes",
    "QuickGeluGrad": "dY * s * (1 + alpha x (1 - s)), s = sigmoid(alpha x) -- 2",
    "SliceGrad": "ScatterElements of dY at the sliced positions of an index grid -- 2",
    "GatherElementsGrad": "ScatterElements add into zeros -- 1",
    "FastGeluGrad": "derivative of the tanh approximation",
    "BiasGeluGrad_dX": "GeluGrad at X + B",
    "BiasFastGeluGrad_dX": "FastGeluGrad at X + B",
}

#: Training-only ops that are not rewritten, and why.  A graph holding one needs onnxruntime-training.
CANNOT: dict[str, str] = {
    "YieldOp": "the hand-off point of onnxruntime-training's TrainingAgent (step='forward_backward'); the fused "
               "step replaces it with the loss, and split_at_yield() cuts the graph there into a forward and a "
               "backward graph that inference builds run",
    "LSTMTraining": "the LSTM forward that saves the gates for LSTMGrad; its gradient is a recurrence over time "
                    "(a Scan with its own backward), not rewritten -- 2 zoo models (lstm.*)",
    "LSTMGrad": "see LSTMTraining",
    "GRUTraining": "as LSTMTraining, for GRU -- 2 zoo models (gru.*)",
    "GRUGrad": "see GRUTraining",
    "ConvGrad": "only grouped convolutions whose weight gradient is needed, or auto_pad other than NOTSET",
    "GatherGrad": "only a Gather on an axis other than 0 (the GRU/LSTM exports)",
}


@dataclass(frozen=True)
class PortabilityReport:
    """What a graph needs beyond an inference build of onnxruntime: ``training_only`` ops ("domain:op")
    with why each cannot be rewritten (``reasons``); empty when the graph is portable."""

    training_only: tuple[str, ...]
    reasons: tuple[str, ...]

    @property
    def portable(self) -> bool:
        return not self.training_only

    def __str__(self) -> str:
        if self.portable:
            return "portable: runs on any onnxruntime >= 1.19 (inference builds included)"
        lines = [f"needs onnxruntime-training at train time: {', '.join(self.training_only)}"]
        lines += [f"  {op}: {why}" for op, why in zip(self.training_only, self.reasons)]
        return "\n".join(lines)


def _inference_op(node: NodeProto) -> bool:
    if node.domain in ("", "ai.onnx", "ai.onnx.ml"):
        return onnx.defs.has(node.op_type, node.domain)
    return node.domain == MS and node.op_type in INFERENCE_CONTRIB


def portability_report(model: ModelProto) -> PortabilityReport:
    """Which ops of ``model`` (after :func:`make_portable`, normally) an inference build lacks.

    >>> from onnx import helper
    >>> g = helper.make_graph([helper.make_node("YieldOp", ["y"], ["dy"], domain="com.microsoft")], "g", [], [])
    >>> print(portability_report(helper.make_model(g)))  # doctest: +ELLIPSIS
    needs onnxruntime-training at train time: com.microsoft:YieldOp
      com.microsoft:YieldOp: the hand-off point of onnxruntime-training's TrainingAgent ...
    """
    ops = sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.node if not _inference_op(n)})
    reasons = tuple(CANNOT.get(op.split(":", 1)[1], "a training-only kernel with no rewrite") for op in ops)
    return PortabilityReport(tuple(ops), reasons)


def needs_training_build(models: "dict[str, ModelProto]") -> dict[str, PortabilityReport]:
    """The reports of those of ``models`` (name -> graph) that are not portable."""
    reports = {name: portability_report(m) for name, m in models.items()}
    return {name: r for name, r in reports.items() if not r.portable}


# -- the rewrite pass -----------------------------------------------------------------------------------

_FLOATS: dict[int, Any] = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
           onnx.TensorProto.FLOAT16: np.float16}
_BIG = np.iinfo(np.int64).max


def _graph_dtype(model: ModelProto) -> np.dtype:
    """The float type the graph trains in (its float inputs and initializers; float32 if none)."""
    counts: dict[int, int] = {}
    elems = [vi.type.tensor_type.elem_type for vi in model.graph.input] + [i.data_type for i in model.graph.initializer]
    for e in elems:
        if e in _FLOATS:
            counts[e] = counts.get(e, 0) + 1
    return np.dtype(_FLOATS[max(counts, key=counts.__getitem__)] if counts else np.float32)


class _Ctx:
    """Emits the nodes of one rewrite: unique names, typed constants, the default-domain opset it needs."""

    def __init__(self, model: ModelProto, dtype: np.dtype) -> None:
        self.model = model
        self.dtype = np.dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.producers = {o: n for n in model.graph.node for o in n.output}
        self.nodes: list[NodeProto] = []
        self.opset = 13
        self._n = 0
        self._consts: dict[tuple, str] = {n.name: n.name for n in model.graph.initializer}

    def name(self, hint: str) -> str:
        self._n += 1
        return f"sfp_{self._n}_{hint}"

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:  # type: ignore[no-untyped-def]
        output = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=self.name(op_type), **attrs))
        return output

    def const(self, value, dtype=None) -> str:  # type: ignore[no-untyped-def]
        arr = np.asarray(value, dtype=self.dtype if dtype is None else dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = f"sfp_c{len(self._consts)}_{self._n}"
            self.model.graph.initializer.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def i64(self, value) -> str:  # type: ignore[no-untyped-def]
        return self.const(value, np.int64)

    def zeros_of_shape(self, shape: str) -> str:
        return self.op("ConstantOfShape", shape, value=helper.make_tensor("value", self.elem, [1], [0.0]))

    def sum_to(self, grad: str, shape: str, out: str) -> str:
        """Sum ``grad`` over the axes it was broadcast along, to the shape ``shape`` (a 1-D int64 tensor)."""
        gshape = self.op("Shape", grad)
        pad = self.op("ConstantOfShape", self.op("Reshape", self.op("Sub", self.op("Size", gshape), self.op("Size", shape)),
                                                 self.i64([1])),
                      value=helper.make_tensor("value", onnx.TensorProto.INT64, [1], [1]))
        padded = self.op("Concat", pad, shape, axis=0)
        axes = self.op("Reshape", self.op("NonZero", self.op("Not", self.op("Equal", gshape, padded))), self.i64([-1]))
        summed = self.op("ReduceSum", grad, axes, keepdims=1, noop_with_empty_axes=1)
        return self.op("Reshape", summed, shape, out=out)

    def trailing(self, x: str, start: int) -> str:
        """``Shape(x)[start:]``."""
        return self.op("Slice", self.op("Shape", x), self.i64([start]), self.i64([_BIG]))

    def axes_from(self, x: str, axis: int) -> str:
        """The 1-D axes ``axis .. rank(x) - 1`` (``axis`` may be negative)."""
        rank = self.op("Size", self.op("Shape", x))
        start = self.i64(axis) if axis >= 0 else self.op("Add", rank, self.i64(axis))
        return self.op("Range", start, rank, self.i64(1))


Rewrite = Callable[[NodeProto, _Ctx], bool]  # emits into ctx.nodes; False: this case is not handled
_REWRITES: dict[str, Rewrite] = {}


def _rewrite(*ops: str) -> Callable[[Rewrite], Rewrite]:
    def register(fn: Rewrite) -> Rewrite:
        for op in ops:
            _REWRITES[op] = fn
        return fn
    return register


def _out(node: NodeProto, i: int) -> str:
    return node.output[i] if len(node.output) > i else ""


@_rewrite("Scale")
def _scale(node: NodeProto, c: _Ctx) -> bool:
    x, s = node.input[0], c.op("Cast", node.input[1], to=c.elem)
    c.op("Div" if attrs(node).get("scale_down", 0) else "Mul", x, s, out=node.output[0])
    return True


@_rewrite("ConcatTraining")
def _concat_training(node: NodeProto, c: _Ctx) -> bool:
    axis = int(attrs(node)["axis"])
    c.op("Concat", *node.input, out=node.output[0], axis=axis)
    if _out(node, 1):
        lengths = [c.op("Gather", c.op("Shape", x), c.i64([axis])) for x in node.input]
        c.op("Concat", *lengths, out=node.output[1], axis=0)
    return True


@_rewrite("GatherGrad")
def _gather_grad(node: NodeProto, c: _Ctx) -> bool:
    if int(attrs(node).get("axis", 0)) != 0:
        return False
    shape, ids, dy = node.input
    ids = c.op("Cast", ids, to=onnx.TensorProto.INT64)
    rows = c.op("Gather", shape, c.i64(0))  # a scalar: a scalar id stays a scalar
    ids = c.op("Where", c.op("Less", ids, c.i64(0)), c.op("Add", ids, rows), ids)  # Gather takes negative ids
    c.opset = max(c.opset, 16)  # ScatterND's reduction
    c.op("ScatterND", c.zeros_of_shape(shape), c.op("Unsqueeze", ids, c.i64([-1])), dy, out=node.output[0],
         reduction="add")
    return True


@_rewrite("GatherElementsGrad")
def _gather_elements_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, shape, ids = node.input
    axis = int(attrs(node).get("axis", 0))
    ids = c.op("Cast", ids, to=onnx.TensorProto.INT64)
    dim = c.op("Gather", shape, c.i64(axis))
    ids = c.op("Where", c.op("Less", ids, c.i64(0)), c.op("Add", ids, dim), ids)
    c.opset = max(c.opset, 16)
    c.op("ScatterElements", c.zeros_of_shape(shape), ids, dy, out=node.output[0], axis=axis, reduction="add")
    return True


@_rewrite("SliceGrad")
def _slice_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, shape, *rest = node.input  # starts, ends, axes (, steps)
    size = c.op("ReduceProd", shape, keepdims=0)
    grid = c.op("Reshape", c.op("Range", c.i64(0), size, c.i64(1)), shape)
    positions = c.op("Slice", grid, *rest)
    flat = c.op("ScatterElements", c.zeros_of_shape(c.op("Reshape", size, c.i64([1]))),
                c.op("Reshape", positions, c.i64([-1])), c.op("Reshape", dy, c.i64([-1])), axis=0)
    c.op("Reshape", flat, shape, out=node.output[0])
    return True


@_rewrite("MaxPoolGrad")
def _max_pool_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, indices = node.input[0], node.input[1]
    pool = c.producers.get(indices)
    if pool is None or pool.op_type != "MaxPool" or len(pool.output) < 2 or pool.output[1] != indices:
        return False
    if int(attrs(node).get("storage_order", 0)) != 0:
        return False
    x = pool.input[0]
    size = c.op("Reshape", c.op("Size", x), c.i64([1]))
    c.opset = max(c.opset, 16)  # overlapping windows pick one input twice: scatter-add
    flat = c.op("ScatterElements", c.zeros_of_shape(size), c.op("Reshape", indices, c.i64([-1])),
                c.op("Reshape", dy, c.i64([-1])), axis=0, reduction="add")
    c.op("Reshape", flat, c.op("Shape", x), out=node.output[0])
    return True


@_rewrite("DivGrad")
def _div_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, a, b = node.input
    if _out(node, 0):
        c.sum_to(c.op("Div", dy, b), c.op("Shape", a), node.output[0])
    if _out(node, 1):
        q = c.op("Div", c.op("Div", a, b), b)
        c.sum_to(c.op("Neg", c.op("Mul", dy, q)), c.op("Shape", b), node.output[1])
    return True


@_rewrite("BroadcastGradientArgs")
def _broadcast_gradient_args(node: NodeProto, c: _Ctx) -> bool:
    sa, sb = node.input
    ka, kb = c.op("Size", sa), c.op("Size", sb)
    rank = c.op("Max", ka, kb)
    one = helper.make_tensor("value", onnx.TensorProto.INT64, [1], [1])
    padded = [c.op("Concat", c.op("ConstantOfShape", c.op("Reshape", c.op("Sub", rank, k), c.i64([1])), value=one), s,
                   axis=0) for s, k in ((sa, ka), (sb, kb))]
    full = c.op("Max", *padded)
    for i, p in enumerate(padded):
        if _out(node, i):
            c.op("Reshape", c.op("NonZero", c.op("Not", c.op("Equal", p, full))), c.i64([-1]), out=node.output[i])
    return True


@_rewrite("LeakyReluGrad")
def _leaky_relu_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, y = node.input
    alpha = float(attrs(node).get("alpha", 0.01))
    c.op("Where", c.op("Greater", y, c.const(0)), dy, c.op("Mul", dy, c.const(alpha)), out=node.output[0])
    return True


def _gelu_derivative(c: _Ctx, x: str) -> str:
    """Phi(x) + x phi(x): the derivative of x * Phi(x) (exact GELU)."""
    cdf = c.op("Mul", c.const(0.5), c.op("Add", c.const(1), c.op("Erf", c.op("Mul", x, c.const(2 ** -0.5)))))
    pdf = c.op("Mul", c.const((2 * np.pi) ** -0.5), c.op("Exp", c.op("Mul", c.op("Mul", x, x), c.const(-0.5))))
    return c.op("Add", cdf, c.op("Mul", x, pdf))


def _fast_gelu_derivative(c: _Ctx, x: str) -> str:
    """Derivative of 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)."""
    k, a = np.sqrt(2 / np.pi), 0.044715
    xx = c.op("Mul", x, x)
    t = c.op("Tanh", c.op("Mul", c.op("Mul", x, c.const(k)), c.op("Add", c.const(1), c.op("Mul", xx, c.const(a)))))
    inner = c.op("Mul", c.const(k), c.op("Add", c.const(1), c.op("Mul", xx, c.const(3 * a))))
    sech2 = c.op("Sub", c.const(1), c.op("Mul", t, t))
    return c.op("Add", c.op("Mul", c.const(0.5), c.op("Add", c.const(1), t)),
                c.op("Mul", c.op("Mul", c.op("Mul", c.const(0.5), x), sech2), inner))


@_rewrite("GeluGrad", "FastGeluGrad", "BiasGeluGrad_dX", "BiasFastGeluGrad_dX")
def _gelu_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, x = node.input[0], node.input[1]
    if node.op_type.startswith("Bias"):
        x = c.op("Add", x, node.input[2])
    fast = "Fast" in node.op_type
    c.op("Mul", dy, (_fast_gelu_derivative if fast else _gelu_derivative)(c, x), out=node.output[0])
    return True


@_rewrite("QuickGeluGrad")
def _quick_gelu_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, x = node.input
    alpha = float(attrs(node).get("alpha", 1.702))
    ax = c.op("Mul", x, c.const(alpha))
    s = c.op("Sigmoid", ax)
    d = c.op("Mul", s, c.op("Add", c.const(1), c.op("Mul", ax, c.op("Sub", c.const(1), s))))
    c.op("Mul", dy, d, out=node.output[0])
    return True


def _softmax_axes(node: NodeProto, c: _Ctx, y: str) -> str:
    axis = int(attrs(node).get("axis", -1 if node.op_type.endswith("_13") else 1))
    if node.op_type.endswith("_13"):
        return c.i64([axis])
    return c.axes_from(y, axis)  # opset < 13 semantics: the input coerced to 2-D at axis


@_rewrite("SoftmaxGrad", "SoftmaxGrad_13")
def _softmax_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, y = node.input
    total = c.op("ReduceSum", c.op("Mul", dy, y), _softmax_axes(node, c, y), keepdims=1)
    c.op("Mul", y, c.op("Sub", dy, total), out=node.output[0])
    return True


@_rewrite("LogSoftmaxGrad", "LogSoftmaxGrad_13")
def _log_softmax_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, y = node.input
    total = c.op("ReduceSum", dy, _softmax_axes(node, c, y), keepdims=1)
    c.op("Sub", dy, c.op("Mul", c.op("Exp", y), total), out=node.output[0])
    return True


@_rewrite("DropoutGrad")
def _dropout_grad(node: NodeProto, c: _Ctx) -> bool:
    """dY * mask / (1 - ratio), as ORT's kernel computes it (it does not read training_mode: in eval mode the
    forward's mask is all ones)."""
    dy, mask = node.input[0], node.input[1]
    ratio = node.input[2] if len(node.input) > 2 and node.input[2] else None
    r = c.op("Cast", ratio, to=c.elem) if ratio else c.const(0.5)
    scale = c.op("Div", c.const(1), c.op("Sub", c.const(1), r))
    c.op("Mul", c.op("Mul", dy, c.op("Cast", mask, to=c.elem)), scale, out=node.output[0])
    return True


@_rewrite("LayerNormalizationGrad")
def _layer_norm_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, x, scale, mean, inv_std = node.input[:5]
    axis = int(attrs(node).get("axis", -1))
    mean, inv_std = c.op("Cast", mean, to=c.elem), c.op("Cast", inv_std, to=c.elem)
    rank = c.op("Size", c.op("Shape", x))
    start = c.i64(axis) if axis >= 0 else c.op("Add", rank, c.i64(axis))
    norm_axes = c.op("Range", start, rank, c.i64(1))
    lead_axes = c.op("Range", c.i64(0), start, c.i64(1))
    n = c.op("Cast", c.op("Div", c.op("Size", x), c.op("Size", mean)), to=c.elem)  # elements normalized together
    xhat = c.op("Mul", c.op("Sub", x, mean), inv_std)
    if _out(node, 0):
        g = c.op("Mul", dy, scale)
        m1 = c.op("Div", c.op("ReduceSum", g, norm_axes, keepdims=1), n)
        m2 = c.op("Div", c.op("ReduceSum", c.op("Mul", g, xhat), norm_axes, keepdims=1), n)
        c.op("Mul", inv_std, c.op("Sub", c.op("Sub", g, m1), c.op("Mul", xhat, m2)), out=node.output[0])
    if _out(node, 1):
        c.op("ReduceSum", c.op("Mul", dy, xhat), lead_axes, out=node.output[1], keepdims=0, noop_with_empty_axes=1)
    if _out(node, 2):
        c.op("ReduceSum", dy, lead_axes, out=node.output[2], keepdims=0, noop_with_empty_axes=1)
    return True


@_rewrite("ConvGrad")
def _conv_grad(node: NodeProto, c: _Ctx) -> bool:
    dy, x, w = node.input[:3]
    a = attrs(node)
    auto_pad = a.get("auto_pad", b"NOTSET")
    if (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET" or "kernel_shape" not in a:
        return False
    k = len(a["kernel_shape"])
    group = int(a.get("group", 1))
    strides = list(a.get("strides", [1] * k))
    dilations = list(a.get("dilations", [1] * k))
    pads = list(a.get("pads", [0] * (2 * k)))
    if _out(node, 1) and group != 1:
        return False
    if _out(node, 0):  # ConvTranspose, then zeros for the trailing inputs no window reached (stride > 1)
        t = c.op("ConvTranspose", dy, w, group=group, strides=strides, dilations=dilations, pads=pads,
                 kernel_shape=list(a["kernel_shape"]))
        short = c.op("Sub", c.trailing(x, 2), c.trailing(t, 2))
        c.op("Pad", t, c.op("Concat", c.i64([0] * (k + 4)), short, axis=0), out=node.output[0])
    if _out(node, 1):  # dW[o, c] = sum_n X[n, c] (*) dY[n, o]: batch and channels swap roles
        perm = [1, 0] + list(range(2, k + 2))
        full = c.op("Conv", c.op("Transpose", x, perm=perm), c.op("Transpose", dy, perm=perm), strides=dilations,
                    dilations=strides, pads=pads)
        c.op("Slice", c.op("Transpose", full, perm=perm), c.i64([0] * k), c.trailing(w, 2), c.i64(list(range(2, k + 2))),
             out=node.output[1])
    if _out(node, 2):
        c.op("ReduceSum", dy, c.i64([0] + list(range(2, k + 2))), out=node.output[2], keepdims=0)
    return True


def _raise_opset(model: ModelProto, need: int) -> None:
    """Raise the default domain's opset to ``need`` (from 13..15 to 16: the ops' meanings do not change)."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version < need:
            imp.version = need


def make_portable(model: ModelProto) -> ModelProto:
    """A copy of ``model`` with every training-only kernel that has a rewrite replaced (see :data:`REWRITTEN`).

    What is left (see :data:`CANNOT`) is reported by :func:`portability_report`.  Idempotent; a graph with
    nothing to rewrite comes back equal to the input.  The rewrites use opset-13 forms (axes as inputs):
    a graph of an older opset comes back unchanged.
    """
    out = ModelProto()
    out.CopyFrom(model)
    if default_opset(out) < 13:
        return out
    dtype = _graph_dtype(out)
    # the rewrites the engine already applies for speed or float64 (same functions, same arithmetic)
    replace_relu_grad(out, dtype)
    float64_activation_grads(out, dtype)
    if dtype != np.float32:
        decompose_fused_matmul(out, dtype)
    ctx = _Ctx(out, dtype)
    nodes: list[NodeProto] = []
    for node in out.graph.node:
        rewrite = _REWRITES.get(node.op_type) if node.domain in (MS, "", "ai.onnx") and not _inference_op(node) else None
        ctx.nodes = []
        if rewrite is not None and rewrite(node, ctx):
            nodes.extend(ctx.nodes)
        else:
            nodes.append(node)
    _raise_opset(out, ctx.opset)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _ort_types(nodes: list[NodeProto], graph: onnx.GraphProto, model: ModelProto, names: list[str]
               ) -> dict[str, onnx.ValueInfoProto]:
    """Types (and shapes) onnxruntime infers for ``names``: a probe graph outputs them, untyped."""
    import onnxruntime as ort

    probe = helper.make_graph(nodes, "probe", list(graph.input), [onnx.ValueInfoProto(name=n) for n in names],
                              list(graph.initializer))
    m = helper.make_model(probe, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    elems = {f"tensor({k})": v for k, v in (("float", onnx.TensorProto.FLOAT), ("double", onnx.TensorProto.DOUBLE),
                                            ("int64", onnx.TensorProto.INT64), ("int32", onnx.TensorProto.INT32),
                                            ("bool", onnx.TensorProto.BOOL), ("float16", onnx.TensorProto.FLOAT16))}
    out = {}
    for arg in sess.get_outputs():
        if arg.type in elems:
            shape = [d if isinstance(d, int) else None for d in arg.shape] if arg.shape is not None else None
            out[arg.name] = helper.make_tensor_value_info(arg.name, elems[arg.type], shape)
    return out


@dataclass(frozen=True)
class SplitGraphs:
    """A gradient graph cut at its ``YieldOp``: two plain graphs an inference build runs one after the other.

    ``forward`` takes the gradient graph's inputs and returns the model's outputs followed by ``stashed`` (the
    forward tensors the backward reads); ``backward`` takes ``grad_inputs`` (dL/d outputs, in the YieldOp's
    order), the stashed tensors and the graph inputs it reads, and returns the gradient graph's outputs.
    """

    forward: ModelProto
    backward: ModelProto
    outputs: tuple[str, ...]
    grad_inputs: tuple[str, ...]
    stashed: tuple[str, ...]


def _crossing_types(gradient: ModelProto, fw_nodes: list[NodeProto], bw_nodes: list[NodeProto], outs: list[str],
                    grads: list[str], stashed: list[str]) -> dict[str, onnx.ValueInfoProto]:
    """Types of the tensors crossing the cut (ONNX shape inference, else onnxruntime's): the YieldOp's outputs
    are typed like its inputs."""
    probe = ModelProto()
    probe.CopyFrom(gradient)
    del probe.graph.node[:]
    probe.graph.node.extend(fw_nodes + [helper.make_node("Identity", [x], [g]) for x, g in zip(outs, grads)] + bw_nodes)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe).graph
    except Exception as exc:
        raise ValueError(f"shape inference failed on the gradient graph: {exc}") from exc
    types = {vi.name: vi for vi in list(inferred.value_info) + list(inferred.input) + list(inferred.output)
             if vi.type.tensor_type.elem_type}
    unknown = [n for n in outs + stashed if n not in types]
    if unknown:  # ONNX's inference stops at an op it does not know: ask onnxruntime's (contrib ops included)
        types.update(_ort_types(fw_nodes, gradient.graph, gradient, unknown))
    return types


def split_at_yield(gradient: ModelProto) -> SplitGraphs:
    """Cut ``gradient`` (ORT's forward + backward graph, with one ``YieldOp``) into forward and backward graphs.

    This is what onnxruntime-training's TrainingAgent does inside one session (``step="forward_backward"``);
    as two graphs, the pieces run on any onnxruntime.  Tensor types come from ONNX shape inference; a
    stashed tensor whose type cannot be inferred raises ``ValueError``.  Apply :func:`make_portable` first
    for graphs free of training kernels.
    """
    from streamfit.exceptions import ModelError

    graph = gradient.graph
    yields = [i for i, n in enumerate(graph.node) if n.op_type == "YieldOp"]
    if len(yields) != 1:
        raise ModelError(f"expected one YieldOp in the gradient graph, found {len(yields)}")
    at = yields[0]
    yield_node = graph.node[at]
    fw_nodes, bw_nodes = list(graph.node[:at]), list(graph.node[at + 1:])
    produced = {o for n in fw_nodes for o in n.output if o}
    inputs = {i.name: i for i in graph.input}
    inits = {i.name for i in graph.initializer}
    bw_reads = [name for n in bw_nodes for name in n.input if name]
    stashed = list(dict.fromkeys(n for n in bw_reads if n in produced and n not in yield_node.input))
    outs = list(yield_node.input)
    grads = list(yield_node.output)
    types = _crossing_types(gradient, fw_nodes, bw_nodes, outs, grads, stashed)

    def typed(name: str) -> onnx.ValueInfoProto:
        vi = types.get(name)
        if vi is None:
            raise ValueError(f"the type of {name!r} (crossing the YieldOp) is not known")
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(vi)
        return copy

    def model(nodes: list[NodeProto], ins: list[onnx.ValueInfoProto], outs_: list[onnx.ValueInfoProto],
              name: str) -> ModelProto:
        used = {n for node in nodes for n in node.input}
        g = helper.make_graph(nodes, name, ins, outs_, [i for i in graph.initializer if i.name in used])
        m = helper.make_model(g, opset_imports=list(gradient.opset_import), ir_version=gradient.ir_version)
        return m

    fw_used = {n for node in fw_nodes for n in node.input}
    forward = model(fw_nodes, [i for i in graph.input if i.name in fw_used or i.name in outs],
                    [typed(n) for n in outs + stashed], f"{graph.name}_forward")
    bw_inputs = [typed(g) for g in grads] + [typed(s) for s in stashed]
    bw_inputs += [inputs[n] for n in dict.fromkeys(bw_reads) if n in inputs and n not in inits]
    backward = model(bw_nodes, bw_inputs, list(graph.output), f"{graph.name}_backward")
    return SplitGraphs(forward, backward, tuple(outs), tuple(grads), tuple(stashed))
