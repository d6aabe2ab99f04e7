"""Softmax cross-entropy on logits with integer class labels: the multinomial classification loss."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["SoftmaxCrossEntropy"]


class SoftmaxCrossEntropy(Loss):
    """``-log softmax(z)[t]`` per row; dL/dz = softmax(z) - onehot(t).  Labels are int64 class indices.

    >>> import numpy as np
    >>> round(SoftmaxCrossEntropy().numpy(np.zeros((1, 4)), np.array([2]))[0], 6)
    1.386294
    """

    name = "softmax_cross_entropy"
    integer_labels = True

    def terms(self, b: GraphBuilder, z: str, t: str) -> tuple[str, str]:
        # onehot(t) = (arange(k) == t[:, None]); ORT's CPU OneHot has no float64 kernel, this works for both
        depth = b.op("Gather", b.op("Shape", z), b.const(1, np.int64))  # Shape(start=) needs opset 15
        classes = b.op("Range", b.const(0, np.int64), depth, b.const(1, np.int64))
        hit = b.op("Equal", b.op("Unsqueeze", t, b.const([1], np.int64)), classes)
        onehot = b.op("Cast", hit, to=b.elem)
        logp = b.op("LogSoftmax", z, axis=-1)
        per_row = b.op("Neg", b.op("ReduceSum", b.op("Mul", onehot, logp), b.const([1], np.int64), keepdims=1))
        return per_row, b.op("Sub", b.op("Softmax", z, axis=-1), onehot)

    def numpy_terms(self, z: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(t).astype(np.int64).reshape(-1)
        zmax = z.max(axis=1, keepdims=True)
        logp = z - zmax - np.log(np.exp(z - zmax).sum(axis=1, keepdims=True))
        onehot = np.zeros_like(z)
        onehot[np.arange(z.shape[0]), t] = 1.0
        return -(onehot * logp).sum(axis=1, keepdims=True), np.exp(logp) - onehot
