"""MurmurHash3 (x86, 32-bit) computed by onnxruntime's ``com.microsoft.MurmurHash3`` kernel.

Training hashes with the very kernel the exported model runs, so a serving process gets the training-time
ids by construction.  Strings hash their UTF-8 bytes, integers their 8 little-endian bytes (every integer
type is widened to int64 first, bool to 0/1), with ``positive=1`` (unsigned 32-bit output).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from onnx import TensorProto, helper

__all__ = ["murmur3", "MURMUR_DOMAIN", "murmur_node", "murmur3_int"]

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


# -- the same hash without a session run: for tiny batches (one row of 20 columns would pay 20 runs) --------
_C1, _C2, _M32 = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
_U = np.uint32


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U(r)) | (x >> _U(32 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U(16))
    h = h * _U(0x85EBCA6B)
    h = h ^ (h >> _U(13))
    h = h * _U(0xC2B2AE35)
    return h ^ (h >> _U(16))


def murmur3_int64(values: np.ndarray, seeds: "np.ndarray | int") -> np.ndarray:
    """MurmurHash3 x86 32-bit of the 8 little-endian bytes of each int64 in numpy, element-wise with
    ``seeds`` broadcast against ``values`` (one seed per column of a ``(rows, columns)`` block): bit-identical
    to :func:`murmur3` (tested), without a session run.

    >>> murmur3_int64(np.array([0, 7]), 0).tolist() == murmur3(np.array([0, 7])).tolist()
    True
    """
    v = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    h = np.asarray(seeds, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore"):
        for block in ((v & np.uint64(_M32)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)):
            k = _rotl(block * _U(_C1), 15) * _U(_C2)
            h = _rotl(h ^ k, 13) * _U(5) + _U(0xE6546B64)
        return _fmix(h ^ _U(8))


def murmur3_bytes(data: bytes, seed: int) -> int:
    """MurmurHash3 x86 32-bit of ``data`` in plain Python (a string's UTF-8 bytes), as :func:`murmur3`.

    >>> murmur3_bytes("hello".encode(), 0) == int(murmur3(np.array(["hello"], dtype=object))[0])
    True
    """
    h = seed & _M32
    n = len(data)
    body = n - n % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i:i + 4], "little") * _C1 & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= k * _C2 & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    if n % 4:
        k = int.from_bytes(data[body:], "little") * _C1 & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= k * _C2 & _M32
    h ^= n
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    return h ^ (h >> 16)


def murmur3_int(value: int, seed: int) -> int:
    """MurmurHash3 x86 32-bit of one integer's 8 little-endian int64 bytes (a uint64 above 2**63 wraps, as
    the kernel's int64 does) in plain Python: :func:`murmur3_int64` of one value, for a row of one event
    (a numpy call per step of the hash costs more than the whole hash of a few values in Python).

    >>> [murmur3_int(v, 7) for v in (0, -1, 2**63)] == murmur3(np.array([0, -1, -2**63]), 7).tolist()
    True
    """
    u = value & 0xFFFFFFFFFFFFFFFF
    h = seed & _M32
    for k in (u & _M32, u >> 32):  # the two 4-byte blocks, low half first (little-endian)
        k = k * _C1 & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= k * _C2 & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    h ^= 8
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    return h ^ (h >> 16)
