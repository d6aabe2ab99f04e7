"""Rewrites of a model before its gradient is built: ops onnxruntime-training 1.19.2 cannot differentiate
(or whose gradient kernel crashes) spelled as equivalent ops whose gradients are sound.

Each rewrite keeps the arithmetic of the op (checked against the original in the tests) and touches the
training copy of the model only; ``predict`` and ``to_onnx()`` keep the author's ops.

- ``LayerNormalization`` gets its two optional outputs (mean, inverse std dev): its gradient builder
  reads them and asserts without them.
- ``AveragePool``: its gradient kernel (AveragePoolGrad) dies with SIGFPE at every batch size here, taking
  the process with it.  It becomes a depthwise ``Conv`` with a frozen averaging kernel (ConvGrad is sound).
- ``Elu``, ``Selu``, ``Celu``, ``Softplus``, ``Mish``: no gradient registered; written with Relu/Exp/Log/Tanh.
- ``ReduceMax``/``ReduceMin`` over given axes (PyTorch's ``AdaptiveMaxPool1d(1)`` via dynamo): no gradient
  registered; ``TopK(k=1)`` along each axis has one.
- ``HardSigmoid``, ``HardSwish``: no gradient registered; Mul/Add/Clip
  (:mod:`streamfit._engine.prepare.hard_activations`).
- Bidirectional (and reverse) ``LSTM``/``GRU``: the training kernels run forward only; two forward nodes, one
  over the reversed sequence (:mod:`streamfit._engine.prepare.recurrent`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import ShapedRewriter, attrs
from streamfit._engine.prepare.hard_activations import hard_activations
from streamfit._engine.prepare.recurrent import bidirectional_rnn
from streamfit._engine.prepare.running_stats import rewrite_batchnorm, training_dropout
from streamfit.exceptions import ModelError

__all__ = ["make_trainable", "REFUSED"]

#: Ops refused outright, with the reason (checked before any gradient is built).
REFUSED: dict[str, str] = {}

def _layernorm(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    if node.op_type != "LayerNormalization" or len(node.output) >= 3 and all(node.output):
        return None
    outs = list(node.output) + [""] * (3 - len(node.output))
    outs = [o or rw.name(hint) for o, hint in zip(outs, ("ln_y", "ln_mean", "ln_invstd"))]
    del node.output[:]
    node.output.extend(outs)
    return [node]


def _elu_like(rw: ShapedRewriter, x: str, out: str, alpha: float, gamma: float = 1.0, celu: bool = False) -> list[NodeProto]:
    """gamma * (relu(x) + alpha * (exp(-relu(-x) / s) - 1)), s = alpha for CELU else 1."""
    n = rw.name
    neg, rneg, negr, e, em1, scaled, pos, total = (n(h) for h in ("neg", "rneg", "negr", "exp", "em1", "sc", "pos", "sum"))
    nodes = [helper.make_node("Neg", [x], [neg]), helper.make_node("Relu", [neg], [rneg]),
             helper.make_node("Neg", [rneg], [negr])]
    arg = negr
    if celu:
        arg = n("div")
        nodes.append(helper.make_node("Div", [negr, rw.const(alpha, x)], [arg]))
    nodes += [helper.make_node("Exp", [arg], [e]), helper.make_node("Sub", [e, rw.const(1.0, x)], [em1]),
              helper.make_node("Mul", [em1, rw.const(alpha, x)], [scaled]), helper.make_node("Relu", [x], [pos])]
    if gamma == 1.0:
        nodes.append(helper.make_node("Add", [pos, scaled], [out]))
    else:
        nodes += [helper.make_node("Add", [pos, scaled], [total]),
                  helper.make_node("Mul", [total, rw.const(gamma, x)], [out])]
    return nodes


def _softplus_nodes(rw: ShapedRewriter, x: str, out: str) -> list[NodeProto]:
    """relu(x) + log(1 + exp(-|x|)) (no overflow), |x| = relu(x) + relu(-x)."""
    n = rw.name
    pos, neg, rneg, absx, nabs, e, ep1, lg = (n(h) for h in ("pos", "neg", "rneg", "abs", "nabs", "exp", "ep1", "log"))
    return [helper.make_node("Relu", [x], [pos]), helper.make_node("Neg", [x], [neg]),
            helper.make_node("Relu", [neg], [rneg]), helper.make_node("Add", [pos, rneg], [absx]),
            helper.make_node("Neg", [absx], [nabs]), helper.make_node("Exp", [nabs], [e]),
            helper.make_node("Add", [e, rw.const(1.0, x)], [ep1]), helper.make_node("Log", [ep1], [lg]),
            helper.make_node("Add", [pos, lg], [out])]


def _activations(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    a = attrs(node)
    x, out = node.input[0] if node.input else "", node.output[0] if node.output else ""
    if node.op_type == "Elu":
        return _elu_like(rw, x, out, float(a.get("alpha", 1.0)))
    if node.op_type == "Selu":
        return _elu_like(rw, x, out, float(a.get("alpha", 1.6732632423543772)), float(a.get("gamma", 1.0507009873554805)))
    if node.op_type == "Celu":
        return _elu_like(rw, x, out, float(a.get("alpha", 1.0)), celu=True)
    if node.op_type == "Softplus":
        return _softplus_nodes(rw, x, out)
    if node.op_type == "Mish":  # x * tanh(softplus(x))
        sp, th = rw.name("sp"), rw.name("tanh")
        return _softplus_nodes(rw, x, sp) + [helper.make_node("Tanh", [sp], [th]),
                                             helper.make_node("Mul", [x, th], [out])]
    return None


def _average_pool(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    if node.op_type != "AveragePool" or node.domain not in ("", "ai.onnx"):
        return None
    a = attrs(node)
    x, out = node.input[0], node.output[0]
    shape = rw.shape(x)
    why = "AveragePool's gradient kernel crashes onnxruntime-training 1.19.2 (SIGFPE); streamfit rewrites it into a Conv"
    if shape is None or len(shape) < 3 or shape[1] is None:
        raise ModelError(f"{why}, which needs the channel count of {x!r} (node {node.name or out!r}); "
                         f"shape inference gave {shape}")
    if a.get("ceil_mode", 0):
        raise ModelError(f"{why}, which cannot express ceil_mode=1 (node {node.name or out!r})")
    kernel = list(a["kernel_shape"])
    channels = int(shape[1])
    conv_attrs: dict[str, Any] = {"kernel_shape": kernel, "group": channels}
    for key in ("strides", "pads", "dilations"):
        if key in a:
            conv_attrs[key] = list(a[key])
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", ""):
        conv_attrs["auto_pad"] = auto_pad
    padded = any(conv_attrs.get("pads", [])) or auto_pad in ("SAME_UPPER", "SAME_LOWER")
    size = int(np.prod(kernel))
    if not padded or a.get("count_include_pad", 0):
        weight = rw.const(np.full([channels, 1] + kernel, 1.0 / size), x)
        return [helper.make_node("Conv", [x, weight], [out], name=node.name, **conv_attrs)]
    # count_include_pad=0 with padding: the sum over the window divided by the count of real elements in it
    ones_w = rw.const(np.ones([channels, 1] + kernel), x)
    total, shp, ones, count = rw.name("sum"), rw.name("shape"), rw.name("ones"), rw.name("count")
    fill = helper.make_tensor("value", rw.elem(x), [1], [1.0])
    return [helper.make_node("Conv", [x, ones_w], [total], **conv_attrs),
            helper.make_node("Shape", [x], [shp]),
            helper.make_node("ConstantOfShape", [shp], [ones], value=fill),
            helper.make_node("Conv", [ones, ones_w], [count], **conv_attrs),
            helper.make_node("Div", [total, count], [out], name=node.name)]


def _reduce_extreme(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    if node.op_type not in ("ReduceMax", "ReduceMin") or node.domain not in ("", "ai.onnx"):
        return None
    a = attrs(node)
    axes = a.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        inits = {i.name: i for i in rw.model.graph.initializer}
        if node.input[1] not in inits:
            return None
        axes = numpy_helper.to_array(inits[node.input[1]]).tolist()
    if not axes:
        return None  # all axes: left to ORT (which refuses it, naming the node)
    x, out = node.input[0], node.output[0]
    k = rw.name("k")
    rw.consts.append(numpy_helper.from_array(np.array([1], np.int64), k))
    keep = a.get("keepdims", 1)
    nodes, current = [], x
    for i, axis in enumerate(axes):  # the extreme over several axes: one axis after the other
        values = out if keep and i == len(axes) - 1 else rw.name("top")
        nodes.append(helper.make_node("TopK", [current, k], [values, rw.name("idx")], axis=int(axis),
                                      largest=int(node.op_type == "ReduceMax")))
        current = values
    if not keep:
        ax = rw.name("axes")
        rw.consts.append(numpy_helper.from_array(np.array(axes, np.int64), ax))
        nodes.append(helper.make_node("Squeeze", [current, ax], [out]))
    return nodes


_REWRITES: list[Callable[[ShapedRewriter, NodeProto], "list[NodeProto] | None"]] = [
    _layernorm, _activations, hard_activations, _average_pool, _reduce_extreme, bidirectional_rnn]


def make_trainable(model: ModelProto, notes: list[str], *, freeze_batchnorm: bool = False, seed: int = 0,
                   running_stats: "list | None" = None) -> ModelProto:
    """A copy of ``model`` whose ops all have sound gradients in onnxruntime-training 1.19.2 (see module doc),
    with BatchNormalization and Dropout in training semantics (:mod:`streamfit._engine.prepare.running_stats`).

    ``notes`` gets one line per kind of rewrite, ``running_stats`` one :class:`RunningStats` per
    BatchNormalization that training updates.  Raises :class:`ModelError` for an op it must refuse.
    """
    out = ModelProto()
    out.CopyFrom(model)
    rw = ShapedRewriter(out)
    found: list = [] if running_stats is None else running_stats
    dropouts = 0
    for node in out.graph.node:
        if node.op_type in REFUSED:
            raise ModelError(f"node {node.name or node.output[0]!r} ({node.op_type}): {REFUSED[node.op_type]}")
    done: dict[str, int] = {}
    nodes: list[NodeProto] = []
    for node in out.graph.node:
        new = None
        if node.domain in ("", "ai.onnx") and node.op_type == "BatchNormalization":
            new = rewrite_batchnorm(rw, node, freeze_batchnorm, found)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Dropout":
            new = training_dropout(rw, node, seed + dropouts)
            dropouts += 1
        for rewrite in ([] if new is not None else _REWRITES):
            new = rewrite(rw, node)
            if new is not None:
                break
        if new is None or new == [node]:
            nodes.append(node)
            if new is not None:
                done[node.op_type] = done.get(node.op_type, 0) + 1
            continue
        nodes.extend(new)
        done[node.op_type] = done.get(node.op_type, 0) + 1
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(rw.consts)
    used = {name for node in out.graph.node for name in node.input} | {o.name for o in out.graph.output}
    live = [n for n in out.graph.node if n.op_type != "Constant" or any(o in used for o in n.output)]
    del out.graph.node[:]
    out.graph.node.extend(live)
    kept = [i for i in out.graph.initializer if i.name in used]  # e.g. statistics the rewritten BN no longer reads
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    for op, count in sorted(done.items()):
        notes.append(f"{op} x{count} rewritten for training")
    return out

