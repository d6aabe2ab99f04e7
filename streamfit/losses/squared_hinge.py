"""Squared hinge loss ``max(0, threshold - y z)**2``, labels 0/1: LinearSVC's default loss."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss
from streamfit.losses.hinge import signed

__all__ = ["SquaredHinge"]


class SquaredHinge(Loss):
    """``max(0, threshold - y z)**2``; dL/dz = -2 y max(0, threshold - y z) (smooth, unlike the hinge).

    Parameters
    ----------
    threshold
        The margin a score must pass to cost nothing (1: LinearSVC's squared hinge).

    Examples
    --------
    >>> import numpy as np
    >>> SquaredHinge().numpy(np.array([[0.5]]), np.array([[1.0]]))
    (0.25, array([[-1.]]))
    """

    name = "squared_hinge"

    def __init__(self, threshold: float = 1.0) -> None:
        if not threshold >= 0:
            raise ValueError(f"threshold must be >= 0, got {threshold!r}")
        self.threshold = float(threshold)

    def terms(self, b: GraphBuilder, z: str, t: str) -> tuple[str, str]:
        y = signed(b, t)
        gap = b.op("Relu", b.op("Sub", b.const(self.threshold), b.op("Mul", y, z)))
        return b.op("Mul", gap, gap), b.op("Mul", b.op("Mul", y, gap), b.const(-2.0))

    def numpy_terms(self, z: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = 2.0 * t - 1.0
        gap = np.maximum(self.threshold - y * z, 0.0)
        return gap * gap, -2.0 * y * gap
