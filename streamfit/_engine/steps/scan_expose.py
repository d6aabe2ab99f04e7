"""A Scan body with no intermediate tensors: every value it makes written to a scan output of its own.

onnxruntime runs each iteration of a ``Scan`` as a small graph run.  Its loop state and scan outputs go to
buffers the Scan allocated once (two for the state, in turn; slices of each output), but the body's
intermediate values are allocated per iteration, and the first one costs most: a body of 3 nodes with one
intermediate took 1.0 us an iteration, with that value made a scan output 0.7 us (onnxruntime 1.19, AMD EPYC).
The saving comes only once no intermediate is left, while each added output costs a copy of its value per
iteration: so a body is exposed whole, and only when every value is known and small (the lean bodies of one
row per step, where the Scan's per-iteration cost is most of the chunk's).
"""

from __future__ import annotations

import onnx
from onnx import ModelProto

__all__ = ["expose_body_values", "MAX_ELEMENTS", "MAX_VALUES"]

#: the largest intermediate (elements) worth a per-iteration copy
MAX_ELEMENTS = 64
#: the most intermediates a body may have to be exposed
MAX_VALUES = 32
_PREFIX = "sfc_v_"


def expose_body_values(model: ModelProto, max_elements: int = MAX_ELEMENTS, max_values: int = MAX_VALUES
                       ) -> tuple[ModelProto, int]:
    """``model`` with each top-level Scan's body intermediates added to its scan outputs (unused outside), when all
    of them have an inferred type and at most ``max_elements`` elements (and there are at most ``max_values``);
    and how many values were exposed (0: ``model`` unchanged).  The values computed are the same."""
    inferred = onnx.shape_inference.infer_shapes(model)
    out = ModelProto()
    out.CopyFrom(model)
    exposed = 0
    for node, seen in zip(out.graph.node, inferred.graph.node):
        if node.op_type != "Scan":
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        known = {v.name: v for v in next(a.g for a in seen.attribute if a.name == "body").value_info}
        outputs = {o.name for o in body.output}
        values = [v for n in body.node for v in n.output if v and v not in outputs]
        if not values or len(values) > max_values:
            continue
        if not all(_small(known.get(v), max_elements) for v in values):
            continue
        body.output.extend(known[v] for v in values)  # typed and shaped as inferred
        node.output.extend(f"{_PREFIX}{exposed + i}" for i in range(len(values)))
        exposed += len(values)
    return (out, exposed) if exposed else (model, 0)


def _small(vi: onnx.ValueInfoProto | None, max_elements: int) -> bool:
    """Whether a value is a tensor of a known type and of at most ``max_elements`` elements."""
    if vi is None or not vi.type.HasField("tensor_type"):
        return False
    t = vi.type.tensor_type
    if not t.elem_type or not t.HasField("shape"):
        return False
    size = 1
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return False
        size *= d.dim_value
    return size <= max_elements
