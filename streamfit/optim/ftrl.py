"""FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013, Algorithm 1)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.base import Optimizer, check_range

__all__ = ["FTRL"]


class FTRL(Optimizer):
    """Per-coordinate FTRL-Proximal: state ``z`` and ``n``, weights materialized from them at every step.

    With the learning rate as ``alpha`` (``eta0`` or the schedule's rate, as Keras' ``Ftrl``), for each
    coordinate and its gradient ``g`` at the current weight ``w``::

        sigma = (sqrt(n + g**2) - sqrt(n)) / alpha
        z <- z + g - sigma * w;  n <- n + g**2
        w <- 0 if |z| <= l1 else -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)

    so ``l1`` gives exact zeros.  As in McMahan's algorithm (and TensorFlow's), ``z = n = 0`` at the start:
    a weight that starts away from zero is pulled back to what its accumulated gradients say after its
    first update (fit for linear models and tables that start at zero).

    ``g`` is the gradient of the batch's *summed* loss (``summed=True``, default): every row is one of
    McMahan's examples, so ``alpha``, ``beta``, ``l1`` and ``l2`` mean what they mean at batch 1 whatever the
    batch size.  On the mean loss (``summed=False``, as Keras' ``Ftrl`` on a mean loss) a batch of ``n``
    rows acts as ``beta``, ``l1`` and ``l2`` ``n`` times larger: a hashed feature seen once in a batch of
    1024 then moves ~1/1024 of its per-row step (measured: +8 % progressive log loss against VW on the
    click stream at batch 1024, against -0.1 % summed; ``bench/sparse.py``).

    Parameters
    ----------
    beta
        Added to ``sqrt(n)`` in each coordinate's rate (smooths the first steps of a rare feature), >= 0.
    l1, l2
        The L1 strength (exact zeros for coordinates whose ``|z|`` stays under it) and the L2 strength, >= 0.
    summed
        Whether ``g`` is the gradient of the batch's summed loss (default: the parameters mean what they
        mean at batch 1, see above) or of its mean loss.

    Examples
    --------
    >>> import numpy as np
    >>> opt = FTRL(beta=1.0, l1=0.5)
    >>> w, st = opt.numpy_update(np.zeros(2), np.array([0.2, 3.0]), opt.init_state(np.zeros(2)), {"lr": 0.1})
    >>> w.tolist(), st["z"].tolist()
    ([0.0, -0.0625], [0.2, 3.0])
    """

    name = "ftrl"
    slots = ("z", "n")
    zero_gradient_fixed = True

    def __init__(self, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0, summed: bool = True) -> None:
        self.beta = check_range("beta", beta, 0.0)
        self.l1 = check_range("l1", l1, 0.0)
        self.l2 = check_range("l2", l2, 0.0)
        if not isinstance(summed, (bool, np.bool_)):
            raise ValueError(f"summed must be True or False, got {summed!r}")
        self.summed = bool(summed)

    def auto_eta0(self) -> float:
        """0.1 (McMahan's alpha): per-coordinate rates, as AdaGrad's; within 1 % of Vowpal Wabbit's progressive
        log loss on hashed string columns at batch 1 and 1024 (``bench/perrow.py``)."""
        return 0.1

    @property
    def summed_gradient(self) -> bool:  # type: ignore[override]
        return self.summed

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        n_new = b.op("Add", state["n"], b.op("Mul", g, g))
        root_new = b.op("Sqrt", n_new)
        sigma = b.op("Div", b.op("Sub", root_new, b.op("Sqrt", state["n"])), s["lr"])
        z_new = b.op("Sub", b.op("Add", state["z"], g), b.op("Mul", sigma, w))
        # clip(z, -l1, l1) - z: -(z - sign(z) * l1) beyond l1, exactly +0.0 within; -z without l1 (a node less:
        # at batch 1 a step costs its node count)
        if self.l1:
            shrunk = b.op("Sub", b.op("Clip", z_new, b.const(-self.l1), b.const(self.l1)), z_new)
        else:
            shrunk = b.op("Neg", z_new)
        denom = b.op("Div", b.op("Add", root_new, b.const(self.beta)), s["lr"])
        if self.l2:  # + 0.0 changes nothing (the denominator is never -0.0)
            denom = b.op("Add", denom, b.const(self.l2))
        return b.op("Div", shrunk, denom), {"z": z_new, "n": n_new}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        lr = s["lr"]
        n_new = state["n"] + g * g
        root_new = np.sqrt(n_new)
        z_new = state["z"] + g - (root_new - np.sqrt(state["n"])) / lr * w
        shrunk = np.clip(z_new, -self.l1, self.l1) - z_new
        return shrunk / ((root_new + self.beta) / lr + self.l2), {"z": z_new, "n": n_new}
