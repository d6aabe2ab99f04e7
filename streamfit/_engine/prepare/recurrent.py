"""LSTM and GRU variants onnxruntime cannot run or train, as nodes it can.

**Batch-first layout** (``layout=1``: X [N, T, I]): onnxruntime's CPU kernels run ``layout=0`` only ("Batchwise
recurrent operations (layout == 1) are not supported"), in inference as in training.  :func:`rnn_layouts`
rewrites such a node, in the model as loaded (so what is predicted and exported runs too), into the same node
in layout 0 between ``Transpose`` s of its inputs (X, initial_h/c) and outputs (Y, Y_h, Y_c).

**Bidirectional and reverse** (for the training copy): onnxruntime-training 1.19.2's LSTM/GRU training kernels
support the forward direction only ("LSTM and LSTMGrad kernel only supports the forward direction for now.
Provided direction: 2"), so a bidirectional node (PyTorch's ``bidirectional=True``, one node per layer)
becomes: the forward half of its weights over the sequence, the reverse half over the sequence reversed in time
(a ``Gather`` with indices T-1..0, whose gradient is sound), the reverse half's outputs reversed back, both
concatenated on the direction axis as the original node lays them out.  The weights stay the author's tensors
(each direction's half is a ``Split`` of them), so what trains is what ``predict`` and ``to_onnx()`` read.
``direction="reverse"`` nodes become one forward node over the reversed sequence the same way.

**Packed sequences** (``sequence_lens``, for the training copy): the training kernels refuse it ("Sequence
lengths input tensor ... is not supported for LSTMTraining and LSTMGrad").  A forward recurrence is causal: its
outputs before a row's length do not depend on the padding after it.  So each direction runs over the whole
padded sequence without ``sequence_lens`` (the reverse one over each row reversed within its own length: a
``GatherElements`` with indices len-1-t for t < len, t after), Y is masked to zero from each row's length on
(and reversed back within the length), and Y_h is Y at each row's last valid step.  The cell state Y_c of an
LSTM is not in Y: a node whose Y_c is read is refused, naming it.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import ShapedRewriter, attrs
from streamfit.exceptions import ModelError

__all__ = ["bidirectional_rnn", "batch_first_rnn", "rnn_layouts"]

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


#: inputs a training LSTM/GRU node is given at least (through initial_c / initial_h, "" where absent):
#: onnxruntime-training's LSTMGrad/GRUGrad builder reads the forward node's inputs by position, and a node with
#: fewer ("X, W, R, B": no initial state) had its outputs read as sequence_lens ("Type 'tensor(float)' of input
#: parameter (Y) of operator (LSTMGrad) ... is invalid")
_MIN_INPUTS = {"LSTM": 7, "GRU": 6}


def _trimmed(inputs: list[str], op: str) -> list[str]:
    """``inputs`` without trailing absent ones, but at least :data:`_MIN_INPUTS` long."""
    out = list(inputs)
    while len(out) > _MIN_INPUTS[op] and not out[-1]:
        out.pop()
    return out + [""] * (_MIN_INPUTS[op] - len(out))


def _padded(node: NodeProto) -> list[NodeProto] | None:
    """A forward node with its inputs padded to :data:`_MIN_INPUTS` (None: it has them)."""
    if len(node.input) >= _MIN_INPUTS[node.op_type]:
        return None
    out = NodeProto()
    out.CopyFrom(node)
    out.input.extend([""] * (_MIN_INPUTS[node.op_type] - len(node.input)))
    return [out]


def bidirectional_rnn(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    """The rewrite of one LSTM/GRU node for training (None: not one, or a forward one with its inputs): the
    reverse direction and sequence_lens as forward nodes, inputs padded (see the module docstring)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _PER_DIRECTION:
        return None
    a = attrs(node, decode=True)
    direction = a.get("direction", "forward")
    inputs = list(node.input) + [""] * (8 - len(node.input))
    lens, inputs[4] = inputs[4], ""  # the nodes made run without sequence_lens (masked below)
    if direction == "forward" and not lens:
        return _padded(node)
    where = f"{node.op_type} node {node.name or node.output[0]!r} (direction={direction})"
    layout = int(a.get("layout", 0))
    if lens and (layout or _read(rw, node.output[2] if len(node.output) > 2 else "")):
        why = ("in layout 1" if layout else "with its cell state Y_c read (a masked run's Y does not hold it)")
        raise ModelError(f"{where}: onnxruntime-training 1.19.2 cannot train sequence_lens, and streamfit's rewrite "
                         f"(a masked run over the padded sequence) cannot honour it {why}; export without packed "
                         "sequences")
    time_axis = 1 if layout else 0
    dir_axis_y, dir_axis_h = (2, 1) if layout else (1, 0)
    dirs = [0, 1] if direction == "bidirectional" else [0]
    reverse = {"bidirectional": [False, True], "reverse": [True]}.get(direction, [False])
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
                reversed_x = (_within(rw, inputs[0], lens, nodes) if lens else
                              _reversed(rw, inputs[0], time_axis, nodes))
            node_inputs[0] = reversed_x
        node_inputs = _trimmed(node_inputs, node.op_type)
        kept = _direction_attrs(a, d, _ACTIVATIONS[node.op_type], len(dirs))
        # with sequence_lens every output is made (the training kernel's gradient wants them), Y always
        outs = [rw.name(f"{node.op_type.lower()}{d}_{k}") if o or lens else ""
                for k, o in enumerate(outputs[:2] if node.op_type == "GRU" else outputs)]
        while outs and not outs[-1]:
            outs.pop()
        nodes.append(helper.make_node(node.op_type, node_inputs, outs, name=f"{node.name or node.output[0]}_dir{d}",
                                      direction="forward", **kept))
        if lens:
            outs = _packed_outputs(rw, outs, inputs[0], lens, rev, len(outputs) > 1 and bool(outputs[1]), nodes)
        elif rev and outs and outs[0]:
            outs[0] = _reversed(rw, outs[0], time_axis, nodes)
        parts.append(outs)
    for k, out in enumerate(outputs):  # each output: the directions' pieces on its direction axis
        if out:
            pieces = [p[k] for p in parts]
            nodes.append(helper.make_node("Concat", pieces, [out], axis=dir_axis_y if k == 0 else dir_axis_h,
                                          name=rw.name("concat"))
                         if len(pieces) > 1 else helper.make_node("Identity", pieces, [out], name=rw.name("id")))
    return nodes


def _direction_attrs(a: dict, d: int, per_dir: int, n_dirs: int) -> dict:
    """The attributes of direction ``d``'s forward node: the original's, with that direction's activations."""
    kept = {k: v for k, v in a.items() if k not in ("direction", "activations", "activation_alpha",
                                                    "activation_beta")}
    for key in ("activations", "activation_alpha", "activation_beta"):
        if key in a:
            values = list(a[key])
            kept[key] = values[d * per_dir:(d + 1) * per_dir] if len(values) == per_dir * n_dirs else values
    return kept


# -- packed sequences ------------------------------------------------------------------------------------------

def _read(rw: ShapedRewriter, tensor: str) -> bool:
    """``tensor`` is read by a node or is a graph output."""
    return bool(tensor) and (any(tensor in n.input for n in rw.model.graph.node)
                             or any(o.name == tensor for o in rw.model.graph.output))


def _steps(rw: ShapedRewriter, x: str, lens: str, nodes: list[NodeProto]) -> tuple[str, str]:
    """[T, N] int64 time steps t (from X [T, N, I]) and [1, N] int64 lengths."""
    n = rw.name
    shape, length, t, tc, ln, ln2 = n("pk_shape"), n("pk_T"), n("pk_t"), n("pk_tc"), n("pk_len"), n("pk_len2")
    nodes += [helper.make_node("Shape", [x], [shape], name=n("shape")),
              helper.make_node("Gather", [shape, _scalar(rw, 0)], [length], axis=0, name=n("gather")),
              helper.make_node("Range", [_scalar(rw, 0), length, _scalar(rw, 1)], [t], name=n("range")),
              helper.make_node("Unsqueeze", [t, _int64(rw, [1])], [tc], name=n("unsqueeze")),
              helper.make_node("Cast", [lens], [ln], to=7, name=n("cast")),
              helper.make_node("Unsqueeze", [ln, _int64(rw, [0])], [ln2], name=n("unsqueeze"))]
    return tc, ln2


def _within_index(rw: ShapedRewriter, x: str, lens: str, nodes: list[NodeProto]) -> str:
    """[T, N] int64: len-1-t for t < len, t after (each row reversed within its own length)."""
    t, ln = _steps(rw, x, lens, nodes)
    n = rw.name
    last, rev, valid, idx = n("pk_last"), n("pk_rev"), n("pk_valid"), n("pk_idx")
    nodes += [helper.make_node("Sub", [ln, _scalar(rw, 1)], [last], name=n("sub")),
              helper.make_node("Sub", [last, t], [rev], name=n("sub")),
              helper.make_node("Less", [t, ln], [valid], name=n("less")),
              helper.make_node("Where", [valid, rev, t], [idx], name=n("where"))]
    return idx


def _gather_time(rw: ShapedRewriter, tensor: str, idx: str, axes: list[int], nodes: list[NodeProto]) -> str:
    """``tensor`` (time first) reordered along time per row by ``idx`` [T, N] (unsqueezed on ``axes``)."""
    n = rw.name
    wide, shape, full, out = n("pk_wide"), n("pk_shape"), n("pk_full"), n("pk_within")
    nodes += [helper.make_node("Unsqueeze", [idx, _int64(rw, axes)], [wide], name=n("unsqueeze")),
              helper.make_node("Shape", [tensor], [shape], name=n("shape")),
              helper.make_node("Expand", [wide, shape], [full], name=n("expand")),
              helper.make_node("GatherElements", [tensor, full], [out], axis=0, name=n("reverse_within"))]
    return out


def _within(rw: ShapedRewriter, x: str, lens: str, nodes: list[NodeProto]) -> str:
    """X [T, N, I] with each row reversed within its own length."""
    return _gather_time(rw, x, _within_index(rw, x, lens, nodes), [2], nodes)


def _packed_outputs(rw: ShapedRewriter, outs: list[str], x: str, lens: str, rev: bool, want_h: bool,
                    nodes: list[NodeProto]) -> list[str]:
    """Y and Y_h of one direction's run over the padded sequence, as the node with ``sequence_lens`` gives
    them: Y (reversed back within each row's length, for the reverse direction) zero from each row's length on,
    Y_h Y's value at each row's last valid step of the run."""
    n = rw.name
    y_run = outs[0]
    t, ln = _steps(rw, x, lens, nodes)
    elem = rw.elem(x)
    valid, mask, mask4, last, at_last, pick, pick4 = (n("pk_v"), n("pk_m"), n("pk_m4"), n("pk_l"), n("pk_at"),
                                                      n("pk_p"), n("pk_p4"))
    nodes += [helper.make_node("Less", [t, ln], [valid], name=n("less")),
              helper.make_node("Cast", [valid], [mask], to=elem, name=n("cast")),
              helper.make_node("Unsqueeze", [mask, _int64(rw, [1, 3])], [mask4], name=n("unsqueeze")),
              helper.make_node("Sub", [ln, _scalar(rw, 1)], [last], name=n("sub")),
              helper.make_node("Equal", [t, last], [at_last], name=n("equal")),
              helper.make_node("Cast", [at_last], [pick], to=elem, name=n("cast")),
              helper.make_node("Unsqueeze", [pick, _int64(rw, [1, 3])], [pick4], name=n("unsqueeze"))]
    new = list(outs)
    if want_h:  # Y_h [1, N, H]: the run's output at t = len - 1
        picked = n("pk_picked")
        nodes += [helper.make_node("Mul", [y_run, pick4], [picked], name=n("mul")),
                  helper.make_node("ReduceSum", [picked, _int64(rw, [0])], [outs[1] + "_h"], keepdims=0,
                                   name=n("reducesum"))]
        new[1] = outs[1] + "_h"
    y = _gather_time(rw, y_run, _within_index(rw, x, lens, nodes), [1, 3], nodes) if rev else y_run
    masked = n("pk_y")
    nodes.append(helper.make_node("Mul", [y, mask4], [masked], name=n("mul")))
    new[0] = masked
    return new


# -- batch-first layout ------------------------------------------------------------------------------------------

def batch_first_rnn(rw: ShapedRewriter, node: NodeProto) -> list[NodeProto] | None:
    """A ``layout=1`` LSTM/GRU/RNN node as the same node in layout 0 between Transposes (None: not one)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("LSTM", "GRU", "RNN") or \
            not int(attrs(node).get("layout", 0)):
        return None
    nodes: list[NodeProto] = []

    def transposed(tensor: str, perm: list[int]) -> str:
        if not tensor:
            return ""
        out = rw.name("t")
        nodes.append(helper.make_node("Transpose", [tensor], [out], perm=perm, name=rw.name("transpose")))
        return out

    inputs = list(node.input)
    inputs[0] = transposed(inputs[0], [1, 0, 2])  # X [N, T, I] -> [T, N, I]
    for i in (5, 6):  # initial_h, initial_c [N, D, H] -> [D, N, H]
        if i < len(inputs):
            inputs[i] = transposed(inputs[i], [1, 0, 2])
    outs = [rw.name(f"l0_{k}") if o else "" for k, o in enumerate(node.output)]
    kept = {k: v for k, v in attrs(node).items() if k != "layout"}
    nodes.append(helper.make_node(node.op_type, inputs, outs, name=node.name or node.output[0], **kept))
    for k, (mine, theirs) in enumerate(zip(outs, node.output)):
        if theirs:  # Y [T, D, N, H] -> [N, T, D, H]; Y_h, Y_c [D, N, H] -> [N, D, H]
            nodes.append(helper.make_node("Transpose", [mine], [theirs], perm=[2, 0, 1, 3] if k == 0 else [1, 0, 2],
                                          name=rw.name("transpose")))
    return nodes


def rnn_layouts(model: ModelProto, notes: list[str]) -> None:
    """Rewrite every batch-first recurrent node of ``model`` in place (:func:`batch_first_rnn`)."""
    if not any(n.op_type in ("LSTM", "GRU", "RNN") for n in model.graph.node):
        return
    rw = ShapedRewriter(model)
    nodes: list[NodeProto] = []
    count = 0
    for node in model.graph.node:
        new = batch_first_rnn(rw, node)
        count += new is not None
        nodes.extend(new or [node])
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        notes.append(f"{count} batch-first (layout=1) recurrent node(s) run in layout 0 between Transposes "
                     "(onnxruntime runs layout 0 only)")
