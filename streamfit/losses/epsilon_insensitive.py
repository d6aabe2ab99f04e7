"""Epsilon-insensitive loss ``max(0, |y - t| - epsilon)``: support vector regression, passive-aggressive."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["EpsilonInsensitive"]


class EpsilonInsensitive(Loss):
    """``max(0, |r| - epsilon)``; dL/dY = sign(r) outside the tube ``|r| > epsilon``, 0 inside.

    Parameters
    ----------
    epsilon
        Half the width of the tube around the target inside which a prediction costs nothing (as
        scikit-learn's ``epsilon``).

    Examples
    --------
    >>> import numpy as np
    >>> EpsilonInsensitive(epsilon=0.5).numpy(np.array([[3.0], [1.2]]), np.array([[1.0], [1.0]]))
    (0.75, array([[0.5],
           [0. ]]))
    """

    name = "epsilon_insensitive"

    def __init__(self, epsilon: float = 0.1) -> None:
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
        self.epsilon = float(epsilon)

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", y, t)
        excess = b.op("Sub", b.op("Abs", r), b.const(self.epsilon))
        outside = b.op("Cast", b.op("Greater", excess, b.const(0.0)), to=b.elem)
        return b.op("Relu", excess), b.op("Mul", b.op("Sign", r), outside)

    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = y - t
        excess = np.abs(r) - self.epsilon
        return np.maximum(excess, 0.0), np.sign(r) * (excess > 0)
