"""The ONNX graphs of the ready-made models: dense layers from weight arrays, and input standardization.

Layer ``i`` is ``MatMul(H, coef_i) + intercept_i`` followed by the hidden activation (none after the last
layer: the output is a score, a logit or a regression value).  The names ``coef_<i>`` / ``intercept_<i>``
are what the trainer trains and what ``state_dict()["trainer"]["weights"]`` holds.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.names import Names

__all__ = ["ACTIVATIONS", "dense_model", "layers_of", "standardized", "destandardized", "coef_name",
           "intercept_name", "SCALER_MEAN", "SCALER_SCALE", "scaler_tensors", "layer_names"]

#: Hidden-layer activations by scikit-learn's name -> ONNX operator (``None``: no node).
ACTIVATIONS: dict[str, str | None] = {"identity": None, "relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid"}
INPUT, OUTPUT = "X", "Y"
#: the initializers of :func:`standardized`'s ``Sub``/``Div``: the ready-made estimators keep them as the
#: trainer's host tensors, written by their running scaler
SCALER_MEAN, SCALER_SCALE = Names.scaler_mean, Names.scaler_scale
_ELEM: dict[np.dtype, int] = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}
_OPSET, _IR = 17, 8


def coef_name(i: int) -> str:
    return f"coef_{i}"


def intercept_name(i: int) -> str:
    return f"intercept_{i}"


def dense_model(layers: Sequence[tuple[np.ndarray, np.ndarray]], activation: str = "identity",
                dtype: Any = np.float32) -> ModelProto:
    """``X -> (MatMul + Add -> activation)* -> MatMul + Add -> Y`` with the given ``(coef, intercept)`` pairs.

    >>> import numpy as np, onnxruntime as ort
    >>> m = dense_model([(np.ones((2, 1)), np.array([0.5]))])
    >>> ort.InferenceSession(m.SerializeToString()).run(None, {"X": np.ones((1, 2), np.float32)})[0]
    array([[2.5]], dtype=float32)
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
    if not layers:
        raise ValueError("a dense model needs at least one layer")
    dtype = np.dtype(dtype)
    nodes, inits = [], []
    prev = INPUT
    for i, (coef, intercept) in enumerate(layers):
        coef, intercept = np.asarray(coef, dtype), np.asarray(intercept, dtype).reshape(-1)
        if coef.ndim != 2 or intercept.shape != (coef.shape[1],):
            raise ValueError(f"layer {i}: coef {coef.shape} and intercept {intercept.shape} do not make a layer "
                             "(expected (fan_in, fan_out) and (fan_out,))")
        if i and coef.shape[0] != layers[i - 1][0].shape[1]:
            raise ValueError(f"layer {i} takes {coef.shape[0]} inputs but layer {i - 1} gives "
                             f"{layers[i - 1][0].shape[1]}")
        inits += [numpy_helper.from_array(coef, coef_name(i)), numpy_helper.from_array(intercept, intercept_name(i))]
        last = i == len(layers) - 1
        nodes.append(helper.make_node("MatMul", [prev, coef_name(i)], [f"matmul_{i}"]))
        op = ACTIVATIONS[activation]
        out = OUTPUT if last else f"h_{i}" if op is None else f"z_{i}"
        nodes.append(helper.make_node("Add", [f"matmul_{i}", intercept_name(i)], [out]))
        if not last and op is not None:
            nodes.append(helper.make_node(op, [out], [f"h_{i}"]))
        prev = f"h_{i}"
    n_in, n_out = int(np.shape(layers[0][0])[0]), int(np.shape(layers[-1][0])[1])
    graph = helper.make_graph(nodes, "streamfit_dense",
                              [helper.make_tensor_value_info(INPUT, _ELEM[dtype], [None, n_in])],
                              [helper.make_tensor_value_info(OUTPUT, _ELEM[dtype], [None, n_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR)


def scaler_tensors(model: ModelProto) -> tuple[str, ...]:
    """The standardization initializers of a model made by :func:`standardized` (none: it has none)."""
    names = {i.name for i in model.graph.initializer}
    return (SCALER_MEAN, SCALER_SCALE) if SCALER_MEAN in names and SCALER_SCALE in names else ()


def layer_names(model: ModelProto) -> list[str]:
    """The trained weights of a dense model, in order: ``coef_0, intercept_0, coef_1, ...``."""
    names = {i.name for i in model.graph.initializer}
    out, i = [], 0
    while coef_name(i) in names:
        out += [coef_name(i), intercept_name(i)]
        i += 1
    return out


def layers_of(weights: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``(coef, intercept)`` pairs, in order, from named weights (a trainer's or a state's)."""
    layers, i = [], 0
    while coef_name(i) in weights:
        layers.append((np.asarray(weights[coef_name(i)]), np.asarray(weights[intercept_name(i)])))
        i += 1
    if not layers:
        raise ValueError(f"no dense-layer weights ({coef_name(0)}, {intercept_name(0)}, ...) in {sorted(weights)}")
    return layers


def standardized(model: ModelProto, mean: np.ndarray, scale: np.ndarray) -> ModelProto:
    """A copy of ``model`` that standardizes its input first: ``X -> (X - mean) / scale -> model``.

    ``mean`` and ``scale`` are cast to the input's element type, so the graph computes exactly what
    ``((X - mean) / scale)`` computes in numpy in that type.
    """
    out = ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inputs = {i.name for i in graph.input} - {i.name for i in graph.initializer}
    if len(inputs) != 1:
        raise ValueError(f"expected a model with one input, got {sorted(inputs)}")
    name = inputs.pop()
    elem = next(i for i in graph.input if i.name == name).type.tensor_type.elem_type
    dtype = {v: k for k, v in _ELEM.items()}[elem]
    inner = Names.standardized
    for node in graph.node:
        for k, value in enumerate(node.input):
            if value == name:
                node.input[k] = inner
    scale_nodes = [helper.make_node("Sub", [name, SCALER_MEAN], [Names.centered]),
                   helper.make_node("Div", [Names.centered, SCALER_SCALE], [inner])]
    nodes = scale_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend([numpy_helper.from_array(np.asarray(mean, dtype).reshape(-1), SCALER_MEAN),
                              numpy_helper.from_array(np.asarray(scale, dtype).reshape(-1), SCALER_SCALE)])
    return out


def destandardized(model: ModelProto, mean: np.ndarray, scale: np.ndarray) -> ModelProto:
    """A copy of ``model`` whose output is mapped back to target units: ``Y -> Y * scale + mean``.

    The inverse of the target standardization the ready-made regressors train with (``mean`` and
    ``scale`` per output column, cast to the output's element type).
    """
    out = ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    if len(graph.output) != 1:
        raise ValueError(f"expected a model with one output, got {[o.name for o in graph.output]}")
    name = graph.output[0].name
    dtype = {v: k for k, v in _ELEM.items()}[graph.output[0].type.tensor_type.elem_type]
    inner = Names.standardized_output
    for node in graph.node:
        node.output[:] = [inner if o == name else o for o in node.output]
        node.input[:] = [inner if i == name else i for i in node.input]
    graph.node.extend([helper.make_node("Mul", [inner, Names.target_scale], [Names.target_scaled]),
                       helper.make_node("Add", [Names.target_scaled, Names.target_mean], [name])])
    graph.initializer.extend([numpy_helper.from_array(np.asarray(mean, dtype).reshape(-1), Names.target_mean),
                              numpy_helper.from_array(np.asarray(scale, dtype).reshape(-1), Names.target_scale)])
    return out
