"""Huber loss: squared near zero, linear beyond ``delta``; robust yet smooth."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["Huber"]


class Huber(Loss):
    """``0.5 r**2`` for ``|r| <= delta``, else ``delta * (|r| - delta / 2)``; dL/dY = clip(r, -delta, delta).

    Parameters
    ----------
    delta
        Where the loss turns from squared to linear, in the target's units (residuals beyond it count
        linearly: outliers pull less); scikit-learn's ``epsilon`` of ``loss="huber"``.

    Examples
    --------
    >>> import numpy as np
    >>> Huber(delta=1.0).numpy(np.array([[3.0]]), np.array([[0.0]]))[0]
    2.5
    """

    name = "huber"

    def __init__(self, delta: float = 1.0) -> None:
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta!r}")
        self.delta = float(delta)

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", y, t)
        grad = b.op("Clip", r, b.const(-self.delta), b.const(self.delta))
        # loss = grad * (r - grad / 2): 0.5 r^2 inside, delta (|r| - delta/2) outside
        loss = b.op("Mul", grad, b.op("Sub", r, b.op("Mul", grad, b.const(0.5))))
        return loss, grad

    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = y - t
        grad = np.clip(r, -self.delta, self.delta)
        return grad * (r - grad / 2), grad
