"""The optimizer interface: an update rule emitted as ONNX nodes, with per-weight device-resident state.

An optimizer never runs anything itself.  The engine asks it for the update nodes of each weight
(built once, into the fused graph or into the separate update graph), for the per-weight state
slots to allocate on the device, and, once per step, for the scalar inputs of the rule (learning
rate, bias corrections).  ``numpy_update`` is the same rule in numpy: the reference the tests use.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._params import Parameters

__all__ = ["Optimizer", "check_range"]


class Optimizer(Parameters, abc.ABC):
    """An update rule: ONNX nodes emitted once into the training graph, plus its numpy twin.

    A subclass writes :meth:`update` and :meth:`numpy_update` and, if needed, :attr:`slots`,
    :attr:`scalar_names`/:meth:`scalars` and :meth:`init_state` (see :mod:`streamfit.graph` for an example).

    What it emits: for each trained weight the engine calls ``update(b, w, g, state, s)`` once, while it
    builds the graph, with graph names: ``w`` the weight, ``g`` its gradient (penalty included), ``state``
    ``{slot: input name}`` for each of :attr:`slots`, ``s`` ``{scalar: input name}`` for each of
    :attr:`scalar_names` (0-d, of the weights' dtype).  It adds nodes through the
    :class:`~streamfit.graph.GraphBuilder` ``b`` and returns the names of the new weight and of the new
    value of every slot (same shapes).  The engine checks every new value for finiteness and applies the
    step only when all are finite.

    What it is fed: before each step the engine calls ``scalars(lr, t)`` (``t`` steps applied so far, ``lr``
    the schedule's rate) and feeds the values as the :attr:`scalar_names` inputs.

    Its state: the slots, allocated by :meth:`init_state` (zeros the shape of the weight by default), live
    next to the weights on the device; ``Trainer.state_dict()["optimizer"]`` holds one array per weight and
    slot, keyed ``"<weight>__<slot>"``, and checkpoints save and restore them with the weights.  The
    optimizer object itself holds only hyper-parameters (:meth:`get_params`), never per-step state.
    """

    name: ClassVar[str]
    #: Names of the per-weight state slots (each the shape of its weight, zero-initialized).
    slots: ClassVar[tuple[str, ...]] = ()
    #: Names of the scalar inputs fed at every step; ``"lr"`` always comes first.
    scalar_names: ClassVar[tuple[str, ...]] = ("lr",)
    #: ``update`` takes the weight's shape as the keyword ``shape`` (rules whose graph depends on it)
    shaped: ClassVar[bool] = False
    #: a zero gradient leaves a weight and its state unchanged, so a row-sparse update of a table computes
    #: exactly the dense step (SGD, AdaGrad, FTRL); otherwise it is the lazy variant (Adam -> SparseAdam)
    zero_gradient_fixed: ClassVar[bool] = False
    #: the rule takes the gradient of the batch's summed loss (each row one of its examples: hyper-parameters
    #: mean per row what they mean at batch 1, whatever the batch size), not of its mean loss
    summed_gradient: bool = False

    def scalars(self, lr: float, t: int) -> tuple[float, ...]:
        """Scalar inputs for the step that follows ``t`` completed steps.

        Parameters
        ----------
        lr
            The schedule's learning rate for this step.
        t
            Steps applied so far (0 before the first).
        """
        return (lr,)

    def scalars_of_steps(self, lrs: np.ndarray, t: int) -> np.ndarray:
        """:meth:`scalars` of ``len(lrs)`` steps at once ([steps, len(scalar_names)], float64): step ``j`` at rate
        ``lrs[j]`` after ``t + j`` completed steps (a chunk of steps reads them together).  A rule that overrides
        :meth:`scalars` may override this with the same arithmetic on arrays.

        Parameters
        ----------
        lrs
            The learning rate of each step, in order.
        t
            Steps applied before the first of them.
        """
        if type(self).scalars is Optimizer.scalars:
            return np.asarray(lrs, np.float64).reshape(-1, 1)
        return np.array([self.scalars(float(lr), t + j) for j, lr in enumerate(lrs)], np.float64).reshape(
            len(lrs), len(self.scalar_names))

    @abc.abstractmethod
    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        """Emit the nodes of one weight's update; return the new weight and new state names.

        Parameters
        ----------
        b
            The :class:`~streamfit.graph.GraphBuilder` to add the nodes through.
        w, g
            Graph names of the weight and of its gradient (penalty included).
        state
            ``{slot: graph name}`` of the weight's current state, one per :attr:`slots`.
        s
            ``{scalar: graph name}`` of this step's scalar inputs, one per :attr:`scalar_names`.
        """

    @abc.abstractmethod
    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The same rule in numpy (reference for tests and documentation).

        Parameters
        ----------
        w, g
            The weight and its gradient.
        state
            ``{slot: array}``: the weight's state.
        s
            ``{scalar: value}``: the step's scalars (what :meth:`scalars` gives, by :attr:`scalar_names`).
        """

    def auto_eta0(self) -> float:
        """The learning rate ``eta0="auto"`` (the ready-made models' default) starts this rule from: 0.01 here
        (River's SGD; Adam's on standardized features).  Rules that scale their steps say otherwise."""
        return 0.01

    def init_state(self, w: np.ndarray) -> dict[str, np.ndarray]:
        """Initial value of each slot for weight ``w`` (zeros like ``w``).

        Parameters
        ----------
        w
            The weight's initial value (its shape and dtype).
        """
        return {slot: np.zeros_like(w) for slot in self.slots}

    def folds_into_gradients(self) -> bool:
        """True when the rule is exactly plain SGD, ``w - lr * g``, with no state and ``lr`` as its only scalar.

        The fused step then takes its fast path: it backpropagates lr-scaled gradients and folds the update
        into the GEMMs that make them (``Gemm(A, B, C=w, alpha=-1, beta=1)``), so :meth:`update` is not
        emitted at all.  False here: the engine emits :meth:`update`.  :class:`~streamfit.optim.SGD` says True,
        and so do its subclasses that keep its rule.
        """
        return False

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


def check_range(name: str, value: float, low: float, high: float | None = None) -> float:
    """Validate a hyper-parameter: ``low <= value`` (``< high`` when given), with a clear message."""
    value = float(value)
    if not (value >= low and (high is None or value < high)):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return value
