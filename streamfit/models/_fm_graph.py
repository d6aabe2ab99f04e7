"""The ONNX graph of an order-2 factorization machine (Rendle 2010) over hashed ids and dense values.

Inputs ``ids`` ``[N, F]`` (int64, one hashed id per categorical field, all fields in one table of
``buckets`` rows) and ``x`` ``[N, D]`` (dense values).  With ``e_f = V[ids_f]`` (the factor rows) and the
dense fields' factors ``U`` (``[D, k]``)::

    s = sum_f e_f + x @ U;   q = sum_f e_f**2 + x**2 @ U**2
    Y = b + sum_f L[ids_f] + x @ w + 0.5 * sum_k (s**2 - q)

``L`` and ``V`` are read only by ``Gather``: the engine trains them row-sparsely.  ``n_factors=0`` leaves
the linear part: a hashed linear (VW-style one-hot of hashed values) model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

__all__ = ["fm_model", "IDS", "DENSE", "OUTPUT"]

IDS, DENSE, OUTPUT = "ids", "x", "Y"
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def fm_model(n_fields: int, n_dense: int, buckets: int, n_factors: int, rng: Any, init_scale: float = 0.01,
             dtype: Any = np.float32, n_outputs: int = 1) -> ModelProto:
    """The graph described in the module docstring (factors drawn from ``N(0, init_scale)``).

    >>> import numpy as np, onnxruntime as ort
    >>> m = fm_model(2, 1, buckets=10, n_factors=3, rng=np.random.default_rng(0))
    >>> ort.InferenceSession(m.SerializeToString()).run(None, {"ids": np.array([[1, 2]]),
    ...                                                        "x": np.ones((1, 1), np.float32)})[0].shape
    (1, 1)
    """
    if n_fields < 1 and n_dense < 1:
        raise ValueError("a factorization machine needs at least one categorical or dense field")
    dtype = np.dtype(dtype)
    elem = _ELEM[dtype]
    inits = [numpy_helper.from_array(np.zeros((1, n_outputs), dtype), "bias"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = []
    terms = ["bias"]
    inputs = []
    if n_fields:
        inputs.append(helper.make_tensor_value_info(IDS, TensorProto.INT64, ["N", n_fields]))
        inits.append(numpy_helper.from_array(np.zeros((buckets, n_outputs), dtype), "linear"))
        nodes.append(helper.make_node("Gather", ["linear", IDS], ["lin_rows"]))  # [N, F, O]
        if n_outputs == 1:  # [N, F] summed, keeping the axis: onnxruntime reduces [N, F, 1] over F 10x slower
            inits.append(numpy_helper.from_array(np.array([0, -1], np.int64), "rows_2d"))
            nodes += [helper.make_node("Reshape", ["lin_rows", "rows_2d"], ["lin_2d"]),
                      helper.make_node("ReduceSum", ["lin_2d", "axis1"], ["lin"], keepdims=1)]  # [N, 1]
        else:
            nodes.append(helper.make_node("ReduceSum", ["lin_rows", "axis1"], ["lin"], keepdims=0))  # [N, O]
        terms.append("lin")
    if n_dense:
        inputs.append(helper.make_tensor_value_info(DENSE, elem, ["N", n_dense]))
        inits.append(numpy_helper.from_array(np.zeros((n_dense, n_outputs), dtype), "dense_linear"))
        nodes.append(helper.make_node("MatMul", [DENSE, "dense_linear"], ["dense_lin"]))
        terms.append("dense_lin")
    if n_factors:
        pair_inits, pair_nodes = _pairwise(n_fields, n_dense, buckets, n_factors, rng, init_scale, dtype)
        inits += pair_inits
        nodes += pair_nodes
        terms.append("pair")
    nodes += _sum_of(terms)
    graph = helper.make_graph(nodes, "streamfit_fm", inputs, [helper.make_tensor_value_info(OUTPUT, elem, ["N", n_outputs])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _pairwise(n_fields: int, n_dense: int, buckets: int, n_factors: int, rng: Any, init_scale: float,
              dtype: np.dtype) -> tuple[list[Any], list[Any]]:
    """The initializers and nodes of the pairwise term ``pair = 0.5 * sum_k (s**2 - q)`` ([N, 1]): the
    categorical fields' factors (drawn first) and the dense fields' ``U``."""
    inits, nodes, s_parts, q_parts = [], [], [], []
    if n_fields:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((buckets, n_factors)) * init_scale).astype(dtype), "factors"))
        nodes += [helper.make_node("Gather", ["factors", IDS], ["e"]),  # [N, F, k]
                  helper.make_node("ReduceSum", ["e", "axis1"], ["s_cat"], keepdims=0),
                  helper.make_node("Mul", ["e", "e"], ["e2"]),
                  helper.make_node("ReduceSum", ["e2", "axis1"], ["q_cat"], keepdims=0)]
        s_parts.append("s_cat")
        q_parts.append("q_cat")
    if n_dense:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((n_dense, n_factors)) * init_scale).astype(dtype), "dense_factors"))
        nodes += [helper.make_node("MatMul", [DENSE, "dense_factors"], ["s_dense"]),
                  helper.make_node("Mul", [DENSE, DENSE], ["x2"]),
                  helper.make_node("Mul", ["dense_factors", "dense_factors"], ["u2"]),
                  helper.make_node("MatMul", ["x2", "u2"], ["q_dense"])]
        s_parts.append("s_dense")
        q_parts.append("q_dense")
    s, q = s_parts[0], q_parts[0]
    if len(s_parts) == 2:
        nodes += [helper.make_node("Add", s_parts, ["s"]), helper.make_node("Add", q_parts, ["q"])]
        s, q = "s", "q"
    # a Constant node, not an initializer: float initializers are trained weights
    nodes += [helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.full((1,), 0.5, dtype))),
              helper.make_node("Mul", [s, s], ["s2"]), helper.make_node("Sub", ["s2", q], ["d"]),
              helper.make_node("ReduceSum", ["d", "axis1"], ["pair_sum"], keepdims=1),  # [N, 1]
              helper.make_node("Mul", ["pair_sum", "half"], ["pair"])]
    return inits, nodes


def _sum_of(terms: list[str]) -> list[Any]:
    """Nodes adding the terms left to right into ``Y`` (an Identity when there is one term)."""
    nodes = []
    out = terms[0]
    for k, term in enumerate(terms[1:]):
        name = OUTPUT if k == len(terms) - 2 else f"sum_{k}"
        nodes.append(helper.make_node("Add", [out, term], [name]))
        out = name
    if out != OUTPUT:
        nodes.append(helper.make_node("Identity", [out], [OUTPUT]))
    return nodes
