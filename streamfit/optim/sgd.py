"""Plain stochastic gradient descent: ``w -= lr * g``."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.base import Optimizer

__all__ = ["SGD"]


class SGD(Optimizer):
    """``w <- w - lr * g``, no state: scikit-learn's SGDRegressor/SGDClassifier update.

    >>> import numpy as np
    >>> SGD().numpy_update(np.array([1.0]), np.array([0.5]), {}, {"lr": 0.1})[0]
    array([0.95])
    """

    name = "sgd"
    zero_gradient_fixed = True

    def folds_into_gradients(self) -> bool:
        """True unless a subclass changes the rule: its update, numpy twin, scalars or state (it then gets its
        :meth:`update` emitted like any optimizer; a subclass whose rule is still plain SGD may say True).

        >>> class Clipped(SGD):
        ...     def numpy_update(self, w, g, state, s):
        ...         return w - s["lr"] * np.clip(g, -1, 1), {}
        >>> SGD().folds_into_gradients(), Clipped().folds_into_gradients()
        (True, False)
        """
        cls = type(self)
        return (cls.update is SGD.update and cls.numpy_update is SGD.numpy_update and cls.scalars is SGD.scalars
                and cls.init_state is SGD.init_state and not self.slots and tuple(self.scalar_names) == ("lr",)
                and not self.shaped)

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        return b.op("Sub", w, b.op("Mul", g, s["lr"])), {}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return w - s["lr"] * g, {}
