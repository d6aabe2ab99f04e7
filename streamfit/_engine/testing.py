"""Small ONNX models for doctests, tests and benchmarks."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

__all__ = ["linear_model", "mlp_model", "two_input_model", "cnn_model", "flags_model"]

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _model(nodes: list[Any], inits: list[Any], n_in: int, n_out: int, dtype: np.dtype) -> ModelProto:
    elem = _ELEM[np.dtype(dtype)]
    graph = helper.make_graph(nodes, "streamfit_test", [helper.make_tensor_value_info("X", elem, [None, n_in])],
                              [helper.make_tensor_value_info("Y", elem, [None, n_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def linear_model(n_features: int, n_outputs: int = 1, dtype: Any = np.float32, seed: int | None = None,
                 gemm: bool = False) -> ModelProto:
    """``Y = X @ W + B`` (MatMul + Add, or one Gemm); zero weights unless ``seed`` is given.

    Parameters
    ----------
    n_features, n_outputs
        Columns of ``X`` and of ``Y``.
    dtype
        The float type of the input, the weights and the output.
    seed
        Seed of random initial weights (normal, scale 0.1); None: zeros.
    gemm
        One ``Gemm`` node instead of ``MatMul`` + ``Add`` (as some exporters write a linear layer).
    """
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
    """A multilayer perceptron ``sizes[0] -> ... -> sizes[-1]`` with Glorot-uniform weights.

    Parameters
    ----------
    sizes
        Widths from the input to the output (``[20, 64, 1]``: 20 features, one hidden layer of 64, 1 output).
    activation
        The activation op of the hidden layers (``"Relu"``, ``"Tanh"``, ``"Sigmoid"``, ...), or one per hidden layer.
    dtype
        The float type of the input, the weights and the output.
    seed
        Seed of the initial weights.
    gemm
        ``Gemm`` nodes instead of ``MatMul`` + ``Add``.
    """
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


def _finish(nodes: list[Any], inits: list[Any], inputs: list[Any], n_out: int, dtype: np.dtype) -> ModelProto:
    graph = helper.make_graph(nodes, "streamfit_test", inputs,
                              [helper.make_tensor_value_info("Y", _ELEM[np.dtype(dtype)], [None, n_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def two_input_model(n_dense: int, vocab: int, dim: int = 4, n_outputs: int = 1, dtype: Any = np.float32,
                    seed: int = 0, id_dtype: Any = np.int64) -> ModelProto:
    """Dense floats ``x`` [N, n_dense] and integer ids ``ids`` [N] (an embedding table ``E`` through
    ``Gather``): ``Y = concat(x, E[ids]) @ W + B``.

    Parameters
    ----------
    n_dense
        Columns of ``x``.
    vocab, dim
        Rows and width of the embedding table ``E``.
    n_outputs
        Columns of ``Y``.
    dtype
        The float type of ``x``, the weights and the output.
    seed
        Seed of the initial weights.
    id_dtype
        The integer type of ``ids`` (int64, or int32 as some exporters write it).
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    E = (rng.standard_normal((vocab, dim)) * 0.1).astype(dtype)
    W = (rng.standard_normal((n_dense + dim, n_outputs)) * 0.1).astype(dtype)
    inits = [numpy_helper.from_array(E, "E"), numpy_helper.from_array(W, "W"),
             numpy_helper.from_array(np.zeros(n_outputs, dtype), "B")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["emb"], axis=0),
             helper.make_node("Concat", ["x", "emb"], ["h"], axis=1),
             helper.make_node("MatMul", ["h", "W"], ["hw"]), helper.make_node("Add", ["hw", "B"], ["Y"])]
    id_elem = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}[np.dtype(id_dtype)]
    inputs = [helper.make_tensor_value_info("x", _ELEM[dtype], ["N", n_dense]),
              helper.make_tensor_value_info("ids", id_elem, ["N"])]
    return _finish(nodes, inits, inputs, n_outputs, dtype)


def cnn_model(channels: int = 1, size: int = 8, filters: int = 3, n_outputs: int = 1, dtype: Any = np.float32,
              seed: int = 0) -> ModelProto:
    """A 4-D input ``X`` [N, channels, size, size]: Conv 3x3 (padding 1) -> Relu -> Flatten -> Gemm.

    Parameters
    ----------
    channels, size
        Channels and side of the square input images.
    filters
        Output channels of the convolution.
    n_outputs
        Columns of ``Y``.
    dtype
        The float type of the input, the weights and the output.
    seed
        Seed of the initial weights.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    K = (rng.standard_normal((filters, channels, 3, 3)) * 0.3).astype(dtype)
    W = (rng.standard_normal((filters * size * size, n_outputs)) * 0.05).astype(dtype)
    inits = [numpy_helper.from_array(K, "K"), numpy_helper.from_array(np.zeros(filters, dtype), "KB"),
             numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.zeros(n_outputs, dtype), "B")]
    nodes = [helper.make_node("Conv", ["X", "K", "KB"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "W", "B"], ["Y"])]
    inputs = [helper.make_tensor_value_info("X", _ELEM[dtype], ["N", channels, size, size])]
    return _finish(nodes, inits, inputs, n_outputs, dtype)


def flags_model(n_features: int, vocab: int, dtype: Any = np.float32, seed: int = 0) -> ModelProto:
    """Three inputs: floats ``x`` [N, n_features], int32 ids ``code`` [N] and a bool ``flag`` [N, 1]:
    ``Y = x @ W + E[code] + flag * F``.

    Parameters
    ----------
    n_features
        Columns of ``x``.
    vocab
        Rows of the table ``E`` the ids read.
    dtype
        The float type of ``x``, the weights and the output.
    seed
        Seed of the initial weights.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((n_features, 1)) * 0.1).astype(dtype), "W"),
             numpy_helper.from_array(np.zeros((vocab, 1), dtype), "E"),
             numpy_helper.from_array(np.zeros((1,), dtype), "F")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Gather", ["E", "code"], ["e"], axis=0),
             helper.make_node("Cast", ["flag"], ["fl"], to=_ELEM[dtype]),
             helper.make_node("Mul", ["fl", "F"], ["ff"]),
             helper.make_node("Add", ["xw", "e"], ["s"]), helper.make_node("Add", ["s", "ff"], ["Y"])]
    inputs = [helper.make_tensor_value_info("x", _ELEM[dtype], ["N", n_features]),
              helper.make_tensor_value_info("code", TensorProto.INT32, ["N"]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, ["N", 1])]
    return _finish(nodes, inits, inputs, 1, dtype)
