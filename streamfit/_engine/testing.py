"""Small ONNX models for doctests, tests and benchmarks."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

__all__ = ["linear_model", "mlp_model"]

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _model(nodes: list[Any], inits: list[Any], n_in: int, n_out: int, dtype: np.dtype) -> ModelProto:
    elem = _ELEM[np.dtype(dtype)]
    graph = helper.make_graph(nodes, "streamfit_test", [helper.make_tensor_value_info("X", elem, [None, n_in])],
                              [helper.make_tensor_value_info("Y", elem, [None, n_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def linear_model(n_features: int, n_outputs: int = 1, dtype: Any = np.float32, seed: int | None = None,
                 gemm: bool = False) -> ModelProto:
    """``Y = X @ W + B`` (MatMul + Add, or one Gemm); zero weights unless ``seed`` is given."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((n_features, n_outputs)) * 0.1 if seed is not None
         else np.zeros((n_features, n_outputs))).astype(dtype)
    B = np.zeros((n_outputs,), dtype)
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]
    if gemm:
        nodes = [helper.make_node("Gemm", ["X", "W", "B"], ["Y"])]
    else:
        nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])]
    return _model(nodes, inits, n_features, n_outputs, dtype)


def mlp_model(sizes: Sequence[int], activation: str | Sequence[str] = "Relu", dtype: Any = np.float32,
              seed: int = 0, gemm: bool = False) -> ModelProto:
    """A multilayer perceptron ``sizes[0] -> ... -> sizes[-1]`` with Glorot-uniform weights."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    acts = [activation] * (len(sizes) - 2) if isinstance(activation, str) else list(activation)
    nodes, inits = [], []
    prev = "X"
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        inits.append(numpy_helper.from_array(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype), f"W{i}"))
        inits.append(numpy_helper.from_array(np.zeros(fan_out, dtype), f"B{i}"))
        last = i == len(sizes) - 2
        out = "Y" if last else f"H{i}"
        if gemm:
            nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [out if last else f"Z{i}"]))
        else:
            nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"M{i}"]))
            nodes.append(helper.make_node("Add", [f"M{i}", f"B{i}"], [out if last else f"Z{i}"]))
        if not last:
            nodes.append(helper.make_node(acts[i], [f"Z{i}"], [out]))
        prev = out
    return _model(nodes, inits, sizes[0], sizes[-1], dtype)
