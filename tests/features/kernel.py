"""onnxruntime's ``com.microsoft.MurmurHash3`` kernel as a reference for the numpy hash (tests and benches
only: the Python binding keeps a reference to every string fed to it, so training never runs it)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from streamfit.features._murmur import MURMUR_DOMAIN, murmur_node


@lru_cache(maxsize=64)
def _session(kind: str, seed: int) -> Any:
    import onnxruntime as ort

    elem = TensorProto.STRING if kind == "string" else TensorProto.INT64
    graph = helper.make_graph([murmur_node("x", "y", seed)], "murmur3",
                              [helper.make_tensor_value_info("x", elem, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT32, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MURMUR_DOMAIN, 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def kernel_murmur3(values: Any, seed: int = 0) -> np.ndarray:
    """uint32 hashes of a 1-D array of str or integers, computed by a session running the kernel."""
    values = np.asarray(values)
    if values.dtype.kind in "OUS":
        kind, x = "string", values.astype(object).reshape(-1)
    else:
        kind, x = "int64", np.ascontiguousarray(values.reshape(-1), dtype=np.int64)
    if x.size == 0:
        return np.zeros(0, dtype=np.uint32)
    return _session(kind, int(seed)).run(None, {"x": x})[0]
