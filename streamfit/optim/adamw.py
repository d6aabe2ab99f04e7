"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter), as PyTorch's AdamW."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.adam import Adam
from streamfit.optim.base import check_range

__all__ = ["AdamW"]


class AdamW(Adam):
    """``w <- w * (1 - lr * weight_decay)``, then the Adam step; the decay never enters m and v.

    Parameters
    ----------
    beta1, beta2, eps
        As for :class:`Adam`.
    weight_decay
        The decoupled decay per unit of learning rate (``w *= 1 - lr * weight_decay`` each step), >= 0.

    Examples
    --------
    >>> import numpy as np
    >>> opt = AdamW(weight_decay=0.5)
    >>> s = dict(zip(opt.scalar_names, opt.scalars(0.1, 0)))
    >>> opt.numpy_update(np.array([1.0]), np.array([0.0]), opt.init_state(np.zeros(1)), s)[0]
    array([0.95])
    """

    name = "adamw"

    def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        super().__init__(beta1, beta2, eps)
        self.weight_decay = check_range("weight_decay", weight_decay, 0.0)

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        decay = b.op("Sub", b.const(1.0), b.op("Mul", s["lr"], b.const(self.weight_decay)))
        m, v = self._moments(b, g, state)
        return self._step(b, b.op("Mul", w, decay), m, v, s), {"exp_avg": m, "exp_avg_sq": v}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self._np_step(w * (1 - s["lr"] * self.weight_decay), g, state, s)
