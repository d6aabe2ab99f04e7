"""Hinge loss ``max(0, threshold - y z)`` on raw scores, labels 0/1 (``y = 2t - 1``): linear SVMs, Perceptron."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["Hinge"]


def signed(b: GraphBuilder, t: str) -> str:
    """``2 t - 1``: labels 0/1 as -1/+1 (shared by the margin losses)."""
    return b.op("Sub", b.op("Mul", t, b.const(2.0)), b.const(1.0))


class Hinge(Loss):
    """``max(0, threshold - y z)``; dL/dz = -y where ``y z <= threshold`` (scikit-learn's subgradient), else 0.

    ``threshold=1`` is the SVM's hinge, ``threshold=0`` the perceptron's loss.  On several score columns
    each column is a one-vs-rest problem (labels one-hot 0/1) and the row's loss is their sum.

    Parameters
    ----------
    threshold
        The margin a score must pass to cost nothing: 1 for the SVM's hinge, 0 for the perceptron's loss.

    Examples
    --------
    >>> import numpy as np
    >>> Hinge().numpy(np.array([[0.25], [2.0]]), np.array([[1.0], [0.0]]))
    (1.875, array([[-0.5],
           [ 0.5]]))
    """

    name = "hinge"

    def __init__(self, threshold: float = 1.0) -> None:
        if not threshold >= 0:
            raise ValueError(f"threshold must be >= 0, got {threshold!r}")
        self.threshold = float(threshold)

    def terms(self, b: GraphBuilder, z: str, t: str) -> tuple[str, str]:
        y = signed(b, t)
        gap = b.op("Sub", b.const(self.threshold), b.op("Mul", y, z))
        active = b.op("Cast", b.op("Not", b.op("Less", gap, b.const(0.0))), to=b.elem)  # gap >= 0
        return b.op("Relu", gap), b.op("Neg", b.op("Mul", y, active))

    def numpy_terms(self, z: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = 2.0 * t - 1.0
        gap = self.threshold - y * z
        return np.maximum(gap, 0.0), -y * (gap >= 0)
