"""onnxruntime's private API, in one place: the engine's only import of ``onnxruntime.capi._pybind_state``.

The engine binds buffers once and runs sessions through ``IOBinding`` on the C session (``sess._sess``),
builds gradients with onnxruntime-training's ``OrtModuleGraphBuilder`` and runs the forward/backward step
through its ``TrainingAgent``: none of that is onnxruntime's public Python API.  Every such use goes
through this module, so a change in onnxruntime's private surface is mended here.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as _C
from onnxruntime.capi._pybind_state import OrtDevice, OrtValue, SessionIOBinding

__all__ = ["OrtDevice", "OrtValue", "SessionIOBinding", "cpu_device", "device_of", "pinned_device", "from_numpy", "from_shape_and_type", "raw_session",
           "io_binding", "has_ort_training", "OrtGradient", "ort_gradient", "training_agent", "value_vector",
           "partial_state"]


def cpu_device() -> OrtDevice:
    """The host (CPU, default memory) device."""
    return OrtDevice(OrtDevice.cpu(), OrtDevice.default_memory(), 0)


def device_of(kind: str, index: int) -> OrtDevice:
    """The default-memory device of ``kind`` ("cpu" or "cuda") and ``index``."""
    return OrtDevice(OrtDevice.cpu() if kind == "cpu" else OrtDevice.cuda(), OrtDevice.default_memory(), index)


def pinned_device(index: int) -> OrtDevice:
    """OrtDevice(CPU, CUDA_PINNED=1, index): the memory type ORT's CUDA provider uses for pinned buffers."""
    return OrtDevice(OrtDevice.cpu(), 1, index)


def from_numpy(array: np.ndarray, device: OrtDevice) -> OrtValue:
    """An OrtValue holding ``array`` (sharing its memory on the host: keep ``array`` alive while it is bound)."""
    return OrtValue.ortvalue_from_numpy(array, device)


def from_shape_and_type(shape: Sequence[int], dtype: Any, device: OrtDevice) -> OrtValue:
    """A new OrtValue of ``shape`` and ``dtype`` allocated on ``device``."""
    return OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(dtype).type, device)


def raw_session(session: ort.InferenceSession) -> Any:
    """The C session behind ``session``: what ``run_with_iobinding(io, None)`` runs on the hot path."""
    return session._sess


def io_binding(session: ort.InferenceSession) -> SessionIOBinding:
    """A new IOBinding of ``session``, bound by name (``bind_ortvalue_input``/``_output``)."""
    return SessionIOBinding(session._sess)


def has_ort_training() -> bool:
    """True when this onnxruntime is a training build (it has ``OrtModuleGraphBuilder``)."""
    return hasattr(_C, "OrtModuleGraphBuilder")


class OrtGradient:
    """What onnxruntime-training's ``OrtModuleGraphBuilder`` made of a model: its graph info and the forward
    and gradient models as serialized bytes."""

    def __init__(self, info: Any, forward: bytes, gradient: bytes) -> None:
        self.info = info
        self.forward = forward
        self.gradient = gradient


def ort_gradient(model: bytes, weights: Sequence[str], input_grads: Sequence[str]) -> OrtGradient:
    """Build the gradient graph of the serialized ``model`` for ``weights`` (and the inputs ``input_grads``)
    with onnxruntime-training's builder; its exceptions pass through."""
    config = _C.OrtModuleGraphBuilderConfiguration()
    config.initializer_names = list(weights)
    config.initializer_names_to_train = list(weights)
    config.input_names_require_grad = list(input_grads)
    config.build_gradient_graph = True
    builder = _C.OrtModuleGraphBuilder()
    builder.initialize(model, config)
    builder.build(_C.TrainingGraphTransformerConfiguration())
    return OrtGradient(builder.get_graph_info(), builder.get_forward_model(), builder.get_gradient_model())


def training_agent(session: ort.InferenceSession, feed_names: Sequence[str], fw_devices: Sequence[OrtDevice],
                   grad_names: Sequence[str], grad_devices: Sequence[OrtDevice]) -> Any:
    """onnxruntime-training's ``TrainingAgent`` over a gradient-graph session (forward, then backward)."""
    return _C.TrainingAgent(session._sess, list(feed_names), list(fw_devices), list(grad_names), list(grad_devices), 0)


def value_vector(values: Sequence[OrtValue] = ()) -> Any:
    """An ``OrtValueVector`` (the TrainingAgent's feeds and fetches) holding ``values``."""
    vector = _C.OrtValueVector()
    for value in values:
        vector.push_back(value)
    return vector


def partial_state() -> Any:
    """A fresh ``PartialGraphExecutionState``: what a TrainingAgent forward keeps for its backward."""
    return _C.PartialGraphExecutionState()
