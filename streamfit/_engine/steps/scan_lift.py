"""A chunk's Scan body keeps only what depends on the carried state: the rest runs once per chunk, outside.

A node in a Scan body costs about the same per iteration whatever its size (a fraction of a microsecond on CPU),
so a step's cost in a chunk is its node count.  Two kinds of nodes do not need the loop:

- **hoisted**: nodes that read only the step's own inputs (its rows, per-step scalars, constants), such as a
  ready-made model's standardization ``(X - mean) / scale``: computed once over all steps' stacked inputs
  ([steps, ...]) before the Scan, and scanned in;
- **sunk**: nodes that only compute the reported loss from the step's output before its update and its targets
  (a log loss is a dozen nodes): computed once over the stacked outputs after the Scan.

Only ops whose result does not depend on the tensor's size are hoisted (IEEE-exact arithmetic: the weights see
the same bits as a step per run), and not a scale by a constant, which onnxruntime folds into the product it
feeds only while both are in one graph; the sunk loss may use any elementwise op or a reduction (a reported value,
within float32 rounding of the step path's).  Broadcasting is kept: a stacked value of lower per-step rank gets
its missing axes after the steps axis; constants broadcast from the right, as in the body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["Lifted", "lift"]

#: results that are the correctly rounded value of their inputs: the same bits on any tensor size (not Sqrt:
#: onnxruntime's vectorized float Sqrt is not correctly rounded on longer tensors, measured on 1.19)
_EXACT = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Identity", "Cast", "Max", "Min", "Where",
          "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Not", "And", "Or"}
#: further elementwise ops a sunk loss may use (their kernels may round differently on other sizes)
_ELEMENTWISE = _EXACT | {"Sqrt", "Reciprocal", "Exp", "Log", "Sigmoid", "Softplus", "Relu", "Tanh", "Pow",
                         "Clip", "Floor", "Ceil", "IsNaN", "IsInf"}
_REDUCE = {"ReduceSum", "ReduceMean"}
#: the opset from which each reduction takes its axes as an input (before: an attribute)
_AXES_INPUT = {"ReduceSum": 13, "ReduceMean": 18}
_SOFTMAX = {"Softmax", "LogSoftmax"}
_OUT = "sfc_l_"  # the outer graph's names of lifted values


@dataclass
class Lifted:
    """What :func:`lift` moved out of the body: outer nodes before and after the Scan, and its new ports."""

    #: outer nodes computing hoisted values (before the Scan) and the loss (after it)
    before: list[onnx.NodeProto] = field(default_factory=list)
    after: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    #: new scanned inputs of the body: (body name, outer stacked name)
    scanned: list[tuple[str, str]] = field(default_factory=list)
    #: new scan outputs of the body: (body name, outer stacked name)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    #: the outer name of the stacked losses, when the loss was sunk (else None: the body's loss output stays)
    losses: str | None = None
    #: body inputs (scanned or per step) the body no longer reads
    unused: set[str] = field(default_factory=set)
    #: the inferred type and shape of each body value (the new ports' declarations)
    types: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)


def _ranks(body: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto],
           types: dict[str, onnx.ValueInfoProto], refs: Sequence[onnx.ValueInfoProto] = ()) -> dict[str, int]:
    """Per-step rank of every value of ``body`` where shape inference knows it (``types``: their inferred types),
    the outer values it reads typed by ``refs``."""
    graph = body
    if refs:
        graph = onnx.GraphProto()
        graph.CopyFrom(body)
        graph.input.extend(refs)
    model = helper.make_model(graph, opset_imports=opsets)
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (no ranks: nothing is lifted)
        return {}
    ranks = {}
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and t.elem_type:
            ranks[vi.name] = len(t.shape.dim)
            types[vi.name] = vi
    for init in body.initializer:
        ranks[init.name] = len(init.dims)
    return ranks


class _Outer:
    """Builds lifted nodes in the outer graph: stacked values carry a leading steps axis, constants do not."""

    def __init__(self, stacked: dict[str, str], consts: dict[str, str], ranks: dict[str, int],
                 inits: dict[str, onnx.TensorProto], lifted: Lifted, opset: int) -> None:
        self.opset = opset
        self.stacked = stacked  # body name -> outer name of its stacked value
        self.consts = consts  # body name -> outer name (outer refs: the same name; initializers: copied)
        self.ranks = ranks
        self.inits = inits
        self.lifted = lifted
        self._n = 0

    def _name(self, base: str) -> str:
        self._n += 1
        return f"{_OUT}{self._n}_{base}"

    def _const(self, name: str) -> str:
        if name not in self.consts:
            copy = onnx.TensorProto()
            copy.CopyFrom(self.inits[name])
            copy.name = _OUT + "c_" + name
            self.lifted.initializers.append(copy)
            self.consts[name] = copy.name
        return self.consts[name]

    def _axes(self, values: list[int]) -> str:
        name = self._name("axes")
        self.lifted.initializers.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def can(self, node: onnx.NodeProto, ops: set[str]) -> bool:
        ins = [i for i in node.input if i]
        if not all(i in self.stacked or i in self.consts or i in self.inits for i in ins):
            return False
        if not all(i in self.ranks for i in ins) or not all(o in self.ranks for o in node.output):
            return False
        if not any(i in self.stacked for i in ins):
            return False  # constants only: not a per-step value
        if node.op_type in _REDUCE:
            return bool(ops & _REDUCE) and (len(ins) == 1 or ins[1] in self.inits)
        if node.op_type in _SOFTMAX:
            return bool(ops & _SOFTMAX)
        if node.op_type == "Concat":  # a copy (exact); its constants are repeated over the steps
            return ops is _EXACT and all(self.ranks[i] == self.ranks[node.output[0]] for i in ins)
        if node.op_type == "Unsqueeze":  # a view; its axes (an input from opset 13) shift past the steps axis
            return ops is _EXACT and self.opset >= 13 and ins[0] in self.stacked and len(ins) == 2 and ins[1] in self.inits
        return node.op_type in ops

    def _repeated(self, const: str, like: str, into: list[onnx.NodeProto]) -> str:
        """Constant ``const`` repeated over the steps of stacked value ``like``: [steps, *const's shape]."""
        steps, shape, full, out = (self._name(const + s) for s in ("_steps", "_shape", "_full", "_rep"))
        zero, one = self._axes([0]), self._axes([1])
        into.append(helper.make_node("Shape", [like], [shape + "_like"]))
        into.append(helper.make_node("Slice", [shape + "_like", zero, one], [steps]))
        into.append(helper.make_node("Shape", [const], [shape]))
        into.append(helper.make_node("Concat", [steps, shape], [full], axis=0))
        into.append(helper.make_node("Expand", [const, full], [out]))
        return out

    def _padded(self, node: onnx.NodeProto, into: list[onnx.NodeProto]) -> bool:
        """A ``Concat`` of a stacked value and a constant of one repeated value (a linear model's column of 1s) as
        one ``Pad`` of the stacked value with that value (the same copy), in place of the constant repeated over
        the steps and a Concat (six nodes): whether it was."""
        if self.opset < 11 or len(node.input) != 2:
            return False
        (x, c), at_end = (node.input, True) if node.input[0] in self.stacked else (node.input[::-1], False)
        if x not in self.stacked or c not in self.inits:
            return False
        value = numpy_helper.to_array(self.inits[c])
        if value.size == 0 or not (value == value.reshape(-1)[0]).all():
            return False
        rank = self.ranks[x] + 1  # the stacked value's: the steps axis first
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        axis = (axis + self.ranks[x] if axis < 0 else axis) + 1
        pads = [0] * (2 * rank)
        pads[rank + axis if at_end else axis] = int(value.shape[axis - 1])
        fill = numpy_helper.from_array(value.reshape(-1)[:1].reshape(()), self._name("fill"))
        self.lifted.initializers.append(fill)
        out = self._name(node.output[0])
        into.append(helper.make_node("Pad", [self.stacked[x], self._axes(pads), fill.name], [out], mode="constant"))
        self.stacked[node.output[0]] = out
        return True

    def emit(self, node: onnx.NodeProto, into: list[onnx.NodeProto]) -> None:
        """``node`` on stacked values, its outputs stacked."""
        out_rank = self.ranks[node.output[0]]
        ins: list[str] = []
        if node.op_type == "Unsqueeze":
            axes = [int(a) for a in numpy_helper.to_array(self.inits[node.input[1]]).reshape(-1)]
            ins = [self.stacked[node.input[0]], self._axes([a + 1 if a >= 0 else a for a in axes])]
        elif node.op_type == "Concat":
            if self._padded(node, into):
                return
            like = next(self.stacked[i] for i in node.input if i in self.stacked)
            ins = [self.stacked[i] if i in self.stacked else self._repeated(self.consts.get(i) or self._const(i), like, into)
                   for i in node.input]
        elif node.op_type in _REDUCE or node.op_type in _SOFTMAX:
            ins = [self.stacked[node.input[0]]]
        else:
            for name in node.input:
                if not name:
                    ins.append("")
                elif name in self.stacked:
                    missing = out_rank - self.ranks[name]
                    outer = self.stacked[name]
                    if missing > 0:  # per-step broadcasting prepends axes: here they go after the steps axis
                        expanded = self._name(name)
                        into.append(helper.make_node("Unsqueeze", [outer, self._axes(list(range(1, 1 + missing)))],
                                                     [expanded]))
                        outer = expanded
                    ins.append(outer)
                else:
                    ins.append(self.consts.get(name) or self._const(name))
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = ""
        if node.op_type in _REDUCE:
            rank = self.ranks[node.input[0]]
            if len(node.input) > 1 and node.input[1]:
                axes = [int(a) for a in numpy_helper.to_array(self.inits[node.input[1]]).reshape(-1)]
            else:
                axes = list(next((list(a.ints) for a in node.attribute if a.name == "axes"), []))
            axes = [a + rank if a < 0 else a for a in axes] or list(range(rank))
            del copy.attribute[:]
            copy.attribute.extend([a for a in node.attribute if a.name == "keepdims"])
            if self.opset >= _AXES_INPUT[node.op_type]:
                ins.append(self._axes([a + 1 for a in axes]))
            else:
                copy.attribute.append(helper.make_attribute("axes", [a + 1 for a in axes]))
        elif node.op_type in _SOFTMAX or node.op_type == "Concat":
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
            del copy.attribute[:]
            copy.attribute.append(helper.make_attribute("axis", axis if axis < 0 else axis + 1))
        outs = [self._name(o) for o in node.output]
        copy.input[:] = ins
        copy.output[:] = outs
        into.append(copy)
        for o, outer in zip(node.output, outs):
            self.stacked[o] = outer


def lift(body: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto], state: list[str],
         outer_refs: Sequence[onnx.ValueInfoProto], loss: str, outer_in: dict[str, str], scanned_out: dict[str, str]
         ) -> Lifted:
    """Move ``body``'s state-independent nodes out (edits ``body``); ``outer_refs`` are the outer values it reads
    (the same every step), ``outer_in`` maps each scanned and per-step input to its stacked outer name,
    ``scanned_out`` each body value already scanned out to its outer name."""
    lifted = Lifted()
    ranks = _ranks(body, opsets, lifted.types, outer_refs)
    if not ranks:
        return lifted
    inits = {i.name: i for i in body.initializer}
    producer = {o: n for n in body.node for o in n.output}
    outputs = [o.name for o in body.output]
    keep_outputs = [o for o in outputs if o != loss]
    # nodes the state and the other outputs need; the loss's own nodes are the others it needs
    needed = _ancestors(keep_outputs, producer)
    loss_nodes = [n for n in body.node if id(n) in _ancestors([loss], producer) and id(n) not in needed]
    opset = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 1)
    outer = _Outer(dict(outer_in), {r.name: r.name for r in outer_refs}, ranks, inits, lifted, opset)
    hoisted = []
    for node in body.node:  # topological order: a node's inputs are hoisted before it
        if id(node) in needed and outer.can(node, _EXACT) and not _scales_by_a_constant(node, inits):
            outer.emit(node, lifted.before)
            hoisted.append(node)
    # the loss, after the Scan: its inputs are stacked inputs, hoisted values or body values scanned out
    outer.stacked.update(scanned_out)
    sink = _sinkable(loss_nodes, outer, producer, set(state))
    if sink is not None:
        for name in sink:
            outer_name = _OUT + "so_" + name
            lifted.outputs.append((name, outer_name))
            outer.stacked[name] = outer_name
        for node in loss_nodes:
            outer.emit(node, lifted.after)
        lifted.losses = outer.stacked[loss]
    hoisted_ids = {id(n) for n in hoisted}
    gone = hoisted_ids | ({id(n) for n in loss_nodes} if sink is not None else set())
    kept = [n for n in body.node if id(n) not in gone]
    read = {i for n in kept for i in n.input} | set(keep_outputs) | ({loss} if sink is None else set())
    read |= {name for name, _ in lifted.outputs}
    for node in hoisted:  # a hoisted value the body still reads comes in scanned
        for o in node.output:
            if o in read and o not in {i.name for i in body.input}:
                lifted.scanned.append((o, outer.stacked[o]))
    kept = _without_identities(kept, set(outputs) | {name for name, _ in lifted.outputs})
    del body.node[:]
    body.node.extend(kept)
    produced = {o for n in kept for o in n.output} | {n for n, _ in lifted.scanned}
    lifted.unused = {n for n in outer_in if n not in read and n not in produced}
    return lifted


def _scales_by_a_constant(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A Mul or Div by a one-element constant: onnxruntime folds it into the MatMul or Gemm it feeds (a scale of
    the product, rounded otherwise), which it can do only while both are in the same graph, so it stays."""
    if node.op_type not in ("Mul", "Div"):
        return False
    scales = node.input if node.op_type == "Mul" else node.input[1:]  # c / x is not a scale of x
    return any(i in inits and int(np.prod(inits[i].dims, dtype=np.int64)) == 1 for i in scales)


def _without_identities(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without the Identity nodes whose output is not a graph output: their readers read the input."""
    alias = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Identity" and n.output[0] not in outputs}
    if not alias:
        return nodes
    out = []
    for node in nodes:
        if node.output and node.output[0] in alias and node.op_type == "Identity":
            continue
        for i, name in enumerate(node.input):
            while name in alias:
                name = alias[name]
            node.input[i] = name
        out.append(node)
    return out


def _ancestors(names: list[str], producer: dict[str, onnx.NodeProto]) -> set[int]:
    seen: set[int] = set()
    todo = [producer[n] for n in names if n in producer]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        todo.extend(producer[i] for i in node.input if i in producer)
    return seen


def _sinkable(nodes: list[onnx.NodeProto], outer: _Outer, producer: dict[str, onnx.NodeProto],
              state: set[str]) -> list[str] | None:
    """The body values the loss's nodes read that must be scanned out, or None when they cannot all run outside."""
    if not nodes:
        return None
    mine = {o for n in nodes for o in n.output}
    frontier: list[str] = []
    for node in nodes:
        for name in node.input:
            if not name or name in mine or name in outer.stacked or name in outer.consts or name in outer.inits:
                continue
            if name in state or name not in producer or name not in outer.ranks:
                return None  # the state before the step is not stacked
            if name not in frontier:
                frontier.append(name)
    trial = _Outer(dict(outer.stacked), dict(outer.consts), outer.ranks, outer.inits, Lifted(), outer.opset)
    for name in frontier:
        trial.stacked[name] = name
    for node in nodes:
        if not trial.can(node, _ELEMENTWISE | _REDUCE | _SOFTMAX):
            return None
        for o in node.output:
            trial.stacked[o] = o
    return frontier
