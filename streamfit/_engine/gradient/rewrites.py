"""Rewrites of ORT's generated gradient graph: kernels missing for float64, and slow kernels.

ORT's CPU provider registers ``FusedMatMul`` for float only, so float64 models need it spelled out
as Transpose + MatMul.  The contrib ``ReluGrad`` CPU kernel is single-threaded and slow (about half of
an MLP step at batch 2048 here); ``dY * clip(Y * 2**126, 0, 1)`` computes the same mask with
multi-threaded elementwise kernels (one ``HardSigmoid`` for float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import add_const, attrs, rename_tensor, replace_nodes
from streamfit._engine.gradient.activations import RELU_BIG, relu_grad, sigmoid_grad, tanh_grad

__all__ = ["decompose_fused_matmul", "replace_relu_grad", "float64_activation_grads", "shape_table",
           "propagate_matmul_shapes", "simplify_broadcast_gradients", "remove_noop_reshapes", "bias_grads_as_matmul"]


def decompose_fused_matmul(model: ModelProto, dtype: np.dtype) -> int:
    """FusedMatMul(A, B) -> alpha * MatMul(op(A), op(B)) with explicit Transposes (2-D operands)."""

    def rewrite(node):  # type: ignore[no-untyped-def]
        if node.op_type != "FusedMatMul" or node.domain != "com.microsoft":
            return None
        at = attrs(node)
        if at.get("transBatchA", 0) or at.get("transBatchB", 0):
            return None
        out, nodes = node.output[0], []
        a, b = node.input[0], node.input[1]
        if at.get("transA", 0):
            nodes.append(helper.make_node("Transpose", [a], [out + "_sfA"], perm=[1, 0]))
            a = out + "_sfA"
        if at.get("transB", 0):
            nodes.append(helper.make_node("Transpose", [b], [out + "_sfB"], perm=[1, 0]))
            b = out + "_sfB"
        alpha = float(at.get("alpha", 1.0))
        if alpha == 1.0:
            nodes.append(helper.make_node("MatMul", [a, b], [out]))
        else:
            nodes.append(helper.make_node("MatMul", [a, b], [out + "_sfM"]))
            scale = add_const(model, f"sf_alpha_{alpha!r}", np.array(alpha, dtype))
            nodes.append(helper.make_node("Mul", [out + "_sfM", scale], [out]))
        return nodes

    return replace_nodes(model, rewrite)


class _NodeList:
    """Nodes replacing one node, their intermediates named after its output (``<out>_sf<hint>``), and the
    graph's constants by name (added to the model beforehand): the ``op``/``const`` of :mod:`.activations`."""

    def __init__(self, out: str, consts: dict[str, str]) -> None:
        self.out, self.consts = out, consts
        self.nodes: list[NodeProto] = []

    def op(self, op_type: str, inputs: list[str], out: str | None = None, *, hint: str = "", **attrs: Any) -> str:
        out = out or f"{self.out}_sf{hint}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def const(self, name: str, value: float) -> str:
        return self.consts[name]


def replace_relu_grad(model: ModelProto, dtype: np.dtype) -> int:
    """ReluGrad(dY, Y) -> :func:`~streamfit._engine.gradient.activations.relu_grad` (multi-threaded kernels)."""
    consts = {} if np.dtype(dtype) == np.float32 else {
        name: add_const(model, name, np.array(value, dtype))
        for name, value in ((Names.relu_big, RELU_BIG), (Names.zero, 0), (Names.one, 1))}

    def rewrite(node):  # type: ignore[no-untyped-def]
        if node.op_type != "ReluGrad" or node.domain != "com.microsoft":
            return None
        nodes = _NodeList(node.output[0], consts)
        relu_grad(nodes.op, nodes.const, dtype, node.input[0], node.input[1], node.output[0])
        return nodes.nodes

    return replace_nodes(model, rewrite)


def float64_activation_grads(model: ModelProto, dtype: np.dtype) -> int:
    """TanhGrad / SigmoidGrad spelled out (:mod:`.activations`), SplitTraining (Concat's gradient) as a standard
    Split (their CPU kernels are float only)."""
    consts = {Names.one: add_const(model, Names.one, np.array(1, dtype))}

    def rewrite(node):  # type: ignore[no-untyped-def]
        if node.domain == "com.microsoft" and node.op_type == "SplitTraining":  # (x, split sizes), axis
            return [helper.make_node("Split", list(node.input), list(node.output), **attrs(node))]
        if node.domain != "com.microsoft" or node.op_type not in ("TanhGrad", "SigmoidGrad"):
            return None
        nodes = _NodeList(node.output[0], consts)
        grad = tanh_grad if node.op_type == "TanhGrad" else sigmoid_grad
        grad(nodes.op, nodes.const, node.input[0], node.input[1], node.output[0])
        return nodes.nodes

    return replace_nodes(model, rewrite)


# -- static simplification of ORT's generic gradient chains --------------------------------------------

Dim = "int | str | None"


def shape_table(forward: ModelProto, weights: dict[str, np.ndarray]) -> dict[str, list]:
    """Static shapes (ints, symbols or None per dim) of forward tensors and of their ``*_grad`` twins."""
    import onnx

    named = ModelProto()
    named.CopyFrom(forward)
    for vi in named.graph.input:  # an unnamed batch dimension gets a symbol, so tensors sharing it are known
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and dims and not dims[0].HasField("dim_value") and not dims[0].dim_param:
            dims[0].dim_param = Names.batch_dim
    try:
        inferred = onnx.shape_inference.infer_shapes(named)
    except Exception:  # shape inference is best effort: no table, no rewrite
        return {}
    table: dict[str, list] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            table[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    for init in inferred.graph.initializer:
        table[init.name] = list(init.dims)
    for name, arr in weights.items():
        table[name] = list(arr.shape)
    for name in list(table):
        table.setdefault(f"{name}_grad", table[name])
    return table


def propagate_matmul_shapes(model: ModelProto, table: dict[str, list]) -> None:
    """Add the 2-D output shapes of the gradient graph's MatMul/FusedMatMul/Gemm nodes to ``table``."""
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "FusedMatMul", "Gemm") or len(node.input) < 2:
            continue
        a, b = table.get(node.input[0]), table.get(node.input[1])
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            continue
        at = attrs(node)
        if at.get("transBatchA", 0) or at.get("transBatchB", 0):
            continue
        rows = a[1] if at.get("transA", 0) else a[0]
        cols = b[0] if at.get("transB", 0) else b[1]
        table.setdefault(node.output[0], [rows, cols])


def _static_reduce_axes(sx: list, so: list) -> list[int] | None:
    """Axes to sum a broadcast gradient over, when shapes decide it statically (leading axes only)."""
    if sx is None or so is None or len(sx) > len(so):
        return None
    lead = len(so) - len(sx)
    for i, d in enumerate(sx):
        o = so[lead + i]
        if d is None or o is None or d != o:
            return None  # a broadcast inside the trailing dims, or unknown: leave ORT's generic chain
    return list(range(lead))


def _consumers(model: ModelProto) -> dict[str, list]:
    uses: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    return uses


def _producers(model: ModelProto) -> dict[str, NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _remove_dead(model: ModelProto) -> None:
    keep = {o.name for o in model.graph.output}
    while True:
        used = {name for node in model.graph.node for name in node.input} | keep
        alive = [n for n in model.graph.node if any(o in used for o in n.output) or not n.output]
        if len(alive) == len(model.graph.node):
            break
        del model.graph.node[:]
        model.graph.node.extend(alive)
    used = {name for node in model.graph.node for name in node.input}
    inits = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)


def _reduction_chain(uses: dict[str, list], axes_name: str, shape_out: str) -> list[tuple[NodeProto, NodeProto]] | None:
    """The ``ReduceSum(g, axes) -> Reshape(shape)`` pairs reading one side's reduction axes, or None when a use of
    the axes is anything else (ORT's generic chain is then left as it is)."""
    chain = []
    for red in uses.get(axes_name, []):
        if red.op_type != "ReduceSum" or red.input[1] != axes_name:
            return None
        reshapes = uses.get(red.output[0], [])
        if len(reshapes) != 1 or reshapes[0].op_type != "Reshape" or reshapes[0].input[1] != shape_out:
            return None
        chain.append((red, reshapes[0]))
    return chain


def simplify_broadcast_gradients(model: ModelProto, shapes: dict[str, list]) -> int:
    """Replace Shape/BroadcastGradientArgs/ReduceSum/Reshape chains by static reductions.

    For ``Y = Add(XW, B)`` with B of shape [k] and XW of shape [N, k], ORT emits six nodes to find at run
    time that dB = ReduceSum(dY, axis 0) and dXW = dY; when the shapes say so statically, one ReduceSum
    (or nothing) does.  Node overhead dominates small batches, and XW no longer feeds a Shape node, so
    ORT can fuse MatMul + Add into one Gemm.
    """
    producers = _producers(model)
    uses = _consumers(model)
    count = 0
    for node in list(model.graph.node):
        if node.op_type != "BroadcastGradientArgs":
            continue
        shape_nodes = [s for s in (producers.get(name) for name in node.input) if s is not None and s.op_type == "Shape"]
        if len(shape_nodes) != len(node.input):
            continue
        tensors = [s.input[0] for s in shape_nodes]
        sa, sb = shapes.get(tensors[0]), shapes.get(tensors[1])
        if sa is None or sb is None:
            continue
        so = sa if len(sa) >= len(sb) else sb  # the broadcast output shape, when one side already is it
        plans: list[tuple[list[int], list[tuple[NodeProto, NodeProto]]]] = []
        for axes_name, sx, shape_out in zip(node.output, (sa, sb), (s.output[0] for s in shape_nodes)):
            if not axes_name:  # that side's gradient is not needed
                plans.append(([], []))
                continue
            axes = _static_reduce_axes(sx, so)
            chain = None if axes is None else _reduction_chain(uses, axes_name, shape_out)
            if axes is None or chain is None:
                break
            plans.append((axes, chain))
        if len(plans) != 2:
            continue
        new_nodes = []
        for axes, chain in plans:
            for red, reshape in chain:
                grad_in, grad_out = red.input[0], reshape.output[0]
                model.graph.node.remove(red)
                model.graph.node.remove(reshape)
                if axes:
                    axes_const = add_const(model, Names.axes(axes), np.array(axes, np.int64))
                    new_nodes.append(helper.make_node("ReduceSum", [grad_in, axes_const], [grad_out], keepdims=0,
                                                      name=Names.reduce(grad_out)))
                else:
                    rename_tensor(model.graph.node, grad_out, grad_in, outputs=False)
                    for out in model.graph.output:
                        if out.name == grad_out:  # a graph output keeps its name
                            new_nodes.append(helper.make_node("Identity", [grad_in], [grad_out]))
        model.graph.node.extend(new_nodes)
        count += 1
    if count:
        _remove_dead(model)
    return count


def remove_noop_reshapes(model: ModelProto, shapes: dict[str, list], protect: "set[str] | frozenset[str]" = frozenset()) -> int:
    """Drop ``Reshape(x, [-1, k])`` when x is already 2-D with last dimension k (MatMul_Grad emits them).

    ``protect``: tensor names that must survive (the model's output).
    """
    inits = {i.name: i for i in model.graph.initializer}
    graph_outputs = {o.name for o in model.graph.output} | set(protect)
    count = 0
    for node in list(model.graph.node):
        if node.op_type != "Reshape" or node.input[1] not in inits or node.output[0] in graph_outputs:
            continue
        target = numpy_helper.to_array(inits[node.input[1]]).tolist()
        shape = shapes.get(node.input[0])
        if shape is None or len(shape) != len(target) or target.count(-1) > 1 or 0 in target:
            continue
        if all(t == -1 or (isinstance(d, int) and d == t) for d, t in zip(shape, target)):
            model.graph.node.remove(node)
            rename_tensor(model.graph.node, node.output[0], node.input[0], outputs=False)
            count += 1
    if count:
        _remove_dead(model)
    return count


ONES = Names.ones


def bias_grads_as_matmul(model: ModelProto, dtype: np.dtype, shapes: dict[str, list] | None = None,
                         batch_dim: "int | str | None" = None) -> int:
    """``ReduceSum(dZ, axes=[0])`` over a large batch -> ``MatMul(ones, dZ)``: a GEMV runs on all
    threads where ORT's ReduceSum over axis 0 runs on one.

    Where the shapes prove that dZ has one row per batch row (its first dimension is the model input's
    symbolic batch dimension ``batch_dim``), ``ones`` is the graph input ``sf_ones`` ([N], filled once per
    batch shape).  Elsewhere (a Gemm inside attention runs on ``batch x sequence`` rows) the ones vector
    is made from dZ's own row count, so the rewrite never assumes a row count it cannot see.
    """
    shapes = shapes or {}
    count = 0
    fed = False
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    extra = []
    for node in model.graph.node:
        if node.op_type != "ReduceSum" or not Names.is_reduce(node.name):
            continue
        if attrs(node).get("keepdims", 1) != 0 or len(node.input) < 2 or node.input[1] != Names.axes([0]):
            continue
        grad = node.input[0]
        shape = shapes.get(grad)
        if isinstance(batch_dim, str) and shape and len(shape) == 2 and shape[0] == batch_dim:
            ones = ONES
            fed = True
        else:  # ones[rows of dZ]: Shape -> Slice [0:1] -> ConstantOfShape(1)
            rows, ones = f"{node.name}_rows", f"{node.name}_ones"
            start = add_const(model, "sf_i64_0", np.array([0], np.int64))
            stop = add_const(model, "sf_i64_1", np.array([1], np.int64))
            extra += [helper.make_node("Shape", [grad], [f"{rows}_shape"]),
                      helper.make_node("Slice", [f"{rows}_shape", start, stop], [rows]),
                      helper.make_node("ConstantOfShape", [rows], [ones],
                                       value=helper.make_tensor("value", elem, [1], [1.0]))]
        node.op_type = "MatMul"
        del node.attribute[:]
        del node.input[:]
        node.input.extend([ones, grad])
        count += 1
    model.graph.node.extend(extra)  # ordered by the fused build's toposort
    if fed:
        model.graph.input.append(helper.make_tensor_value_info(ONES, elem, ["N"]))
    if count:
        _remove_dead(model)
    return count
