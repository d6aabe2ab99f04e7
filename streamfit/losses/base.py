"""The loss interface: a small ONNX graph giving the batch loss and dL/dY, plus its numpy twin."""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit._params import Parameters

__all__ = ["Loss"]


class Loss(Parameters, abc.ABC):
    """Mean over the batch of ``sample_weight * l(y, t)``, and its gradient with respect to ``y``.

    A subclass writes only the per-element terms, once in ONNX (:meth:`terms`) and once in numpy
    (:meth:`numpy_terms`); the weighting and the mean are shared (see :mod:`streamfit.graph` for an example).
    The graph takes the weighting as two per-row vectors the engine fills on the host (``loss_weight =
    loss_factor * sw / N`` and ``grad_weight = scale * sw / N``), which keeps Shape/Size/Div chains and
    scalar multiplications out of the training graph: at batch 1 a step costs about 0.2 us per node.

    What it emits: ``terms(b, y, t)`` is called once, while the engine builds the graph, with the names of
    the model's output ``y`` (float, ``[N]`` or ``[N, ...]``) and of the labels ``t`` (the shape of ``y``, or
    int64 ``[N]`` class indices when :attr:`integer_labels`); it adds nodes through the
    :class:`~streamfit.graph.GraphBuilder` ``b`` and returns the names of the per-row (or per-element) loss
    divided by :attr:`loss_factor` and of ``dl/dy`` (the shape of ``y``), both broadcastable against the
    ``[N, 1]`` row weights.  The engine sums the weighted loss (the batch loss it reports and checks) and
    backpropagates the weighted ``dl/dy``.  A loss has no state: its parameters are :meth:`get_params`, the
    constructor's arguments stored under their names (equality and ``repr`` use them).
    """

    name: ClassVar[str]
    #: True when labels are integer class indices (softmax cross-entropy).
    integer_labels: ClassVar[bool] = False
    #: A constant factor the ONNX per-row loss of :meth:`terms` leaves out (the loss weights carry it).
    loss_factor: ClassVar[float] = 1.0

    @abc.abstractmethod
    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        """Emit the per-row (or per-element) loss divided by :attr:`loss_factor`, and dl/dy; return their names
        (both broadcastable against a (N, 1) weight).

        Parameters
        ----------
        b
            The :class:`~streamfit.graph.GraphBuilder` to add the nodes through.
        y, t
            Graph names of the model's output (``(N, k)``) and of the targets (labels as the loss takes them).
        """

    @abc.abstractmethod
    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """numpy twin of :meth:`terms`, loss factor included (the reference the tests check the graph against).

        Parameters
        ----------
        y, t
            The model's output ``(N, k)`` and the targets, as arrays.
        """

    def graph(self, b: GraphBuilder, y: str, t: str, loss_weight: str, grad_weight: str) -> tuple[str, str]:
        """Emit the nodes; return the names of the scalar loss and of dL/dY (shape of ``y``).

        ``loss_weight`` holds ``loss_factor * sample_weight / N`` per row, ``grad_weight`` holds
        ``scale * sample_weight / N`` (``scale`` is 1, or the learning rate when the fused SGD step
        backpropagates lr-scaled gradients so that its update folds into the gradient GEMMs).

        Parameters
        ----------
        b
            The :class:`~streamfit.graph.GraphBuilder` to add the nodes through.
        y, t
            Graph names of the model's output and of the targets.
        loss_weight, grad_weight
            Graph names of the ``(N, 1)`` row weights of the loss and of the gradient (above).
        """
        per_row, dl = self.terms(b, y, t)
        loss = b.op("ReduceSum", b.op("Mul", per_row, loss_weight), keepdims=0)
        return loss, b.op("Mul", dl, grad_weight)

    def numpy(self, y: np.ndarray, t: np.ndarray, sw: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """Loss and dL/dY in numpy, for tests and for progressive validation without a session.

        Parameters
        ----------
        y, t
            The model's output ``(N, k)`` and the targets.
        sw
            Row weights (``N`` values), or None for 1 each.
        """
        y = np.asarray(y)
        n = y.shape[0]
        sw = np.ones((n, 1), y.dtype) if sw is None else np.asarray(sw, y.dtype).reshape(n, 1)
        per_row, dl = self.numpy_terms(y, np.asarray(t))
        return float((per_row * sw).sum() / n), dl * sw / n

    def dloss(self, p: float, y: float) -> float:
        """Derivative of the loss of one sample wrt a scalar prediction (learning-rate heuristics).

        Parameters
        ----------
        p, y
            The prediction (a scalar score) and the target.
        """
        _, d = self.numpy_terms(np.array([[p]], np.float64), np.array([[y]], np.float64))
        return float(d.ravel()[0])

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_params() == other.get_params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.get_params().items()))))
