"""The gradient graphs of a prepared model: what a gradient builder returns and the step graphs are built from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnx import ModelProto

__all__ = ["GradientGraphs"]


@dataclass
class GradientGraphs:
    """What ``OrtModuleGraphBuilder`` returns: forward model (weights as inputs), gradient model, info.

    streamfit's own builder (:mod:`~streamfit._engine.gradient.autodiff`) returns the same form."""

    forward: ModelProto
    gradient: ModelProto
    grad_names: list[str]
    info: Any
    #: static shapes of forward tensors and their ``*_grad`` twins (ints, symbols or None per dim)
    shapes: dict[str, list] = field(default_factory=dict)
    #: gradients of the inputs asked for (the rows of sparse tables), in the order asked
    input_grad_names: list[str] = field(default_factory=list)
