"""Constant learning rate: ``lr = eta0`` at every step.

The default when an optimizer is given a plain float (scikit-learn's ``learning_rate="constant"``).
"""

from __future__ import annotations

import numpy as np

from streamfit.schedules.base import Schedule, _check_real

__all__ = ["Constant"]


class Constant(Schedule):
    """``lr = eta0`` at every step.

    Parameters
    ----------
    eta0
        The learning rate, > 0.

    Examples
    --------
    >>> s = Constant(0.1)
    >>> for _ in range(3):
    ...     print(s.lr)
    ...     s.step()
    0.1
    0.1
    0.1
    """

    name = "constant"
    _params = ("eta0",)

    def __init__(self, eta0: float) -> None:
        self.eta0 = _check_real("eta0", eta0, gt=0)

    def _lr(self, t: int) -> float:
        return self.eta0

    def rates(self, n: int) -> np.ndarray:
        return np.full(n, float(self.eta0))
