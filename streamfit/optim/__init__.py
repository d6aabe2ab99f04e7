"""Optimizers: update rules emitted as ONNX nodes, with device-resident per-weight state."""

from __future__ import annotations

from typing import Any

from streamfit.optim.adagrad import AdaGrad
from streamfit.optim.adam import Adam
from streamfit.optim.adamw import AdamW
from streamfit.optim.base import Optimizer
from streamfit.optim.ftrl import FTRL
from streamfit.optim.momentum import Momentum
from streamfit.optim.nesterov import Nesterov
from streamfit.optim.rowwise_adagrad import RowWiseAdaGrad
from streamfit.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Momentum", "Nesterov", "Adam", "AdamW", "AdaGrad", "RowWiseAdaGrad", "FTRL", "get_optimizer"]

_BY_NAME: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Momentum, Nesterov, Adam, AdamW, AdaGrad, RowWiseAdaGrad, FTRL)}


def get_optimizer(optimizer: "str | Optimizer", **params: Any) -> Optimizer:
    """An optimizer from an instance or a name (``"sgd"``, ``"adam"``, ...); ``params`` go to its constructor.

    Parameters
    ----------
    optimizer
        An :class:`Optimizer` (returned as is) or an optimizer name (``"sgd"``, ``"adam"``, ``"momentum"``,
        ``"nesterov"``, ``"adagrad"``, ``"rowwise_adagrad"``, ``"adamw"``, ``"ftrl"``).
    **params
        The optimizer's own arguments (``momentum``, ``beta1``, ...), for a name only.

    Examples
    --------
    >>> get_optimizer("nesterov", momentum=0.5)
    Nesterov(momentum=0.5)
    """
    if isinstance(optimizer, Optimizer):
        return optimizer
    if optimizer not in _BY_NAME:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(_BY_NAME)}")
    return _BY_NAME[optimizer](**params)
