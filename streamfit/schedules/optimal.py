"""Bottou's "optimal" rate: ``lr = 1 / (alpha * (optimal_init + t))``.

Exactly scikit-learn's ``learning_rate="optimal"``: a rate tied to the L2 strength ``alpha``, no eta0 to tune.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from streamfit.schedules.base import Schedule, _check_real

__all__ = ["Optimal", "optimal_init"]


def optimal_init(alpha: float, loss_dloss: Callable[[float, float], float] | None = None) -> float:
    """scikit-learn's ``optimal_init``: the offset making the first rate ``typw / max(1, dloss(-typw, 1))``.

    ``typw = sqrt(1 / sqrt(alpha))`` is the typical weight size; ``dloss(p, y)`` is the derivative of the
    loss wrt the prediction (``None``: squared loss, ``p - y``).

    >>> optimal_init(1e-4)
    1000.0
    """
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    dloss = -typw - 1.0 if loss_dloss is None else loss_dloss(-typw, 1.0)
    dloss = _check_real("loss_dloss(-typw, 1.0)", dloss)
    initial_eta0 = typw / max(1.0, dloss)
    return 1.0 / (initial_eta0 * alpha)


class Optimal(Schedule):
    """``lr = 1 / (alpha * (optimal_init + t))``, ``t`` = completed steps (Bottou's heuristic).

    scikit-learn computes ``1 / (alpha * (optimal_init + t_sk - 1))`` with ``t_sk = 1.0`` at the first
    sample, so ``t_sk - 1 = t``; we evaluate it in sklearn's order, ``(optimal_init + (t + 1)) - 1``,
    so the values are bit-identical (``optimal_init + t`` differs in the last bit now and then).
    The first rate is ``initial_eta0``.
    The state stores ``optimal_init`` (the callable is not saved), so a restored schedule needs no
    ``loss_dloss``; loading a state made with another loss is reported as an ``optimal_init`` mismatch.

    Parameters
    ----------
    alpha
        L2 regularization strength the rate is tied to, > 0 (scikit-learn's default is 1e-4).
    loss_dloss
        ``(p, y) -> dloss/dp`` of one sample (scikit-learn's ``loss.py_dloss`` or a streamfit
        ``Loss.dloss``); ``None`` means squared loss ``p - y``.  Only ``dloss(-typw, 1.0)`` is used.

    Examples
    --------
    >>> s = Optimal(alpha=0.01)
    >>> lrs = []
    >>> for _ in range(3):
    ...     lrs.append(round(s.lr, 5))
    ...     s.step()
    >>> lrs
    [3.16228, 3.06534, 2.97417]
    """

    name = "optimal"
    _params = ("alpha", "optimal_init")

    def __init__(self, alpha: float, loss_dloss: Callable[[float, float], float] | None = None) -> None:
        self.alpha = _check_real("alpha", alpha, gt=0)
        if loss_dloss is not None and not callable(loss_dloss):
            raise TypeError(f"loss_dloss must be a callable (p, y) -> float or None, got {loss_dloss!r}")
        self.loss_dloss = loss_dloss
        self.optimal_init = optimal_init(self.alpha, loss_dloss)

    @classmethod
    def _from_params(cls, state: Mapping[str, Any]) -> Schedule:
        schedule = cls(**cls._param_kwargs(state))
        if "optimal_init" not in state:
            raise ValueError("'optimal' state lacks required key(s) ['optimal_init']")
        schedule.optimal_init = _check_real("optimal_init", state["optimal_init"], gt=0)
        return schedule

    def _lr(self, t: int) -> float:
        # sklearn's own rounding: (optimal_init + t_sk) - 1 with t_sk = t + 1, not optimal_init + t
        return 1.0 / (self.alpha * (self.optimal_init + (t + 1) - 1))
