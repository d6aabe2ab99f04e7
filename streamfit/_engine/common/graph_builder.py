"""A tiny ONNX node builder: unique names under a prefix and typed constants.

Losses, penalties and optimizers emit their small graphs through it, so one piece of code serves the
separate loss/update sessions (forward/backward strategy) and the single fused graph alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

__all__ = ["GraphBuilder", "onnx_dtype", "ranked_scalars"]

_ONNX_DTYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def onnx_dtype(dtype: Any) -> int:
    """ONNX element type of a float numpy dtype.

    Parameters
    ----------
    dtype
        A numpy float dtype (float16, float32, float64).
    """
    try:
        return _ONNX_DTYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"only float32 and float64 are trained, got {np.dtype(dtype)}") from None


class GraphBuilder:
    """Collects nodes and initializers; every name it makes starts with ``prefix``.

    Parameters
    ----------
    dtype
        The float type of the constants it makes (:meth:`const` of floats), the graph's.
    prefix
        The start of every name it makes (keeps them apart from the model's own names).
    """

    def __init__(self, dtype: Any, prefix: str = "sf_") -> None:
        self.dtype = np.dtype(dtype)
        self.elem = onnx_dtype(dtype)
        self.prefix = prefix
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0
        self._consts: dict[tuple[Any, ...], str] = {}

    def name(self, hint: str) -> str:
        """A new name, ``prefix + hint + _<count>``, unique within this builder.

        Parameters
        ----------
        hint
            A readable part of the name (``"w_new"``, ``"grad"``...).
        """
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def op(self, op_type: str, *inputs: str, out: str | None = None, domain: str = "", **attrs: Any) -> str:
        """Add one single-output node and return its output name.

        Parameters
        ----------
        op_type
            The ONNX op (``"MatMul"``, ``"Add"``, ...).
        *inputs
            Names of its inputs, in order.
        out
            The output's name; None: a new name.
        domain
            The op's domain (``""``: standard ONNX; ``"com.microsoft"``: onnxruntime's contrib ops).
        **attrs
            The node's attributes (``transB=1``, ``axis=0``...).
        """
        output = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=self.name(op_type),
                                           domain=domain, **attrs))
        return output

    def const(self, value: Any, dtype: Any = None) -> str:
        """A constant initializer (float constants take the builder's dtype); equal constants are shared.

        Parameters
        ----------
        value
            A number or an array.
        dtype
            Its element type; None: the builder's (float constants) or numpy's guess.
        """
        arr = np.asarray(value, dtype=self.dtype if dtype is None else dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.name("c")
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]


#: elementwise ops whose scalar operands onnxruntime 1.19 broadcasts one element at a time against an [N, 1]
#: tensor (159 us for N = 16384, 8 us with the scalar shaped [1, 1]: measured here)
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater"}


def ranked_scalars(b: GraphBuilder, first: int, rank: int) -> None:
    """Give the 0-d float constants read by the elementwise nodes ``b.nodes[first:]`` the shape ``[1] * rank``
    (the rank of the rows they broadcast against): the same values, without onnxruntime's slow broadcast of a
    0-d operand against a tensor whose last dimension is 1."""
    if rank < 2:
        return
    zero_d = {i.name: i for i in b.initializers if not i.dims and i.data_type == b.elem}
    ranked: dict[str, str] = {}
    for node in b.nodes[first:]:
        if node.op_type not in _BROADCASTING:
            continue
        for k, name in enumerate(node.input):
            if name in zero_d:
                if name not in ranked:
                    value = numpy_helper.to_array(zero_d[name]).reshape((1,) * rank)
                    ranked[name] = b.const(value)
                node.input[k] = ranked[name]
