"""Squared error, ``0.5 * (y - t)**2``: the 1/2 makes dL/dY = y - t, as scikit-learn's SGD and MLP use."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["SquaredError"]


class SquaredError(Loss):
    """Half squared error, summed over outputs, averaged over rows.

    >>> import numpy as np
    >>> SquaredError().numpy(np.array([[3.0]]), np.array([[1.0]]))[0]
    2.0
    """

    name = "squared_error"
    loss_factor = 0.5  # carried by the loss weights: one node fewer per step

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", y, t)
        return b.op("Mul", r, r), r

    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = y - t
        return 0.5 * r * r, r
