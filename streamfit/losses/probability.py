"""Log loss on probabilities (a model whose output is already softmax/sigmoid-normalized), class indices."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["ProbabilityLogLoss"]


class ProbabilityLogLoss(Loss):
    """``-log(max(p[t], eps))`` per row; dL/dp = -1 / max(p[t], eps) on the label's column, 0 elsewhere.

    For classifiers that output probabilities (scikit-learn's MLPClassifier or LogisticRegression
    converted by skl2onnx): back through their Softmax this is exactly softmax cross-entropy's
    ``p - onehot(t)``.  Labels are int64 class indices.

    Parameters
    ----------
    eps
        The smallest probability taken for the label's class (keeps ``log`` and its gradient finite when a
        model says 0).

    Examples
    --------
    >>> import numpy as np
    >>> loss, grad = ProbabilityLogLoss().numpy(np.array([[0.25, 0.75]]), np.array([1]))
    >>> round(loss, 6), grad.round(4).tolist()
    (0.287682, [[-0.0, -1.3333]])
    """

    name = "probability_log_loss"
    integer_labels = True

    def __init__(self, eps: float = 1e-7) -> None:
        if not 0 < eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        self.eps = float(eps)

    def terms(self, b: GraphBuilder, p: str, t: str) -> tuple[str, str]:
        depth = b.op("Gather", b.op("Shape", p), b.const(1, np.int64))  # Shape(start=) needs opset 15
        classes = b.op("Range", b.const(0, np.int64), depth, b.const(1, np.int64))
        onehot = b.op("Cast", b.op("Equal", b.op("Unsqueeze", t, b.const([1], np.int64)), classes), to=b.elem)
        p_t = b.op("ReduceSum", b.op("Mul", onehot, p), b.const([1], np.int64), keepdims=1)
        p_t = b.op("Max", p_t, b.const(self.eps))
        return b.op("Neg", b.op("Log", p_t)), b.op("Neg", b.op("Div", onehot, p_t))

    def numpy_terms(self, p: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(t).astype(np.int64).reshape(-1)
        onehot = np.zeros_like(p)
        onehot[np.arange(p.shape[0]), t] = 1.0
        p_t = np.maximum((onehot * p).sum(axis=1, keepdims=True), self.eps)
        return -np.log(p_t), -onehot / p_t
