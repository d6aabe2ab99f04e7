"""SGD with (heavy-ball) momentum, as scikit-learn's MLP 'sgd' solver without Nesterov."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.base import Optimizer, check_range

__all__ = ["Momentum"]


class Momentum(Optimizer):
    """``v <- momentum * v - lr * g; w <- w + v``.

    Parameters
    ----------
    momentum
        The share of the previous velocity kept at each step, in [0, 1] (0: plain SGD).

    Examples
    --------
    >>> import numpy as np
    >>> opt = Momentum(momentum=0.9)
    >>> w, st = opt.numpy_update(np.array([1.0]), np.array([1.0]), opt.init_state(np.zeros(1)), {"lr": 0.1})
    >>> w, st["velocity"]
    (array([0.9]), array([-0.1]))
    """

    name = "momentum"
    slots = ("velocity",)

    def __init__(self, momentum: float = 0.9) -> None:
        self.momentum = check_range("momentum", momentum, 0.0, 1.0)

    def auto_eta0(self) -> float:
        """``0.01 * (1 - momentum)``: the steady step of plain SGD at 0.01 (a velocity sums ``1 / (1 - momentum)``
        steps)."""
        return float(f"{0.01 * (1.0 - self.momentum):.12g}")

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        v = b.op("Sub", b.op("Mul", state["velocity"], b.const(self.momentum)), b.op("Mul", g, s["lr"]))
        return b.op("Add", w, v), {"velocity": v}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        v = self.momentum * state["velocity"] - s["lr"] * g
        return w + v, {"velocity": v}
