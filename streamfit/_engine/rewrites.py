"""Rewrites of ORT's generated gradient graph: kernels missing for float64, and slow kernels.

ORT's CPU provider registers ``FusedMatMul`` for float only, so float64 models need it spelled out
as Transpose + MatMul.  The contrib ``ReluGrad`` CPU kernel is single-threaded and slow (about half of
an MLP step at batch 2048 here); ``dY * clip(Y * 2**126, 0, 1)`` computes the same mask with
multi-threaded elementwise kernels.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, helper, numpy_helper

__all__ = ["decompose_fused_matmul", "replace_relu_grad", "float64_activation_grads"]


def _const(model: ModelProto, name: str, value: np.ndarray) -> str:
    if not any(init.name == name for init in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _replace(model: ModelProto, rewrite) -> int:  # type: ignore[no-untyped-def]
    nodes = []
    count = 0
    for node in model.graph.node:
        new = rewrite(node)
        if new is None:
            nodes.append(node)
        else:
            nodes.extend(new)
            count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def _attrs(node) -> dict:  # type: ignore[no-untyped-def]
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def decompose_fused_matmul(model: ModelProto, dtype: np.dtype) -> int:
    """FusedMatMul(A, B) -> alpha * MatMul(op(A), op(B)) with explicit Transposes (2-D operands)."""

    def rewrite(node):  # type: ignore[no-untyped-def]
        if node.op_type != "FusedMatMul" or node.domain != "com.microsoft":
            return None
        attrs = _attrs(node)
        if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
            return None
        out, nodes = node.output[0], []
        a, b = node.input[0], node.input[1]
        if attrs.get("transA", 0):
            nodes.append(helper.make_node("Transpose", [a], [out + "_sfA"], perm=[1, 0]))
            a = out + "_sfA"
        if attrs.get("transB", 0):
            nodes.append(helper.make_node("Transpose", [b], [out + "_sfB"], perm=[1, 0]))
            b = out + "_sfB"
        alpha = float(attrs.get("alpha", 1.0))
        if alpha == 1.0:
            nodes.append(helper.make_node("MatMul", [a, b], [out]))
        else:
            nodes.append(helper.make_node("MatMul", [a, b], [out + "_sfM"]))
            scale = _const(model, f"sf_alpha_{alpha!r}", np.array(alpha, dtype))
            nodes.append(helper.make_node("Mul", [out + "_sfM", scale], [out]))
        return nodes

    return _replace(model, rewrite)


def replace_relu_grad(model: ModelProto, dtype: np.dtype) -> int:
    """ReluGrad(dY, Y) -> dY * clip(Y * 2**(max exponent), 0, 1): 1 where Y > 0 (Y is a Relu output)."""
    big = _const(model, "sf_relu_big", np.array(2.0 ** (126 if dtype == np.float32 else 1022), dtype))
    zero = _const(model, "sf_zero", np.array(0, dtype))
    one = _const(model, "sf_one", np.array(1, dtype))

    def rewrite(node):  # type: ignore[no-untyped-def]
        if node.op_type != "ReluGrad" or node.domain != "com.microsoft":
            return None
        dy, y = node.input[0], node.input[1]
        out = node.output[0]
        return [helper.make_node("Mul", [y, big], [out + "_sfbig"]),
                helper.make_node("Clip", [out + "_sfbig", zero, one], [out + "_sfmask"]),
                helper.make_node("Mul", [dy, out + "_sfmask"], [out])]

    return _replace(model, rewrite)


def float64_activation_grads(model: ModelProto, dtype: np.dtype) -> int:
    """TanhGrad / SigmoidGrad spelled out (their CPU kernels are float only)."""
    one = _const(model, "sf_one", np.array(1, dtype))

    def rewrite(node):  # type: ignore[no-untyped-def]
        if node.domain != "com.microsoft" or node.op_type not in ("TanhGrad", "SigmoidGrad"):
            return None
        dy, y = node.input[0], node.input[1]
        out = node.output[0]
        if node.op_type == "TanhGrad":  # dY * (1 - Y^2)
            return [helper.make_node("Mul", [y, y], [out + "_sfyy"]),
                    helper.make_node("Sub", [one, out + "_sfyy"], [out + "_sfd"]),
                    helper.make_node("Mul", [dy, out + "_sfd"], [out])]
        return [helper.make_node("Sub", [one, y], [out + "_sfd"]),  # dY * Y * (1 - Y)
                helper.make_node("Mul", [y, out + "_sfd"], [out + "_sfyd"]),
                helper.make_node("Mul", [dy, out + "_sfyd"], [out])]

    return _replace(model, rewrite)
