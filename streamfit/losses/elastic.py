"""Elastic loss ``l1 * |r| + l2 * r**2``: a blend of absolute and squared error."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["ElasticError"]


class ElasticError(Loss):
    """``l1 * |y - t| + l2 * (y - t)**2``; dL/dY = l1 * sign(r) + 2 * l2 * r.

    Parameters
    ----------
    l1, l2
        The weights of the absolute error and of the squared error in the blend (both >= 0).

    Examples
    --------
    >>> import numpy as np
    >>> ElasticError(l1=1.0, l2=0.5).numpy(np.array([[3.0]]), np.array([[1.0]]))[0]
    4.0
    """

    name = "elastic"

    def __init__(self, l1: float = 0.5, l2: float = 0.5) -> None:
        if l1 < 0 or l2 < 0 or l1 + l2 == 0:
            raise ValueError(f"l1 and l2 must be >= 0 and not both 0, got l1={l1!r}, l2={l2!r}")
        self.l1 = float(l1)
        self.l2 = float(l2)

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", y, t)
        loss = b.op("Add", b.op("Mul", b.op("Abs", r), b.const(self.l1)),
                    b.op("Mul", b.op("Mul", r, r), b.const(self.l2)))
        grad = b.op("Add", b.op("Mul", b.op("Sign", r), b.const(self.l1)),
                    b.op("Mul", r, b.const(2.0 * self.l2)))
        return loss, grad

    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = y - t
        return self.l1 * np.abs(r) + self.l2 * r * r, self.l1 * np.sign(r) + 2 * self.l2 * r
