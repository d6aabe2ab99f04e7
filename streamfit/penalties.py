"""Weight penalties with scikit-learn SGD's meaning of ``alpha`` and ``l1_ratio``.

The L2 part enters the gradient (``g + alpha * (1 - l1_ratio) * w``), so with plain SGD a step is
scikit-learn's ``w *= 1 - lr * alpha * (1 - l1_ratio)`` followed by the loss step.  The L1 part is a
proximal (soft-threshold) step after the update, ``lr * alpha * l1_ratio`` wide, which, like
scikit-learn's truncated gradient, drives weights to exact zeros.  Both scale with the learning rate:
a decay that ignores it (onnxcustom's) shrinks the weights to zero within a few thousand steps.
"""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._params import Parameters

__all__ = ["Penalty", "get_penalty"]


class Penalty(Parameters):
    """Elastic-net penalty ``alpha * (l1_ratio * |w|_1 + (1 - l1_ratio) / 2 * |w|_2^2)``.

    What it emits: for each penalized weight the engine calls ``gradient(b, w, g)`` before the optimizer
    (names in, the penalized gradient's name out) and ``proximal(b, w_new, lr)`` on the optimizer's new
    weight (``lr`` the name of the learning-rate input), through the :class:`~streamfit.graph.GraphBuilder`
    ``b``.  A subclass may override both, with their numpy twins :meth:`numpy_gradient` and
    :meth:`numpy_proximal`; it has no state (its parameters are :meth:`get_params`).  With plain SGD and no
    L1 part, the fused step applies the L2 part itself as a decay ``w * (1 - lr * l2)`` folded into the
    update (see :meth:`folds_into_decay`).

    Parameters
    ----------
    alpha
        The penalty's strength (scikit-learn SGD's ``alpha``), >= 0.
    l1_ratio
        The L1 share of it, in [0, 1]: 0 is L2 (ridge), 1 is L1 (lasso), between is the elastic net.

    Examples
    --------
    >>> import numpy as np
    >>> p = Penalty(alpha=0.1, l1_ratio=0.0)
    >>> p.numpy_gradient(np.array([2.0]), np.array([0.0]))
    array([0.2])
    """

    def __init__(self, alpha: float = 1e-4, l1_ratio: float = 0.0) -> None:
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha!r}")
        if not 0.0 <= l1_ratio <= 1.0:
            raise ValueError(f"l1_ratio must be in [0, 1], got {l1_ratio!r}")
        self.alpha = float(alpha)
        self.l1_ratio = float(l1_ratio)

    @property
    def l2(self) -> float:
        return self.alpha * (1.0 - self.l1_ratio)

    @property
    def l1(self) -> float:
        return self.alpha * self.l1_ratio

    def gradient(self, b: GraphBuilder, w: str, g: str) -> str:
        """Gradient with the L2 term added (unchanged when there is none).

        Parameters
        ----------
        b
            The :class:`~streamfit.graph.GraphBuilder` to add the nodes through.
        w, g
            Graph names of the weight and of its gradient.
        """
        return g if self.l2 == 0 else b.op("Add", g, b.op("Mul", w, b.const(self.l2)))

    def proximal(self, b: GraphBuilder, w: str, lr: str) -> str:
        """Soft-threshold ``w`` by ``lr * l1`` (unchanged when there is no L1 term).

        Parameters
        ----------
        b
            The :class:`~streamfit.graph.GraphBuilder` to add the nodes through.
        w
            Graph name of the optimizer's new weight.
        lr
            Graph name of the step's learning rate.
        """
        if self.l1 == 0:
            return w
        shrunk = b.op("Relu", b.op("Sub", b.op("Abs", w), b.op("Mul", lr, b.const(self.l1))))
        return b.op("Mul", b.op("Sign", w), shrunk)

    def folds_into_decay(self) -> bool:
        """True when the penalty is exactly the weight decay ``w * (1 - lr * l2)`` after an SGD step: no L1
        part, and :meth:`gradient`/:meth:`proximal` as defined here (a subclass that changes them is emitted)."""
        cls = type(self)
        return self.l1 == 0 and cls.gradient is Penalty.gradient and cls.proximal is Penalty.proximal

    def numpy_gradient(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """numpy twin of :meth:`gradient` (the reference the tests check the graph against).

        Parameters
        ----------
        w, g
            The weight and its gradient.
        """
        return g + self.l2 * w

    def numpy_proximal(self, w: np.ndarray, lr: float) -> np.ndarray:
        """numpy twin of :meth:`proximal`.

        Parameters
        ----------
        w
            The optimizer's new weight.
        lr
            The step's learning rate.
        """
        return np.sign(w) * np.maximum(np.abs(w) - lr * self.l1, 0.0) if self.l1 else w

    def __repr__(self) -> str:
        return f"Penalty(alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r})"


def get_penalty(penalty: "str | Penalty | None", alpha: float = 1e-4, l1_ratio: float = 0.15) -> Penalty | None:
    """scikit-learn's ``penalty`` argument: ``None``, ``"l2"``, ``"l1"`` or ``"elasticnet"`` (uses ``l1_ratio``).

    Parameters
    ----------
    penalty
        ``None``, a :class:`Penalty` (returned as is), ``"l2"``, ``"l1"`` or ``"elasticnet"``.
    alpha
        The penalty's strength; 0 gives no penalty (None).
    l1_ratio
        The L1 share of ``"elasticnet"`` (the other names fix it at 0 or 1).

    Examples
    --------
    >>> get_penalty("l1", alpha=0.01)
    Penalty(alpha=0.01, l1_ratio=1.0)
    """
    if penalty is None or isinstance(penalty, Penalty):
        return penalty
    ratios = {"l2": 0.0, "l1": 1.0, "elasticnet": l1_ratio}
    if penalty not in ratios:
        raise ValueError(f"unknown penalty {penalty!r}; expected None, 'l2', 'l1' or 'elasticnet'")
    return None if alpha == 0 else Penalty(alpha, ratios[penalty])
