"""Bidirectional LSTM and GRU as two forward nodes, for the training copy of a model.

onnxruntime-training 1.19.2's LSTM/GRU training kernels support the forward direction only ("LSTM and
LSTMGrad kernel only supports the forward direction for now. Provided direction: 2"), so a bidirectional
node (PyTorch's ``bidirectional=True``, one node per layer) becomes: the forward half of its weights over the
sequence, the reverse half over the sequence reversed in time (a ``Gather`` with indices T-1..0, whose
gradient is sound), the reverse half's outputs reversed back, both concatenated on the direction axis as the
original node lays them out.  The weights stay the author's tensors (each direction's half is a ``Split`` of
them), so what trains is what ``predict`` and ``to_onnx()`` read.  ``direction="reverse"`` nodes become one
forward node over the reversed sequence the same way.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import ShapedRewriter, attrs
from streamfit.exceptions import ModelError

__all__ = ["bidirectional_rnn"]

# inputs that hold one slice per direction on axis 0 (by op): W, R, B, initial_h, initial_c, P
_PER_DIRECTION = {"LSTM": (1, 2, 3, 5, 6, 7), "GRU": (1, 2, 3, 5)}
_ACTIVATIONS = {"LSTM": 3, "GRU": 2}  # activations per direction


def _int64(rw: ShapedRewriter, values: list[int]) -> str:
    name = rw.name("i")
    rw.consts.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _reversed(rw: ShapedRewriter, x: str, axis: int, nodes: list[NodeProto]) -> str:
    """``x`` reversed along ``axis`` (its length read at run time)."""
    n = rw.name
    shape, length, last, up, idx, out = n("rv_shape"), n("rv_len"), n("rv_last"), n("rv_up"), n("rv_idx"), n("rv")
    nodes += [helper.make_node("Shape", [x], [shape], name=n("shape")),
              helper.make_node("Gather", [shape, _scalar(rw, axis)], [length], axis=0, name=n("gather")),
              helper.make_node("Sub", [length, _scalar(rw, 1)], [last], name=n("sub")),
              # T-1 - [0..T-1], not Range(T-1, -1, -1): onnxruntime's Gather-to-Slice fusion turns a Gather of a
              # descending Range into an empty Slice
              helper.make_node("Range", [_scalar(rw, 0), length, _scalar(rw, 1)], [up], name=n("range")),
              helper.make_node("Sub", [last, up], [idx], name=n("sub")),
              helper.make_node("Gather", [x, idx], [out], axis=axis, name=n("reverse"))]
    return out


def _scalar(rw: ShapedRewriter, value: int) -> str:
    name = rw.name("s")
    rw.consts.append(numpy_helper.from_array(np.array(value, np.int64), name))
    return name


def _halves(rw: ShapedRewriter, tensor: str, axis: int, nodes: list[NodeProto]) -> tuple[str, str]:
    """Each direction's half (on the direction ``axis``, kept as a size-1 axis) of a per-direction input: one
    ``Split`` (two ``Slice`` s of one tensor are fused into a Split by onnxruntime's optimizer, which then
    failed here)."""
    if not tensor:
        return "", ""
    fwd, rev = rw.name("dir0"), rw.name("dir1")
    nodes.append(helper.make_node("Split", [tensor, _int64(rw, [1, 1])], [fwd, rev], axis=axis,
                                  name=rw.name("split")))
    return fwd, rev


def bidirectional_rnn(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    """The rewrite of one LSTM/GRU node (None: not one, or already forward)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _PER_DIRECTION:
        return None
    a = attrs(node, decode=True)
    direction = a.get("direction", "forward")
    if direction == "forward":
        return None
    where = f"{node.op_type} node {node.name or node.output[0]!r} (direction={direction})"
    inputs = list(node.input) + [""] * (8 - len(node.input))
    if len(node.input) > 4 and node.input[4]:
        raise ModelError(f"{where}: onnxruntime-training 1.19.2 trains forward {node.op_type}s only, and streamfit's "
                         "rewrite into forward nodes over a reversed sequence cannot honour sequence_lens (each row "
                         "reversed within its own length); export without packed sequences")
    layout = int(a.get("layout", 0))
    time_axis = 1 if layout else 0
    dir_axis_y, dir_axis_h = (2, 1) if layout else (1, 0)
    dirs = [0, 1] if direction == "bidirectional" else [0]
    reverse = [False, True] if direction == "bidirectional" else [True]
    per_dir = _ACTIVATIONS[node.op_type]
    outputs = list(node.output) + [""] * (3 - len(node.output))
    nodes: list[NodeProto] = []
    reversed_x = None
    parts: list[list[str]] = []
    # W, R, B, P: [directions, ...]; initial_h, initial_c: [directions, N, H], or [N, directions, H] in layout 1
    halves = {i: _halves(rw, inputs[i], dir_axis_h if i in (5, 6) else 0, nodes)
              for i in _PER_DIRECTION[node.op_type]} if len(dirs) > 1 else {}
    for d, rev in zip(dirs, reverse):
        node_inputs = list(inputs)
        for i, pair in halves.items():
            node_inputs[i] = pair[d]
        if rev:
            if reversed_x is None:
                reversed_x = _reversed(rw, inputs[0], time_axis, nodes)
            node_inputs[0] = reversed_x
        while node_inputs and not node_inputs[-1]:
            node_inputs.pop()
        kept = {k: v for k, v in a.items() if k not in ("direction", "activations", "activation_alpha",
                                                        "activation_beta")}
        for key in ("activations", "activation_alpha", "activation_beta"):
            if key in a:
                values = list(a[key])
                kept[key] = values[d * per_dir:(d + 1) * per_dir] if len(values) == per_dir * len(dirs) else values
        outs = [rw.name(f"{node.op_type.lower()}{d}_{k}") if o else "" for k, o in enumerate(outputs)]
        while outs and not outs[-1]:
            outs.pop()
        nodes.append(helper.make_node(node.op_type, node_inputs, outs, name=f"{node.name or node.output[0]}_dir{d}",
                                      direction="forward", **kept))
        if rev and outs and outs[0]:
            outs[0] = _reversed(rw, outs[0], time_axis, nodes)
        parts.append(outs)
    for k, out in enumerate(outputs):
        if not out:
            continue
        pieces = [p[k] for p in parts]
        nodes.append(helper.make_node("Concat", pieces, [out], axis=dir_axis_y if k == 0 else dir_axis_h,
                                      name=rw.name("concat"))
                     if len(pieces) > 1 else helper.make_node("Identity", pieces, [out], name=rw.name("id")))
    return nodes
