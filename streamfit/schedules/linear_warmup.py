"""Linear warm-up: ramps from ``start_factor * after.lr`` to ``after.lr``, then hands over to ``after``.

Large early steps on fresh weights can diverge; a short ramp avoids it without lowering the later rate.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from streamfit.schedules.base import Schedule, _check_int, _check_real, _is_real, schedule_from_state_dict
from streamfit.schedules.constant import Constant

__all__ = ["LinearWarmup"]


class LinearWarmup(Schedule):
    """``lr = after.lr * (start_factor + (1 - start_factor) * t / warmup_steps)`` for ``t < warmup_steps``.

    From step ``warmup_steps`` on, ``lr = after.lr``.  ``after`` is not stepped during the warm-up: it
    starts its own count at the end of it (a cosine decay then starts decaying when the ramp ends),
    and it gets the losses only from then on.  The state nests ``after``'s state under ``"after"``.

    Parameters
    ----------
    after
        The schedule to warm up to, or a float (a :class:`Constant`).
    warmup_steps
        Length of the ramp, >= 0 (0: no warm-up).
    start_factor
        Fraction of ``after.lr`` used at the first step, ``0 <= start_factor <= 1``.

    Examples
    --------
    >>> s = LinearWarmup(0.1, warmup_steps=4)
    >>> lrs = []
    >>> for _ in range(6):
    ...     lrs.append(round(s.lr, 4))
    ...     s.step()
    >>> lrs
    [0.0, 0.025, 0.05, 0.075, 0.1, 0.1]
    """

    name = "linear_warmup"
    _params = ("warmup_steps", "start_factor")
    _state_defaults: ClassVar[dict[str, Any]] = {"after": None}

    def __init__(self, after: Schedule | float, warmup_steps: int, start_factor: float = 0.0) -> None:
        if isinstance(after, Schedule):
            self.after = after
        elif _is_real(after):
            self.after = Constant(after)
        else:
            raise TypeError(f"after must be a Schedule or a float, got {after!r}")
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, ge=0)
        self.start_factor = _check_real("start_factor", start_factor, ge=0, le=1)

    def _lr(self, t: int) -> float:
        if t < self.warmup_steps:
            return self.after.lr * (self.start_factor + (1.0 - self.start_factor) * t / self.warmup_steps)
        return self.after.lr

    def _update(self, loss: float | None) -> None:
        if self.t >= self.warmup_steps:
            self.after.step(loss)

    def _get_state(self) -> dict[str, Any]:
        return {"after": self.after.state_dict()}

    def _check_extra(self, extra: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"after": self.after._check_state(_after_state(extra))}
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"in 'after' of 'linear_warmup' state: {exc}") from exc

    def _apply_extra(self, extra: dict[str, Any]) -> None:
        self.after._apply_state(extra["after"])

    @classmethod
    def _from_params(cls, state: Mapping[str, Any]) -> Schedule:
        return cls(schedule_from_state_dict(_after_state(state)), **cls._param_kwargs(state))

    def __repr__(self) -> str:
        return f"LinearWarmup(after={self.after!r}, warmup_steps={self.warmup_steps!r}, " \
               f"start_factor={self.start_factor!r})"


def _after_state(state: Mapping[str, Any]) -> Mapping[str, Any]:
    after = state.get("after")
    if after is None:
        raise ValueError("'linear_warmup' state lacks required key(s) ['after']")
    return after
