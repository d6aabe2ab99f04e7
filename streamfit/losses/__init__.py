"""Losses: each a small ONNX graph giving the batch loss and dL/dY, with an optional per-row weight."""

from __future__ import annotations

from typing import Any

from streamfit.losses.absolute import AbsoluteError
from streamfit.losses.base import Loss
from streamfit.losses.elastic import ElasticError
from streamfit.losses.epsilon_insensitive import EpsilonInsensitive
from streamfit.losses.hinge import Hinge
from streamfit.losses.huber import Huber
from streamfit.losses.log import BinaryLogLoss
from streamfit.losses.modified_huber import ModifiedHuber
from streamfit.losses.probability import ProbabilityLogLoss
from streamfit.losses.softmax import SoftmaxCrossEntropy
from streamfit.losses.squared_epsilon_insensitive import SquaredEpsilonInsensitive
from streamfit.losses.squared_hinge import SquaredHinge
from streamfit.losses.squared import SquaredError

__all__ = ["Loss", "SquaredError", "AbsoluteError", "Huber", "ElasticError", "EpsilonInsensitive",
           "SquaredEpsilonInsensitive", "BinaryLogLoss", "SoftmaxCrossEntropy", "ProbabilityLogLoss", "Hinge",
           "SquaredHinge", "ModifiedHuber", "get_loss"]

_BY_NAME: dict[str, type[Loss]] = {cls.name: cls for cls in
                                    (SquaredError, AbsoluteError, Huber, ElasticError, EpsilonInsensitive,
                                     SquaredEpsilonInsensitive, BinaryLogLoss, SoftmaxCrossEntropy,
                                     ProbabilityLogLoss, Hinge, SquaredHinge, ModifiedHuber)}
_ALIASES = {"mse": "squared_error", "l2": "squared_error", "mae": "absolute_error", "l1": "absolute_error",
            "log": "log_loss", "binary_log_loss": "log_loss", "cross_entropy": "softmax_cross_entropy",
            "nll": "probability_log_loss"}


def get_loss(loss: "str | Loss", **params: Any) -> Loss:
    """A loss object from an instance or a name (``"squared_error"``, ``"huber"``, ...).

    Parameters
    ----------
    loss
        A :class:`Loss` (returned as is) or a loss name: ``"squared_error"``, ``"huber"``, ``"log_loss"``, ...,
        scikit-learn's aliases, and ``"perceptron"`` (the hinge at threshold 0).
    **params
        The loss's own arguments (``delta``, ``epsilon``, ``threshold``, ...), for a name only.

    Examples
    --------
    >>> get_loss("huber", delta=2.0)
    Huber(delta=2.0)
    >>> get_loss("perceptron")
    Hinge(threshold=0.0)
    """
    if isinstance(loss, Loss):
        return loss
    if loss == "perceptron":  # scikit-learn's name for the hinge at threshold 0
        return Hinge(**{"threshold": 0.0, **params})
    key = _ALIASES.get(loss, loss)
    if key not in _BY_NAME:
        raise ValueError(f"unknown loss {loss!r}; expected one of {sorted(_BY_NAME)}")
    return _BY_NAME[key](**params)
