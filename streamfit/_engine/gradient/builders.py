"""The gradient graphs of a prepared model, from one of two builders.

onnxruntime-training's ``OrtModuleGraphBuilder`` gives forward + backward with a ``YieldOp`` where dL/dY
enters (any op it knows; Python <= 3.12), rewritten here for speed and float64
(:mod:`~streamfit._engine.gradient.rewrites`); streamfit's own (:mod:`~streamfit._engine.gradient.autodiff`)
writes the same form from standard ops only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

from streamfit._engine.common.ort_private import has_ort_training, ort_gradient
from streamfit._engine.gradient.autodiff import build_own_gradient
from streamfit._engine.gradient.graphs import GradientGraphs
from streamfit._engine.gradient.weight_shapes import reduce_to_weight_shapes
from streamfit._engine.gradient.rewrites import (decompose_fused_matmul, float64_activation_grads,
                                                propagate_matmul_shapes, remove_noop_reshapes, replace_relu_grad,
                                                shape_table, simplify_broadcast_gradients)
from streamfit._engine.prepare.model import PreparedModel
from streamfit.exceptions import ModelError

__all__ = ["GRADIENT_BUILDERS", "build_gradient_graphs"]


#: gradient builders: onnxruntime-training's ``OrtModuleGraphBuilder`` (any op it knows; Python <= 3.12) and
#: streamfit's own (:mod:`streamfit._engine.gradient.autodiff`: the ready-made models' ops, standard ops only)
GRADIENT_BUILDERS = ("auto", "onnxruntime", "streamfit")


def build_gradient_graphs(pm: PreparedModel, input_grads: Sequence[str] = (), builder: str = "auto") -> GradientGraphs:
    """Forward and gradient graphs of ``pm`` with respect to its trained weights (and the inputs
    ``input_grads``: the gradient graph then also outputs theirs).

    ``builder="auto"`` uses onnxruntime-training's where it is installed, else streamfit's own (which says
    clearly when a model's ops need onnxruntime-training)."""
    if builder not in GRADIENT_BUILDERS:
        raise ValueError(f"gradient builder must be one of {GRADIENT_BUILDERS}, got {builder!r}")
    if builder == "streamfit" or (builder == "auto" and not has_ort_training()):
        return build_own_gradient(pm, input_grads)
    if not has_ort_training():
        raise ModelError("the onnxruntime gradient builder needs onnxruntime-training at train time (Python <= 3.12); "
                         "this onnxruntime is an inference build")
    try:
        built = ort_gradient(pm.with_host_inputs(pm.model).SerializeToString(), pm.weights, input_grads)
    except Exception as exc:
        raise ModelError(f"onnxruntime-training cannot build the gradient of this model: {exc}") from exc
    info = built.info
    gradient = onnx.load_from_string(built.gradient)
    shapes = shape_table(pm.model, pm.initial)
    propagate_matmul_shapes(gradient, shapes)
    simplify_broadcast_gradients(gradient, shapes)
    remove_noop_reshapes(gradient, shapes, protect={pm.output_name})
    if pm.dtype == np.float64:  # contrib gradient kernels registered for float only
        decompose_fused_matmul(gradient, pm.dtype)
        replace_relu_grad(gradient, pm.dtype)
        float64_activation_grads(gradient, pm.dtype)
    order = list(info.initializer_names_to_train)
    grads = dict(zip(order, info.initializer_grad_names_to_train))
    reduce_to_weight_shapes(gradient, grads, {w: pm.initial[w].shape for w in pm.weights})
    return GradientGraphs(onnx.load_from_string(built.forward), gradient,
                          [grads[w] for w in pm.weights], info, shapes,
                          [info.user_input_grad_names[name] for name in input_grads])
