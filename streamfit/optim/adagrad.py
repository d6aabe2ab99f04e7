"""AdaGrad: step sizes shrink with the sum of past squared gradients (good for sparse features)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.base import Optimizer, check_range

__all__ = ["AdaGrad"]


class AdaGrad(Optimizer):
    """``s <- s + g**2; w <- w - lr * g / (sqrt(s) + eps)`` (PyTorch's Adagrad without lr decay).

    Parameters
    ----------
    eps
        Added to ``sqrt(s)`` so a coordinate with no gradient yet does not divide by zero.
    initial_accumulator_value
        The starting value of every accumulator ``s`` (>= 0; a larger one makes the first steps smaller).

    Examples
    --------
    >>> import numpy as np
    >>> opt = AdaGrad()
    >>> opt.numpy_update(np.array([1.0]), np.array([2.0]), opt.init_state(np.zeros(1)), {"lr": 0.1})[0]
    array([0.9])
    """

    name = "adagrad"
    slots = ("sum_sq",)
    zero_gradient_fixed = True

    def __init__(self, eps: float = 1e-10, initial_accumulator_value: float = 0.0) -> None:
        self.eps = check_range("eps", eps, 0.0)
        self.initial_accumulator_value = check_range("initial_accumulator_value",
                                                     initial_accumulator_value, 0.0)

    def auto_eta0(self) -> float:
        """0.1: each coordinate's steps shrink with its accumulated squared gradients (VW-level log loss on
        hashed string columns at batch 1 and 1024, ``bench/perrow.py``)."""
        return 0.1

    def init_state(self, w: np.ndarray) -> dict[str, np.ndarray]:
        return {"sum_sq": np.full_like(w, self.initial_accumulator_value)}

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        acc = b.op("Add", state["sum_sq"], b.op("Mul", g, g))
        step = b.op("Div", b.op("Mul", g, s["lr"]), b.op("Add", b.op("Sqrt", acc), b.const(self.eps)))
        return b.op("Sub", w, step), {"sum_sq": acc}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        acc = state["sum_sq"] + g * g
        return w - s["lr"] * g / (np.sqrt(acc) + self.eps), {"sum_sq": acc}
