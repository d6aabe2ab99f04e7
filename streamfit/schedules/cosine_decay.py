"""Cosine decay: from ``eta0`` down to ``eta_min`` along half a cosine over ``decay_steps``, then flat.

A smooth decay with a known end, the usual partner of a linear warm-up (:class:`LinearWarmup`).
"""

from __future__ import annotations

import math

from streamfit.schedules.base import Schedule, _check_int, _check_real

__all__ = ["CosineDecay"]


class CosineDecay(Schedule):
    """``lr = eta_min + 0.5 * (eta0 - eta_min) * (1 + cos(pi * min(t, decay_steps) / decay_steps))``.

    Parameters
    ----------
    eta0
        Rate at ``t = 0``, > 0.
    decay_steps
        Steps to reach ``eta_min``, >= 1; the rate stays at ``eta_min`` afterwards.
    eta_min
        Final rate, ``0 <= eta_min <= eta0``.

    Examples
    --------
    >>> s = CosineDecay(eta0=1.0, decay_steps=4, eta_min=0.1)
    >>> lrs = []
    >>> for _ in range(6):
    ...     lrs.append(round(s.lr, 4))
    ...     s.step()
    >>> lrs
    [1.0, 0.8682, 0.55, 0.2318, 0.1, 0.1]
    """

    name = "cosine_decay"
    _params = ("eta0", "decay_steps", "eta_min")

    def __init__(self, eta0: float, decay_steps: int, eta_min: float = 0.0) -> None:
        self.eta0 = _check_real("eta0", eta0, gt=0)
        self.decay_steps = _check_int("decay_steps", decay_steps, ge=1)
        self.eta_min = _check_real("eta_min", eta_min, ge=0, le=self.eta0)

    def _lr(self, t: int) -> float:
        progress = min(t, self.decay_steps) / self.decay_steps
        return self.eta_min + 0.5 * (self.eta0 - self.eta_min) * (1.0 + math.cos(math.pi * progress))
