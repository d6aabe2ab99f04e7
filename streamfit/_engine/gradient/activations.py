"""The gradients of Relu, Tanh and Sigmoid in standard ONNX ops, in one home: the rewrites of ORT's
``ReluGrad``/``TanhGrad``/``SigmoidGrad`` (``rewrites.py``) and streamfit's own builder (``autodiff.py``) emit them.

Each takes ``op(op_type, inputs, out=None, *, hint, **attrs) -> output name`` (how its caller adds a node; ``hint``
names an intermediate) and ``const(name, value) -> initializer name`` (a scalar of the graph's dtype).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from streamfit._engine.common.names import Names

__all__ = ["relu_grad", "tanh_grad", "sigmoid_grad", "RELU_BIG", "Op", "Const"]

Op = Callable[..., str]
Const = Callable[[str, float], str]

#: float64's mask scale (2**1022: the largest power of two; float32's is HardSigmoid's alpha 2**126)
RELU_BIG = 2.0 ** 1022


def relu_grad(op: Op, const: Const, dtype: Any, dy: str, y: str, out: str) -> str:
    """dY * clip(Y * 2**(max exponent), 0, 1): dY where Y > 0 (Y is the Relu's output), with multi-threaded
    elementwise kernels (ORT's ``ReluGrad`` CPU kernel is single-threaded).

    float32: the mask is one ``HardSigmoid(Y, alpha=2**126, beta=0)`` (= max(0, min(1, alpha * Y)), the same
    arithmetic in one pass over Y).  float64 keeps Mul + Clip: HardSigmoid's CPU kernel is float only, and
    2**1022 is no float attribute."""
    if np.dtype(dtype) == np.float32:
        mask = op("HardSigmoid", [y], hint="mask", alpha=2.0 ** 126, beta=0.0)
    else:
        big = op("Mul", [y, const(Names.relu_big, RELU_BIG)], hint="big")
        mask = op("Clip", [big, const(Names.zero, 0.0), const(Names.one, 1.0)], hint="mask")
    return op("Mul", [dy, mask], out)


def tanh_grad(op: Op, const: Const, dy: str, y: str, out: str) -> str:
    """dY * (1 - Y^2) (Y is the Tanh's output)."""
    d = op("Sub", [const(Names.one, 1.0), op("Mul", [y, y], hint="yy")], hint="d")
    return op("Mul", [dy, d], out)


def sigmoid_grad(op: Op, const: Const, dy: str, y: str, out: str) -> str:
    """dY * Y * (1 - Y) (Y is the Sigmoid's output)."""
    d = op("Sub", [const(Names.one, 1.0), y], hint="d")
    return op("Mul", [dy, op("Mul", [y, d], hint="yd")], out)
