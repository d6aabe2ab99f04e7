"""Nesterov momentum in scikit-learn's formulation (its MLP 'sgd' solver, onnxcustom's LearningRateSGDNesterov)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.base import Optimizer, check_range

__all__ = ["Nesterov"]


class Nesterov(Optimizer):
    """``v <- momentum * v - lr * g; w <- w + momentum * v - lr * g``.

    Parameters
    ----------
    momentum
        The share of the previous velocity kept at each step, in [0, 1]; the step looks ahead along it.

    Examples
    --------
    >>> import numpy as np
    >>> opt = Nesterov(momentum=0.5)
    >>> opt.numpy_update(np.array([1.0]), np.array([1.0]), opt.init_state(np.zeros(1)), {"lr": 0.1})[0]
    array([0.85])
    """

    name = "nesterov"
    slots = ("velocity",)

    def __init__(self, momentum: float = 0.9) -> None:
        self.momentum = check_range("momentum", momentum, 0.0, 1.0)

    def auto_eta0(self) -> float:
        """``0.01 * (1 - momentum)``: the steady step of plain SGD at 0.01 (a velocity sums ``1 / (1 - momentum)``
        steps)."""
        return float(f"{0.01 * (1.0 - self.momentum):.12g}")

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        lr_g = b.op("Mul", g, s["lr"])
        v = b.op("Sub", b.op("Mul", state["velocity"], b.const(self.momentum)), lr_g)
        w_new = b.op("Sub", b.op("Add", w, b.op("Mul", v, b.const(self.momentum))), lr_g)
        return w_new, {"velocity": v}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        v = self.momentum * state["velocity"] - s["lr"] * g
        return w + self.momentum * v - s["lr"] * g, {"velocity": v}
