"""BatchNormalization with PyTorch's semantics, and Dropout active in training only.

onnxruntime-training's gradient graph runs ``BatchNormalization`` in training mode and never updates its
running statistics, so without this module ``predict`` and the exported model use the initial statistics
while training normalized with batch statistics.  streamfit does what PyTorch does instead:

- training steps normalize each batch with its own statistics (biased variance), written as explicit ops
  in the training copy of the model (their gradients are ORT's ReduceMean/Sqrt/Div gradients);
- each applied step updates the running mean and variance: ``new = (1 - m) * old + m * batch`` with
  PyTorch's momentum ``m`` (ONNX's ``momentum`` attribute is ``1 - m``) and the unbiased batch variance;
- ``predict``, progressive validation and ``to_onnx()`` run the author's ``BatchNormalization`` in
  inference mode on the running statistics, which are part of the trainer's state (checkpointed);
- ``freeze_batchnorm=True`` instead trains through the running statistics as constants and never updates
  them (the usual choice for fine-tuning).

``Dropout`` runs with ``training_mode=True`` in the training copy (seeded: the same seed gives the same
masks) and as the identity in the inference copy, whatever the exported model said.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import ShapedRewriter, attrs, default_opset
from streamfit.exceptions import ModelError

__all__ = ["RunningStats", "rewrite_batchnorm", "training_dropout", "eval_semantics", "emit_running_stats",
           "running_stats_model"]


@dataclass(frozen=True)
class RunningStats:
    """One BatchNormalization's running statistics and the tensors of the training graph that update them."""

    node: str  # the BatchNormalization node (for messages)
    mean: str  # initializer names: the buffers kept beside the weights
    var: str
    batch_mean: str  # [1, C, 1, ...] batch mean in the training graph
    batch_var: str  # [1, C, 1, ...] biased batch variance
    centered: str  # the input minus its batch mean: its size / C is the count per channel
    channels: int
    momentum: float  # PyTorch's: new = (1 - momentum) * old + momentum * batch
    spatial: int | None  # product of the dims after the channel (None: not static)


def _reduce_mean(rw: ShapedRewriter, x: str, out: str, axes: list[int]) -> NodeProto:
    if default_opset(rw.model) >= 18:
        name = rw.name("axes")
        rw.consts.append(numpy_helper.from_array(np.array(axes, np.int64), name))
        return helper.make_node("ReduceMean", [x, name], [out], keepdims=1)
    return helper.make_node("ReduceMean", [x], [out], axes=axes, keepdims=1)


def rewrite_batchnorm(rw: ShapedRewriter, node: NodeProto, freeze: bool, found: list[RunningStats]) -> list[NodeProto]:
    """Explicit ops for one BatchNormalization of the training copy (batch statistics, or frozen ones)."""
    a = attrs(node)
    x, scale, bias, mean, var = (list(node.input) + [""] * 5)[:5]
    out = node.output[0]
    where = f"BatchNormalization node {node.name or out!r}"
    inits = {i.name: i for i in rw.model.graph.initializer}
    if mean not in inits or var not in inits:
        raise ModelError(f"{where}: its running mean and variance must be initializers, got {mean!r}, {var!r}")
    shape = rw.shape(x)
    channels = int(inits[mean].dims[0]) if inits[mean].dims else 1
    if shape is None or len(shape) < 2:
        raise ModelError(f"{where}: the rank of its input {x!r} is not known statically (shape inference: {shape})")
    rank = len(shape)
    eps = float(a.get("epsilon", 1e-5))
    view = rw.name("cshape")
    rw.consts.append(numpy_helper.from_array(np.array([1, channels] + [1] * (rank - 2), np.int64), view))
    n = rw.name
    scale_v, bias_v, yhat, ys = n("scale"), n("bias"), n("xhat"), n("ys")
    nodes = [helper.make_node("Reshape", [scale, view], [scale_v]), helper.make_node("Reshape", [bias, view], [bias_v])]
    if freeze:  # (x - running mean) / sqrt(running var + eps): constants, gradients to x, scale and bias only
        rm = numpy_helper.to_array(inits[mean]).reshape([1, channels] + [1] * (rank - 2))
        rv = numpy_helper.to_array(inits[var]).reshape(rm.shape)
        centered = n("centered")
        nodes += [helper.make_node("Sub", [x, rw.const(rm, x)], [centered]),
                  helper.make_node("Mul", [centered, rw.const(1.0 / np.sqrt(rv + eps), x)], [yhat])]
    else:
        axes = [0] + list(range(2, rank))
        batch_mean, centered, sq, batch_var, ve, std = n("bmean"), n("centered"), n("sq"), n("bvar"), n("ve"), n("std")
        nodes += [_reduce_mean(rw, x, batch_mean, axes), helper.make_node("Sub", [x, batch_mean], [centered]),
                  helper.make_node("Mul", [centered, centered], [sq]), _reduce_mean(rw, sq, batch_var, axes),
                  helper.make_node("Add", [batch_var, rw.const(eps, x)], [ve]), helper.make_node("Sqrt", [ve], [std]),
                  helper.make_node("Div", [centered, std], [yhat])]
        dims = shape[2:]
        spatial = int(np.prod(dims)) if all(isinstance(d, int) for d in dims) else None
        found.append(RunningStats(node.name or out, mean, var, batch_mean, batch_var, centered, channels,
                                  1.0 - float(a.get("momentum", 0.9)), spatial))
    nodes += [helper.make_node("Mul", [yhat, scale_v], [ys]), helper.make_node("Add", [ys, bias_v], [out])]
    return nodes


def training_dropout(rw: ShapedRewriter, node: NodeProto, seed: int) -> list[NodeProto]:
    """Dropout with ``training_mode=True`` and a seed of its own (opset >= 12 form)."""
    ratio = node.input[1] if len(node.input) > 1 and node.input[1] else ""
    if not ratio:
        ratio = rw.name("ratio")
        rw.consts.append(numpy_helper.from_array(np.array(0.5, np.float32), ratio))
    on = rw.name("training")
    rw.consts.append(numpy_helper.from_array(np.array(True), on))
    kept = {k: v for k, v in attrs(node).items() if k != "seed"}
    outputs = [node.output[0], node.output[1] if len(node.output) > 1 and node.output[1] else rw.name("mask")]
    return [helper.make_node("Dropout", [node.input[0], ratio, on], outputs, name=node.name, seed=int(seed), **kept)]


def eval_semantics(model: ModelProto) -> int:
    """The inference copy in place: BatchNormalization in inference mode (one output), Dropout off."""
    count = 0
    off = Names.dropout_off
    needs_off = False
    for node in model.graph.node:
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            mode = [at for at in node.attribute if at.name == "training_mode"]
            if (mode and mode[0].i) or len(node.output) > 1:
                for at in mode:
                    at.i = 0
                del node.output[1:]
                count += 1
        elif node.op_type == "Dropout" and node.domain in ("", "ai.onnx") and len(node.input) > 2 and node.input[2]:
            node.input[2] = off
            needs_off = True
            count += 1
    if needs_off and not any(i.name == off for i in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(np.array(False), off))
    return count


def emit_running_stats(b: GraphBuilder, stats: Sequence[RunningStats], names: Any
                       ) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Nodes computing each running statistic's new value from the batch statistics of the training graph.

    Inputs are the buffers (``mean``, ``var``, [C]); outputs ``names.new(buffer)``.
    """
    elem = b.elem
    inputs, outputs = [], []
    flat = b.const(np.array([-1], np.int64), np.int64)
    for s in stats:
        m, keep = b.const(s.momentum), b.const(1.0 - s.momentum)
        count = b.op("Div", b.op("Cast", b.op("Size", s.centered), to=elem), b.const(float(s.channels)))
        unbiased = b.op("Div", count, b.op("Sub", count, b.const(1.0)))  # n / (n - 1), as PyTorch
        batch_mean = b.op("Reshape", s.batch_mean, flat)
        batch_var = b.op("Mul", b.op("Reshape", s.batch_var, flat), unbiased)
        for buf, batch in ((s.mean, batch_mean), (s.var, batch_var)):
            b.op("Add", b.op("Mul", buf, keep), b.op("Mul", batch, m), out=names.new(buf))
            inputs.append(helper.make_tensor_value_info(buf, elem, [s.channels]))
            outputs.append(helper.make_tensor_value_info(names.new(buf), elem, [s.channels]))
    return inputs, outputs


def running_stats_model(training: ModelProto, inputs: Sequence[str], weights: Sequence[str],
                        stats: Sequence[RunningStats], dtype: Any, names: Any) -> ModelProto:
    """The training copy's forward with the running-statistics update as its only outputs (the
    forward/backward strategy runs it beside the TrainingAgent, which has no place for extra outputs)."""
    model = ModelProto()
    model.CopyFrom(training)
    graph = model.graph
    b = GraphBuilder(dtype, prefix="sf_rs_")
    new_inputs, outputs = emit_running_stats(b, stats, names)
    moved = {w for w in weights} | {s.mean for s in stats} | {s.var for s in stats}
    kept = [i for i in graph.initializer if i.name not in moved]
    by_name = {i.name: i for i in graph.initializer}
    del graph.initializer[:]
    graph.initializer.extend(kept + list(b.initializers))
    graph.input.extend(helper.make_tensor_value_info(w, by_name[w].data_type, list(by_name[w].dims)) for w in weights)
    graph.input.extend(new_inputs)
    graph.node.extend(b.nodes)
    del graph.output[:]
    graph.output.extend(outputs)
    return model
