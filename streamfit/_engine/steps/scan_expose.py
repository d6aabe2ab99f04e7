"""A Scan body with no intermediate tensors: every value it makes carried as a loop state of its own.

onnxruntime runs each iteration of a ``Scan`` as a small graph run.  Its loop state goes to two buffers the
Scan allocated once (used in turn) and its scan outputs to slices of theirs, but the body's intermediate values
are allocated per iteration.  A value made a loop state (zeros at first, never read) is written straight into a
buffer of the Scan's, with neither an allocation nor a copy per iteration: the leanest Adam bodies of a linear
model ran 5-12 % faster so than with the values as scan outputs (which make a slice per iteration), and a
synthetic body of 12 small nodes 2.12 us an iteration against 2.6 as scan outputs and 2.8 allocated
(onnxruntime 1.19, AMD EPYC).  The saving comes once no intermediate is left, so a body is exposed whole, and only
when every value's type and shape are known (a loop state's shape is fixed) and not large (the bodies of one row
per step, where the Scan's per-iteration cost is most of the chunk's).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

__all__ = ["expose_body_values", "MAX_ELEMENTS", "MAX_VALUES"]

#: the largest intermediate (elements) carried as a loop state: two buffers each, no copy per iteration (a
#: reshaped or squeezed view becomes one); the MLPClassifier() body's 22 values (up to 1101 elements) ran 10 %
#: faster carried than allocated
MAX_ELEMENTS = 4096
#: the most intermediates a body may have to be exposed
MAX_VALUES = 32
_PREFIX = "sfc_v_"


def expose_body_values(model: ModelProto, max_elements: int = MAX_ELEMENTS, max_values: int = MAX_VALUES
                       ) -> tuple[ModelProto, int]:
    """``model`` with each top-level Scan's body intermediates carried as loop states (their final values unused
    outside), when all of them have an inferred type and at most ``max_elements`` elements (and there are at most
    ``max_values``); and how many values were exposed (0: ``model`` unchanged).  The values computed are the same."""
    inferred = onnx.shape_inference.infer_shapes(model)
    out = ModelProto()
    out.CopyFrom(model)
    exposed = 0
    for node, seen in zip(out.graph.node, inferred.graph.node):
        if node.op_type != "Scan":
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        inferred_body = next(a.g for a in seen.attribute if a.name == "body")
        known = {v.name: v for v in list(inferred_body.value_info) + list(inferred_body.input)}
        _type_contrib_outputs(body, known)
        outputs = {o.name for o in body.output}
        values = [v for n in body.node for v in n.output if v and v not in outputs]
        if not values or len(values) > max_values:
            continue
        if not all(_small(known.get(v), max_elements) for v in values):
            continue
        _carry(out.graph, node, body, [known[v] for v in values], exposed)
        exposed += len(values)
    return (out, exposed) if exposed else (model, 0)


def _type_contrib_outputs(body: onnx.GraphProto, known: dict[str, onnx.ValueInfoProto]) -> None:
    """Add to ``known`` the types of the outputs of the contrib ops ONNX's inference does not know and a lean step
    uses: ``com.microsoft.AdamOptimizer`` (steps/fused_adam.py) writes the step count (int64, 0-d) and values of
    its moments' and weight's types."""
    for n in body.node:
        if n.domain != "com.microsoft" or n.op_type != "AdamOptimizer":
            continue
        sources = {1: n.input[4], 2: n.input[5], 3: n.input[2]}
        for k, out in enumerate(n.output):
            if not out or out in known:
                continue
            if k == 0:
                known[out] = helper.make_tensor_value_info(out, onnx.TensorProto.INT64, [])
            elif k in sources and sources[k] in known:
                vi = onnx.ValueInfoProto()
                vi.CopyFrom(known[sources[k]])
                vi.name = out
                known[out] = vi


def _carry(graph: onnx.GraphProto, node: onnx.NodeProto, body: onnx.GraphProto, values: list[onnx.ValueInfoProto],
           first: int) -> None:
    """Make ``values`` (typed and shaped as inferred) loop states of the Scan ``node`` after its own: each starts
    from a zero initializer of ``graph``, is a body input nothing reads, a body output, and a final value."""
    scanned = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    n_state = len(node.input) - scanned
    inputs, starts, finals = [], [], []
    for i, vi in enumerate(values, start=first):
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        inputs.append(helper.make_tensor_value_info(f"{_PREFIX}in_{i}", t.elem_type, shape))
        zero = numpy_helper.from_array(np.zeros(shape, helper.tensor_dtype_to_np_dtype(t.elem_type)), f"{_PREFIX}zero_{i}")
        graph.initializer.append(zero)
        starts.append(zero.name)
        finals.append(f"{_PREFIX}{i}")
    for seq, items in ((body.input, inputs), (body.output, values), (node.input, starts), (node.output, finals)):
        kept = list(seq)
        del seq[:]
        seq.extend(kept[:n_state] + list(items) + kept[n_state:])


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
