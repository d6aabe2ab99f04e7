"""Adaptive rate: ``eta0`` while the loss improves, divided by ``factor`` after a plateau.

scikit-learn's ``learning_rate="adaptive"``, applied per batch instead of per epoch, for streams with no epochs.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from streamfit.schedules.base import Schedule, _check_int, _check_real

__all__ = ["Adaptive"]


class Adaptive(Schedule):
    """``lr`` starts at ``eta0`` and is divided by ``factor`` after ``n_iter_no_change`` bad steps in a row.

    A step is bad when its loss is above ``best_loss - tol``, ``best_loss`` being the lowest loss seen
    so far: scikit-learn's exact test ``loss > best_loss - tol``, so a loss equal to ``best_loss - tol``
    counts as progress, and so does the first loss.  After a division the
    counter restarts.  As in scikit-learn, the rate is divided only while it is still above ``min_lr``,
    so it stops at the first value ``<= min_lr``.  ``step(loss)`` requires a finite loss.

    Parameters
    ----------
    eta0
        Initial learning rate, > 0.
    tol
        Improvement (in loss units) a step needs to count as progress, >= 0.
    n_iter_no_change
        Bad steps in a row before the rate is lowered, >= 1.
    factor
        Divisor applied to the rate, > 1 (scikit-learn uses 5).
    min_lr
        No division once the rate is <= this, >= 0 (scikit-learn uses 1e-6).

    Examples
    --------
    >>> s = Adaptive(eta0=1.0, tol=0.1, n_iter_no_change=2, factor=2.0)
    >>> lrs = []
    >>> for loss in [3.0, 2.0, 1.95, 2.5, 1.0, 1.0, 1.0]:
    ...     lrs.append(s.lr)
    ...     s.step(loss)
    >>> lrs, s.lr
    ([1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5], 0.25)
    """

    name = "adaptive"
    _params = ("eta0", "tol", "n_iter_no_change", "factor", "min_lr")
    _state_defaults: ClassVar[dict[str, Any]] = {"lr": None, "best_loss": None, "no_improvement_count": 0}

    def __init__(self, eta0: float, tol: float = 1e-3, n_iter_no_change: int = 5, factor: float = 5.0,
                 min_lr: float = 1e-6) -> None:
        self.eta0 = _check_real("eta0", eta0, gt=0)
        self.tol = _check_real("tol", tol, ge=0)
        self.n_iter_no_change = _check_int("n_iter_no_change", n_iter_no_change, ge=1)
        self.factor = _check_real("factor", factor, gt=1)
        self.min_lr = _check_real("min_lr", min_lr, ge=0)
        self._current = self.eta0
        self._best_loss: float | None = None
        self._bad_steps = 0

    def _lr(self, t: int) -> float:
        return self._current

    def _update(self, loss: float | None) -> None:
        if loss is None:
            raise TypeError("Adaptive needs the batch loss: call step(loss) with a float, got None")
        if not math.isfinite(loss):
            raise ValueError(f"loss must be finite, got {loss!r}")
        if self._best_loss is not None and loss > self._best_loss - self.tol:
            self._bad_steps += 1
        else:
            self._bad_steps = 0
        if self._best_loss is None or loss < self._best_loss:
            self._best_loss = loss
        if self._bad_steps >= self.n_iter_no_change and self._current > self.min_lr:
            self._current /= self.factor
            self._bad_steps = 0

    def _get_state(self) -> dict[str, Any]:
        return {"lr": self._current, "best_loss": self._best_loss, "no_improvement_count": self._bad_steps}

    def _check_extra(self, extra: dict[str, Any]) -> dict[str, Any]:
        lr, best = extra["lr"], extra["best_loss"]
        return {"lr": self.eta0 if lr is None else _check_real("lr", lr, gt=0),
                "best_loss": None if best is None else _check_real("best_loss", best),
                "no_improvement_count": _check_int("no_improvement_count", extra["no_improvement_count"], ge=0)}

    def _apply_extra(self, extra: dict[str, Any]) -> None:
        self._current = extra["lr"]
        self._best_loss = extra["best_loss"]
        self._bad_steps = extra["no_improvement_count"]
