"""Binary log loss on raw scores (logits), labels 0/1: the loss of logistic regression."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["BinaryLogLoss"]


class BinaryLogLoss(Loss):
    """``log(1 + exp(z)) - t * z`` computed stably; dL/dz = sigmoid(z) - t.

    >>> import numpy as np
    >>> round(BinaryLogLoss().numpy(np.array([[0.0]]), np.array([[1.0]]))[0], 6)
    0.693147
    """

    name = "log_loss"

    def terms(self, b: GraphBuilder, z: str, t: str) -> tuple[str, str]:
        # softplus(z) = max(z, 0) + log(1 + exp(-|z|)), stable for any z
        softplus = b.op("Add", b.op("Relu", z),
                        b.op("Log", b.op("Add", b.const(1.0), b.op("Exp", b.op("Neg", b.op("Abs", z))))))
        return b.op("Sub", softplus, b.op("Mul", t, z)), b.op("Sub", b.op("Sigmoid", z), t)

    def numpy_terms(self, z: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        softplus = np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))
        return softplus - t * z, 1.0 / (1.0 + np.exp(-z)) - t
