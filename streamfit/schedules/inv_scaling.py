"""Inverse scaling: ``lr = eta0 / (t + 1) ** power_t``.

Exactly scikit-learn's ``learning_rate="invscaling"`` (whose internal counter starts at 1, ours at 0).
"""

from __future__ import annotations

from streamfit.schedules.base import Schedule, _check_real

__all__ = ["InvScaling"]


class InvScaling(Schedule):
    """``lr = eta0 / (t + 1) ** power_t``, ``t`` = completed steps.

    scikit-learn computes ``eta0 / pow(t_sk, power_t)`` with ``t_sk = 1.0`` at the first sample
    (``SGDRegressor.t_`` after fitting ``n`` samples is ``n + 1``), so ``t_sk = t + 1`` and the
    values are bit-identical.

    Parameters
    ----------
    eta0
        Initial learning rate, > 0.
    power_t
        Exponent of the decay, >= 0 (0 gives a constant rate; scikit-learn's regressor default is 0.25).

    Examples
    --------
    >>> s = InvScaling(eta0=0.1, power_t=0.5)
    >>> lrs = []
    >>> for _ in range(4):
    ...     lrs.append(round(s.lr, 5))
    ...     s.step()
    >>> lrs
    [0.1, 0.07071, 0.05774, 0.05]
    """

    name = "invscaling"
    _params = ("eta0", "power_t")

    def __init__(self, eta0: float, power_t: float = 0.25) -> None:
        self.eta0 = _check_real("eta0", eta0, gt=0)
        self.power_t = _check_real("power_t", power_t, ge=0)

    def _lr(self, t: int) -> float:
        return self.eta0 / float(t + 1) ** self.power_t
