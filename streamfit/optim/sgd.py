"""Plain stochastic gradient descent: ``w -= lr * g``."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.graph import GraphBuilder
from streamfit.optim.base import Optimizer


class SGD(Optimizer):
    """``w <- w - lr * g``, no state: scikit-learn's SGDRegressor/SGDClassifier update.

    >>> import numpy as np
    >>> SGD().numpy_update(np.array([1.0]), np.array([0.5]), {}, {"lr": 0.1})[0]
    array([0.95])
    """

    name = "sgd"
    zero_gradient_fixed = True

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        return b.op("Sub", w, b.op("Mul", g, s["lr"])), {}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return w - s["lr"] * g, {}
