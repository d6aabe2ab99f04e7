"""MurmurHash3 (x86, 32-bit) computed by onnxruntime's ``com.microsoft.MurmurHash3`` kernel.

Training hashes with the very kernel the exported model runs, so a serving process gets the training-time
ids by construction.  Strings hash their UTF-8 bytes, integers their 8 little-endian bytes (every integer
type is widened to int64 first, bool to 0/1), with ``positive=1`` (unsigned 32-bit output).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from onnx import TensorProto, helper

__all__ = ["murmur3", "MURMUR_DOMAIN", "murmur_node"]

MURMUR_DOMAIN = "com.microsoft"


def murmur_node(x: str, y: str, seed: int, name: str = "") -> "helper.NodeProto":
    """The ONNX node hashing ``x`` (string or int64 tensor) into uint32 ``y``."""
    return helper.make_node("MurmurHash3", [x], [y], domain=MURMUR_DOMAIN, seed=int(seed), positive=1,
                            name=name or f"murmur_{y}")


@lru_cache(maxsize=64)
def _session(kind: str, seed: int):  # type: ignore[no-untyped-def]
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


def murmur3(values: np.ndarray, seed: int = 0) -> np.ndarray:
    """uint32 hashes of a 1-D array of str (object/unicode) or integers.

    >>> murmur3(np.array(["hello"], dtype=object)).tolist(), murmur3(np.array([0])).tolist()
    ([613153351], [1669671676])
    """
    values = np.asarray(values)
    if values.dtype.kind in "OUS":
        kind, x = "string", values.astype(object).reshape(-1)
    elif values.dtype.kind in "iub":
        kind, x = "int64", np.ascontiguousarray(values.reshape(-1), dtype=np.int64)
    else:
        raise TypeError(f"murmur3 hashes strings and integers, got {values.dtype}")
    if x.size == 0:
        return np.zeros(0, dtype=np.uint32)
    return _session(kind, int(seed)).run(None, {"x": x})[0]  # sessions are safe to share between threads
