"""Every weight's gradient reduced to the weight's shape.

onnxruntime-training 1.19.2's builder leaves the gradient of a broadcast operand unreduced for some ops:
the scalar fill value of a ``Where`` (a mask's 0 or -3.4e38, trained when a user asks for it with
``weights=``) gets a gradient of the mask's shape, [N, 1, L, L], and the fused step then fails with a raw
"Invalid rank for output".  Here a gradient whose declared shape is not its weight's is summed over the
broadcast axes (all axes for a one-element weight) and reshaped to the weight's shape; one that cannot be a
broadcast of it is a :class:`~streamfit.exceptions.ModelError` naming the weight.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import rename_tensor
from streamfit.exceptions import ModelError

__all__ = ["reduce_to_weight_shapes"]


def _declared(vi: object) -> list[int | None] | None:
    t = vi.type.tensor_type  # type: ignore[attr-defined]
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def _broadcast_axes(dims: Sequence[int | None], target: Sequence[int], weight: str) -> list[int] | None:
    """The axes to sum so a gradient of ``dims`` becomes one of ``target`` (None: not statically known)."""
    lead = len(dims) - len(target)
    if lead < 0:
        raise ModelError(f"the gradient of weight {weight!r} has rank {len(dims)}, below the weight's {len(target)}")
    axes = list(range(lead))
    for k, t in enumerate(target):
        d = dims[lead + k]
        if d == t:
            continue
        if t != 1:
            if d is None:
                return None
            raise ModelError(f"the gradient of weight {weight!r} has shape {list(dims)}, which is no broadcast of "
                             f"the weight's {list(target)}")
        axes.append(lead + k)
    return axes


def reduce_to_weight_shapes(gradient: ModelProto, grads: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]
                            ) -> list[str]:
    """Sum each gradient output ``grads[w]`` of ``gradient`` (in place) down to ``shapes[w]`` where its declared
    shape differs (module doc); return the weights whose gradient was reduced."""
    graph = gradient.graph
    outputs = {o.name: o for o in graph.output}
    reduced = []
    for weight, g in grads.items():
        target = [int(d) for d in shapes[weight]]
        vo = outputs.get(g)
        dims = _declared(vo) if vo is not None else None
        if dims is None or dims == target:
            continue
        size = int(np.prod(target)) if target else 1
        axes = None if size == 1 else _broadcast_axes(dims, target, weight)
        if size != 1 and axes is None:
            continue  # dynamic dims where the weight has them: left to the builder
        raw = f"{g}__sf_unreduced"
        rename_tensor(graph.node, g, raw)
        summed, shape = f"{g}__sf_sum", f"{g}__sf_shape"
        graph.initializer.append(numpy_helper.from_array(np.array(target, np.int64), shape))
        if axes is None:  # every axis
            graph.node.append(helper.make_node("ReduceSum", [raw], [summed], keepdims=0, name=f"{g}__sf_reduce"))
        else:
            ax = f"{g}__sf_axes"
            graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), ax))
            graph.node.append(helper.make_node("ReduceSum", [raw, ax], [summed], keepdims=1, name=f"{g}__sf_reduce"))
        graph.node.append(helper.make_node("Reshape", [summed, shape], [g], name=f"{g}__sf_reshape"))
        stale = [vi for vi in graph.value_info if vi.name == g]
        for vi in stale:
            graph.value_info.remove(vi)
        tt = vo.type.tensor_type  # type: ignore[union-attr]
        del tt.shape.dim[:]
        for d in target:
            tt.shape.dim.add().dim_value = d
        reduced.append(weight)
    return reduced
