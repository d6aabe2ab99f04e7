"""HardSigmoid and HardSwish spelled with ops whose gradients onnxruntime-training 1.19.2 has (Mul, Add, Clip).

Neither op has a gradient registered there ("The gradient builder has not been registered: HardSwish"), and
both are in most mobile CNNs (MobileNetV3's activations and squeeze-excitation gates).  The training copy gets
``HardSigmoid(x) = clip(alpha * x + beta, 0, 1)`` and ``HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2)``;
``predict`` and ``to_onnx()`` keep the author's ops.
"""

from __future__ import annotations

from onnx import NodeProto, helper

from streamfit._engine.common.onnx_helpers import ShapedRewriter, attrs

__all__ = ["hard_activations"]


def _hard_sigmoid(rw: ShapedRewriter, x: str, out: str, alpha: float, beta: float) -> list[NodeProto]:
    scaled, shifted = rw.name("hs_ax"), rw.name("hs_axb")
    return [helper.make_node("Mul", [x, rw.const(alpha, x)], [scaled]),
            helper.make_node("Add", [scaled, rw.const(beta, x)], [shifted]),
            helper.make_node("Clip", [shifted, rw.const(0.0, x), rw.const(1.0, x)], [out])]


def hard_activations(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    """The rewrite of one node (None: not a HardSigmoid or HardSwish of the default domain)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("HardSigmoid", "HardSwish"):
        return None
    x, out = node.input[0], node.output[0]
    if node.op_type == "HardSigmoid":
        a = attrs(node)
        return _hard_sigmoid(rw, x, out, float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)))
    gate = rw.name("hswish_gate")
    return _hard_sigmoid(rw, x, gate, 1.0 / 6.0, 0.5) + [helper.make_node("Mul", [x, gate], [out])]
