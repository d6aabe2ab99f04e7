"""The schedule interface: the learning rate for the step about to run, advanced once per batch.

A schedule is a tiny stateful object (River's ``optim.schedulers``, PyTorch's ``state_dict``): the engine
reads :attr:`Schedule.lr`, runs the step, then calls :meth:`Schedule.step` with the batch's mean loss.
"""

from __future__ import annotations

import abc
import inspect
import math
import numbers
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Schedule", "as_schedule", "schedule_from_state_dict"]


#: the built-in schedules by name, filled as their modules define them (see Schedule.__init_subclass__)
_BUILT_IN: "dict[str, type[Schedule]]" = {}


class Schedule(abc.ABC):
    """Learning rate for the step about to run (:attr:`lr`); :meth:`step` advances it by one batch.

    A subclass sets ``name`` and ``_params`` (its hyper-parameters, stored as attributes of the same
    name) and writes only :meth:`_lr` and, if it reacts to the loss, :meth:`_update` (plus the
    ``_get_state`` / ``_check_extra`` / ``_apply_extra`` trio if it keeps state besides ``t``).
    The public :meth:`step`, :meth:`state_dict` and :meth:`load_state_dict` do the bookkeeping.

    Examples
    --------
    >>> from streamfit.schedules import InvScaling
    >>> s = InvScaling(eta0=0.1, power_t=0.5)
    >>> for _ in range(3):
    ...     print(s.t, round(s.lr, 5))
    ...     s.step()
    0 0.1
    1 0.07071
    2 0.05774
    """

    #: the key of this schedule in states and in :func:`as_schedule`.
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the built-in schedules register their names (a subclass elsewhere, or one inheriting a name, does not)
        if "name" in cls.__dict__ and cls.__module__.startswith("streamfit.schedules."):
            _BUILT_IN[cls.name] = cls
    #: hyper-parameters, saved in the state and compared by :meth:`load_state_dict`.
    _params: ClassVar[tuple[str, ...]] = ()
    #: state keys besides ``name``, ``t`` and the hyper-parameters, with the value a state lacking them gets.
    _state_defaults: ClassVar[dict[str, Any]] = {}

    #: completed steps; a class default so that subclasses need not call ``super().__init__()``.
    _t: int = 0

    # -- what a subclass writes ------------------------------------------------------------------

    @abc.abstractmethod
    def _lr(self, t: int) -> float:
        """Learning rate for step ``t`` (0 for the first step)."""

    def _update(self, loss: float | None) -> None:
        """React to the loss of step ``self.t``, which just ran (before ``t`` is incremented)."""

    def _get_state(self) -> dict[str, Any]:
        """State besides ``name``, ``t`` and the hyper-parameters (keys of ``_state_defaults``)."""
        return {}

    def _check_extra(self, extra: dict[str, Any]) -> dict[str, Any]:
        """Validate the extra state (defaults filled in); return it normalized, change nothing."""
        return extra

    def _apply_extra(self, extra: dict[str, Any]) -> None:
        """Install extra state returned by :meth:`_check_extra`."""

    @classmethod
    def _from_params(cls, state: Mapping[str, Any]) -> Schedule:
        """A fresh schedule with the hyper-parameters of ``state`` (validated by ``__init__``)."""
        return cls(**cls._param_kwargs(state))

    # -- public API ------------------------------------------------------------------------------

    @property
    def t(self) -> int:
        """Number of completed steps (0 before the first one)."""
        return self._t

    @property
    def lr(self) -> float:
        """Learning rate to use for the step about to run."""
        return float(self._lr(self._t))

    def rates(self, n: int) -> "np.ndarray":
        """The learning rates of the next ``n`` steps (float64), as :attr:`lr` gives them step by step; a chunk of
        steps reads them at once.  Only for a schedule whose rate does not depend on the losses.

        Parameters
        ----------
        n
            How many steps.
        """
        import numpy as np

        t0 = self._t
        return np.array([self._lr(t0 + j) for j in range(n)], np.float64)

    def advance(self, n: int) -> None:
        """:meth:`step` ``n`` times, for a schedule whose rate does not depend on the losses (a chunk's steps).

        Parameters
        ----------
        n
            How many steps were applied.
        """
        if type(self)._update is not Schedule._update:
            raise TypeError(f"the {type(self).__name__} schedule reacts to each step's loss: call step(loss)")
        self._t += int(n)

    def step(self, loss: float | None = None) -> None:
        """Advance by one batch; ``loss`` is the batch's mean loss (``None`` if the schedule ignores it).

        Parameters
        ----------
        loss
            The batch's mean loss (a rate that reacts to it, as ``"adaptive"``'s, needs it), or None.
        """
        if loss is not None and type(loss) is not float:
            loss = _loss_value(loss)
        self._update(loss)
        self._t += 1

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly, as a plain JSON-able dict (with ``"name"``)."""
        state: dict[str, Any] = {"name": self.name, "t": self._t}
        state.update((k, getattr(self, k)) for k in self._params)
        state.update(self._get_state())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the hyper-parameters must match this schedule's.

        Nothing changes if the state is rejected.  Keys missing from an older state get their defaults.

        Parameters
        ----------
        state
            What :meth:`state_dict` returned (its ``"name"`` and parameters must be this schedule's).
        """
        self._apply_state(self._check_state(state))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._params)
        return f"{type(self).__name__}({args})"

    # -- bookkeeping -----------------------------------------------------------------------------

    @classmethod
    def _param_kwargs(cls, state: Mapping[str, Any]) -> dict[str, Any]:
        """``__init__`` keyword arguments found in ``state``; error if a required one is missing."""
        sig = inspect.signature(cls).parameters
        keys = [k for k in cls._params if k in sig]
        missing = [k for k in keys if k not in state and sig[k].default is inspect.Parameter.empty]
        if missing:
            raise ValueError(f"{cls.name!r} state lacks required key(s) {missing}")
        return {k: state[k] for k in keys if k in state}

    def _check_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(state, Mapping):
            raise TypeError(f"a schedule state must be a mapping, got {type(state).__name__}")
        if state.get("name") != self.name:
            raise ValueError(f"state is for schedule {state.get('name')!r}, this schedule is {self.name!r}")
        allowed = {"name", "t", *self._params, *self._state_defaults}
        unknown = sorted(set(state) - allowed, key=str)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in {self.name!r} state; expected some of {sorted(allowed)}")
        other = type(self)._from_params(state)
        diffs = [f"{k}: state has {getattr(other, k)!r}, this schedule has {getattr(self, k)!r}"
                 for k in self._params if getattr(other, k) != getattr(self, k)]
        if diffs:
            raise ValueError(f"{self.name!r} state does not match this schedule: " + "; ".join(diffs))
        if "t" not in state:
            raise ValueError(f"{self.name!r} state lacks required key 't'")
        t = _check_int("t", state["t"], ge=0)
        extra = {k: state.get(k, default) for k, default in self._state_defaults.items()}
        return {"t": t, "extra": self._check_extra(extra)}

    def _apply_state(self, checked: dict[str, Any]) -> None:
        self._t = checked["t"]
        self._apply_extra(checked["extra"])


def as_schedule(value: Schedule | float | str, **kwargs: Any) -> Schedule:
    """A schedule from a schedule (returned as is), a float (:class:`Constant`) or a name plus arguments.

    Names are scikit-learn's ``learning_rate`` values (``"constant"``, ``"invscaling"``, ``"optimal"``,
    ``"adaptive"``) and the other schedules' names; keyword arguments are the schedule's own
    (``eta0``, ``power_t``, ``alpha``, ...).  Arguments a schedule does not take are an error.

    Parameters
    ----------
    value
        A :class:`Schedule` (returned as is), a float (a constant rate) or a schedule name.
    **kwargs
        The named schedule's own arguments (``eta0``, ``power_t``, ``alpha``, ...).

    Examples
    --------
    >>> as_schedule(0.05)
    Constant(eta0=0.05)
    >>> as_schedule("invscaling", eta0=0.1, power_t=0.5)
    InvScaling(eta0=0.1, power_t=0.5)
    """
    if isinstance(value, Schedule) or _is_real(value):
        if kwargs:
            raise TypeError(f"keyword arguments {sorted(kwargs)} apply only to a schedule name, not to {value!r}")
        if isinstance(value, Schedule):
            return value
        constant: Any = _by_name()["constant"]
        return constant(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a Schedule, a float or a schedule name, got {value!r}")
    cls = _by_name().get(value)
    if cls is None:
        raise ValueError(f"unknown learning-rate schedule {value!r}; expected one of {sorted(_by_name())}")
    sig = inspect.signature(cls).parameters
    unexpected = sorted(set(kwargs) - set(sig))
    if unexpected:
        raise TypeError(f"schedule {value!r} got unexpected keyword argument(s) {unexpected}; "
                        f"it takes {list(sig)}")
    missing = [k for k, p in sig.items() if p.default is inspect.Parameter.empty and k not in kwargs]
    if missing:
        raise TypeError(f"schedule {value!r} needs keyword argument(s) {missing}")
    return cls(**kwargs)


def schedule_from_state_dict(state: Mapping[str, Any]) -> Schedule:
    """Rebuild any schedule from its :meth:`Schedule.state_dict` (chosen by ``"name"``; no eval, no pickle).

    Parameters
    ----------
    state
        What :meth:`Schedule.state_dict` returned (its ``"name"`` picks the class, the rest its parameters and
        step count).

    Examples
    --------
    >>> from streamfit.schedules import CosineDecay
    >>> s = CosineDecay(eta0=1.0, decay_steps=4)
    >>> s.step(); s.step()
    >>> r = schedule_from_state_dict(s.state_dict())
    >>> r, r.t, r.lr
    (CosineDecay(eta0=1.0, decay_steps=4, eta_min=0.0), 2, 0.5)
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"a schedule state must be a mapping, got {type(state).__name__}")
    cls = _by_name().get(state.get("name"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown schedule name {state.get('name')!r} in state; expected one of {sorted(_by_name())}")
    schedule = cls._from_params(state)
    schedule.load_state_dict(state)
    return schedule


def _by_name() -> dict[str, type[Schedule]]:
    """The built-in schedules by name (each registers itself as its module, imported by the package, defines it)."""
    return dict(_BUILT_IN)


# -- argument checks shared by the schedules ------------------------------------------------------

def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_real(name: str, value: Any, *, gt: float | None = None, ge: float | None = None,
                le: float | None = None) -> float:
    """``value`` as a finite float within the bounds, else an error naming ``name`` and the value."""
    if not _is_real(value):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    for ok, cond in ((gt is None or x > gt, f"> {gt}"), (ge is None or x >= ge, f">= {ge}"),
                     (le is None or x <= le, f"<= {le}")):
        if not ok:
            raise ValueError(f"{name} must be {cond}, got {x!r}")
    return x


def _check_int(name: str, value: Any, *, ge: int) -> int:
    """``value`` as an int ``>= ge``, else an error naming ``name`` and the value."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < ge:
        raise ValueError(f"{name} must be >= {ge}, got {value!r}")
    return int(value)


def _loss_value(loss: Any) -> float:
    if isinstance(loss, (str, bytes, bool)):
        raise TypeError(f"loss must be a real number or None, got {loss!r}")
    try:
        return float(loss)
    except (TypeError, ValueError):
        raise TypeError(f"loss must be a real number or None, got {loss!r}") from None
