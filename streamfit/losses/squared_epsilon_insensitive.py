"""Squared epsilon-insensitive loss ``max(0, |y - t| - epsilon)**2``: LinearSVR's smooth variant."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["SquaredEpsilonInsensitive"]


class SquaredEpsilonInsensitive(Loss):
    """``max(0, |r| - epsilon)**2``; dL/dY = 2 sign(r) max(0, |r| - epsilon).

    Parameters
    ----------
    epsilon
        Half the width of the tube around the target inside which a prediction costs nothing.

    Examples
    --------
    >>> import numpy as np
    >>> SquaredEpsilonInsensitive(epsilon=0.5).numpy(np.array([[3.0]]), np.array([[1.0]]))
    (2.25, array([[3.]]))
    """

    name = "squared_epsilon_insensitive"

    def __init__(self, epsilon: float = 0.1) -> None:
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
        self.epsilon = float(epsilon)

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", y, t)
        excess = b.op("Relu", b.op("Sub", b.op("Abs", r), b.const(self.epsilon)))
        return b.op("Mul", excess, excess), b.op("Mul", b.op("Mul", b.op("Sign", r), excess), b.const(2.0))

    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = y - t
        excess = np.maximum(np.abs(r) - self.epsilon, 0.0)
        return excess * excess, 2.0 * np.sign(r) * excess
