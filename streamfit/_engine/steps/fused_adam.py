"""Adam's update as one node: onnxruntime-training's own kernel (``com.microsoft.AdamOptimizer``) in a lean step.

A node of a small step costs a fraction of a microsecond whatever it computes, and Adam written in standard ops
is seven of them (two moment Gemms, a square, ``Sqrt``, ``Add``, ``Div``, the weight's Gemm).  The training
build of onnxruntime has a CPU kernel that computes the same rule in one pass: ``m = a m + (1 - a) g``,
``v = b v + (1 - b) g^2``, ``w -= lr * (m / (1 - a^t)) / (sqrt(v / (1 - b^t)) + eps)`` -- PyTorch's Adam, the bias
corrections computed in float64 from the step number ``t``.  The lean steps (:mod:`.scan_dense`,
:mod:`.scan_mlp`) use it where it exists; elsewhere (a plain onnxruntime, an artifact, another device) the
standard nodes stay.

Its results equal those nodes' within float32 rounding, not bit for bit (it rounds ``(1 - b) g g`` and the
corrected ratio in another order). They agree that closely because :class:`~streamfit.optim.Adam` takes its
betas as float32 values, as the kernel does (:meth:`~streamfit.optim.Adam.betas`).

The step number is fed as a float32 (a scanned per-step value or a host scalar, as the optimizer's other
scalars) and cast in the graph; float32 holds every integer up to ``2**24``, and later steps are fed that number:
the kernel's correction is then exactly 1 already, which :func:`applies` checks for the betas it is used with.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._engine.common.names import Names

__all__ = ["STEP", "applies", "kernel_available", "step_numbers", "update"]

#: the host scalar / scanned per-step value: the step's number ``t + 1`` (Adam's ``t`` in its paper), a float
STEP = Names.scalar("adam_step")
#: the largest step number fed (float32 holds every integer up to it)
_LAST = 1 << 24


@functools.lru_cache(maxsize=1)
def kernel_available() -> bool:
    """Whether this onnxruntime runs ``com.microsoft.AdamOptimizer`` on CPU (the training builds do)."""
    import onnxruntime as ort

    from streamfit._engine.common.ort_private import has_ort_training

    if not has_ort_training():
        return False
    f = TensorProto.FLOAT
    names = ["lr", "t", "w", "g", "m", "v"]
    types = [(f, []), (TensorProto.INT64, []), (f, [1]), (f, [1]), (f, [1]), (f, [1])]
    node = helper.make_node("AdamOptimizer", names, ["t2", "m2", "v2", "w2"], domain="com.microsoft")
    graph = helper.make_graph([node], "adam", [helper.make_tensor_value_info(n, *t) for n, t in zip(names, types)],
                              [helper.make_tensor_value_info("w2", f, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        one = np.ones(1, np.float32)
        (w2,) = sess.run(None, {"lr": np.array(0.5, np.float32), "t": np.array(1, np.int64), "w": one, "g": one,
                                "m": 0 * one, "v": 0 * one})
    except Exception:  # noqa: BLE001 - any failure means: not this build
        return False
    return bool(abs(float(w2[0]) - 0.5) < 1e-6)  # 1 - 0.5 * 1 / (1 + eps): the rule as documented


def applies(tr: Any) -> bool:
    """Whether trainer ``tr``'s lean steps may run the kernel: a plain :class:`~streamfit.optim.Adam` (not a
    subclass that changes the rule), float32 weights on CPU, step graphs that need not be portable (nor an
    artifact's), a build that has the kernel, and betas whose float32 powers reach 0 by step ``2**24`` (so the
    step number fed may stop there)."""
    from streamfit.optim import Adam

    opt = tr.optimizer
    if (type(opt) is not Adam or tr.portable or tr.artifact is not None or tr.device.kind != "cpu"
            or tr.dtype != np.float32 or not kernel_available()):
        return False
    return all(0.0 <= b < 1.0 and b ** _LAST == 0.0 for b in opt.betas())


def step_numbers(n_steps: int, steps: int) -> np.ndarray:
    """The step numbers fed for the ``steps`` steps after ``n_steps`` applied ones (float64; the feed casts)."""
    return np.minimum(np.arange(n_steps + 1, n_steps + 1 + steps, dtype=np.float64), float(_LAST))


def step_number(n_steps: int) -> float:
    """The step number fed for the step after ``n_steps`` applied ones."""
    return float(min(n_steps + 1, _LAST))


def update(b: GraphBuilder, opt: Any, w: str, g: str, m: str, v: str, lr: str, step: str) -> tuple[str, str, str]:
    """The new ``w``, ``m`` and ``v`` of one Adam step on gradient ``g`` (all of one shape) at rate ``lr`` (a 0-d
    float) and step number ``step`` (a 0-d float), as one kernel node (and the step number's cast)."""
    t = b.op("Cast", step, to=TensorProto.INT64)
    outs = [b.name(hint) for hint in ("adam_t", "adam_m", "adam_v", "adam_w")]
    b.nodes.append(helper.make_node("AdamOptimizer", [lr, t, w, g, m, v], outs, name=b.name("AdamOptimizer"),
                                    domain="com.microsoft", alpha=opt.betas()[0], beta=opt.betas()[1],
                                    epsilon=float(opt.eps), do_bias_correction=1))
    return outs[3], outs[1], outs[2]
