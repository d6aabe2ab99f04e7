"""streamfit's own reverse-mode gradient builder, for the ops of the ready-made models' graphs.

It writes the gradient graph in the form ORT's ``OrtModuleGraphBuilder`` gives ``gradient/builders.py`` (forward
nodes, a ``YieldOp`` where dL/dY enters, ``<tensor>_grad`` outputs, the trained weights as graph inputs),
so the fused step is built from it unchanged -- but only from standard ONNX ops, so it needs no
onnxruntime-training: the ready-made models train on any onnxruntime (Python 3.13+ included).  The
shapes are static (from ONNX shape inference): a broadcast is reduced where the shapes say so, as
``rewrites.simplify_broadcast_gradients`` leaves ORT's graph.  An op outside :data:`SUPPORTED` is a
:class:`~streamfit.exceptions.ModelError` that says what needs onnxruntime-training.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, helper, numpy_helper

from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import attr
from streamfit._engine.gradient.activations import relu_grad, sigmoid_grad, tanh_grad
from streamfit._engine.gradient.graphs import GradientGraphs
from streamfit._engine.gradient.rewrites import propagate_matmul_shapes, remove_noop_reshapes, shape_table
from streamfit._engine.prepare.model import PreparedModel
from streamfit.exceptions import ModelError

__all__ = ["SUPPORTED", "NO_GRADIENT", "build_own_gradient", "unsupported_ops", "unsupported_nodes",
           "builders_note"]

Shape = list  # ints, symbols or None per dim

#: ops whose inputs get no gradient (constants, shapes, ids)
NO_GRADIENT = frozenset({"Constant", "Shape", "Size", "ConstantOfShape", "Greater", "Less", "Equal", "Not", "Cast"})


class _Emitter:
    """Backward nodes under one prefix, typed constants, static shapes of the forward tensors."""

    def __init__(self, dtype: np.dtype, shapes: dict[str, Shape], taken: set[str]) -> None:
        self.dtype = np.dtype(dtype)
        self.shapes = shapes
        self.nodes: list[NodeProto] = []
        self.inits: dict[str, Any] = {}
        self.taken = taken
        self._n = 0

    def fresh(self, hint: str) -> str:
        while True:
            self._n += 1
            name = f"sf_ad_{hint}_{self._n}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def op(self, op_type: str, inputs: Sequence[str], out: str | None = None, name: str | None = None,
           **attrs: Any) -> str:
        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name or self.fresh(op_type), **attrs))
        return out

    def const(self, name: str, value: Any, dtype: Any = None) -> str:
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(np.asarray(value, self.dtype if dtype is None else dtype), name)
        return name

    def scalar(self, name: str, value: float) -> str:
        """A constant scalar of the graph's dtype (the ``const`` of :mod:`.activations`)."""
        return self.const(name, np.array(value))

    def activation_op(self, op_type: str, inputs: Sequence[str], out: str | None = None, *, hint: str = "",
                      **attrs: Any) -> str:
        """:meth:`op` for :mod:`.activations` (its intermediates get fresh names: ``hint`` is not needed)."""
        return self.op(op_type, inputs, out, **attrs)

    def shape(self, name: str, node: NodeProto) -> Shape:
        shape = self.shapes.get(name)
        if shape is None or any(d is None for d in shape):
            raise ModelError(f"streamfit's gradient builder needs the static shape of {name!r} (input of "
                             f"{node.op_type} node {node.name or node.output[0]!r}); shape inference did not give it")
        return shape

    def unbroadcast(self, g: str, grad_shape: Shape, target: Shape, out: str, node: NodeProto) -> str:
        """``g`` (of the broadcast shape) summed down to ``target``'s shape, as ``out``."""
        lead = len(grad_shape) - len(target)
        if lead < 0:
            raise ModelError(f"cannot reduce a gradient of shape {grad_shape} to {target} (node {node.name!r})")
        axes = list(range(lead)) + [lead + i for i, d in enumerate(target) if d == 1 and grad_shape[lead + i] != 1]
        for i, d in enumerate(target):
            if d != 1 and d != grad_shape[lead + i]:
                raise ModelError(f"streamfit's gradient builder cannot prove that {target} broadcasts to {grad_shape} "
                                 f"(node {node.name or node.output[0]!r})")
        if not axes:
            return self.op("Identity", [g], out)
        axes_name = self.const(Names.axes(axes), np.array(axes, np.int64), np.int64)
        if all(a < lead for a in axes):  # leading axes only: keepdims=0 gives the target's shape (a bias)
            return self.op("ReduceSum", [g, axes_name], out, name=Names.reduce(out), keepdims=0)
        if lead == 0:
            return self.op("ReduceSum", [g, axes_name], out, keepdims=1)
        if not all(isinstance(d, int) for d in target):
            raise ModelError(f"cannot reshape a reduced gradient to the symbolic shape {target} (node {node.name!r})")
        summed = self.op("ReduceSum", [g, axes_name], keepdims=1)
        return self.op("Reshape", [summed, self.const(self.fresh("shape"), np.array(target, np.int64), np.int64)], out)


# Each rule: (emitter, node, output grads (None where none), which inputs need one, output names for them) ->
# None.  It writes each needed input's gradient contribution under the name given.
Rule = Callable[[_Emitter, NodeProto, list, list, list], None]


def _binary(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    a, b = node.input[0], node.input[1]
    dy = dys[0]
    so = e.shape(node.output[0], node)
    op = node.op_type
    for i, (x, out) in enumerate(zip((a, b), outs)):
        if not need[i]:
            continue
        other = b if i == 0 else a
        if op == "Add" or (op == "Sub" and i == 0):
            g = dy
        elif op == "Sub":
            g = e.op("Neg", [dy])
        elif op == "Mul":
            g = e.op("Mul", [dy, other])
        elif i == 0:  # Div: d(a/b)/da = 1/b
            g = e.op("Div", [dy, b])
        else:  # d(a/b)/db = -a/b^2 = -(y/b)
            g = e.op("Neg", [e.op("Div", [e.op("Mul", [dy, node.output[0]]), b])])
        e.unbroadcast(g, so, e.shape(x, node), out, node)  # g has the output's shape


def _matmul(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    a, b = node.input[0], node.input[1]
    if len(e.shape(a, node)) != 2 or len(e.shape(b, node)) != 2:
        raise ModelError(f"streamfit's gradient builder differentiates 2-D MatMul only; node {node.name!r} multiplies "
                         f"{e.shape(a, node)} by {e.shape(b, node)}")
    dy = dys[0]
    if need[0]:  # dA = dY @ B^T
        e.op("Gemm", [dy, b], outs[0], transA=0, transB=1, alpha=1.0, beta=1.0)
    if need[1]:  # dB = A^T @ dY (the form step_graphs.emit_sgd_folded folds the SGD update into)
        e.op("Gemm", [a, dy], outs[1], transA=1, transB=0, alpha=1.0, beta=1.0)


def _gemm(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    a, b = node.input[0], node.input[1]
    dy = dys[0]
    if need[0]:  # Y = alpha op(A) op(B): d op(A) = alpha dY op(B)^T
        if ta:
            e.op("Gemm", [b, dy], outs[0], transA=tb, transB=1, alpha=alpha, beta=1.0)
        else:
            e.op("Gemm", [dy, b], outs[0], transA=0, transB=0 if tb else 1, alpha=alpha, beta=1.0)
    if need[1]:
        if tb:
            e.op("Gemm", [dy, a], outs[1], transA=1, transB=ta, alpha=alpha, beta=1.0)
        else:
            e.op("Gemm", [a, dy], outs[1], transA=0 if ta else 1, transB=0, alpha=alpha, beta=1.0)
    if len(node.input) > 2 and need[2]:
        g = dy if beta == 1.0 else e.op("Mul", [dy, e.const(e.fresh("beta"), np.array(beta))])
        e.unbroadcast(g, e.shape(node.output[0], node), e.shape(node.input[2], node), outs[2], node)


def _relu(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    relu_grad(e.activation_op, e.scalar, e.dtype, dys[0], node.output[0], outs[0])


def _tanh(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    tanh_grad(e.activation_op, e.scalar, dys[0], node.output[0], outs[0])


def _sigmoid(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    sigmoid_grad(e.activation_op, e.scalar, dys[0], node.output[0], outs[0])


def _identity(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    e.op("Identity", [dys[0]], outs[0])


def _neg(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    e.op("Neg", [dys[0]], outs[0])


def _sum(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    so = e.shape(node.output[0], node)
    for x, n, out in zip(node.input, need, outs):
        if n:
            e.unbroadcast(dys[0], so, e.shape(x, node), out, node)


def _reduce_sum(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    x = node.input[0]
    if len(node.input) < 2 or not node.input[1]:
        raise ModelError(f"ReduceSum node {node.name!r} without axes: not differentiated by streamfit's builder")
    dy = dys[0]
    if not attr(node, "keepdims", 1):
        dy = e.op("Unsqueeze", [dy, node.input[1]])
    e.op("Expand", [dy, e.op("Shape", [x])], outs[0])


def _reshape(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    e.op("Reshape", [dys[0], e.op("Shape", [node.input[0]])], outs[0])


def _transpose(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    perm = attr(node, "perm", None)
    if perm is None:
        perm = list(range(len(e.shape(node.input[0], node))))[::-1]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    e.op("Transpose", [dys[0]], outs[0], perm=inverse)


def _concat(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    axis = int(attr(node, "axis", 0))
    sizes = []
    for x in node.input:
        shape = e.shape(x, node)
        d = shape[axis]
        if not isinstance(d, int):
            raise ModelError(f"Concat node {node.name!r}: streamfit's builder needs a static size along axis {axis}")
        sizes.append(d)
    names = [out if n else e.fresh("unused") for n, out in zip(need, outs)]
    split = e.const(e.fresh("split"), np.array(sizes, np.int64), np.int64)
    e.nodes.append(helper.make_node("Split", [dys[0], split], names, name=e.fresh("Split"), axis=axis))


def _gather(e: _Emitter, node: NodeProto, dys: list, need: list, outs: list) -> None:
    if int(attr(node, "axis", 0)) != 0:
        raise ModelError(f"Gather node {node.name!r}: streamfit's builder differentiates axis=0 only")
    data, ids = node.input[0], node.input[1]
    # dData = zeros(data) with dY added at the ids' rows (ScatterND, reduction="add"): GatherGrad in standard ops
    zeros = e.op("ConstantOfShape", [e.op("Shape", [data])],
                 value=helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(e.dtype), [1], [0.0]))
    idx = e.op("Unsqueeze", [ids, e.const("sf_axes_m1", np.array([-1], np.int64), np.int64)])
    e.op("ScatterND", [zeros, idx, dys[0]], outs[0], reduction="add")


#: the ops differentiated here -> which inputs carry a gradient (None: all) and the rule
SUPPORTED: dict[str, tuple[tuple[int, ...] | None, Rule]] = {
    "Add": ((0, 1), _binary), "Sub": ((0, 1), _binary), "Mul": ((0, 1), _binary), "Div": ((0, 1), _binary),
    "MatMul": ((0, 1), _matmul), "Gemm": ((0, 1, 2), _gemm), "Relu": ((0,), _relu), "Tanh": ((0,), _tanh),
    "Sigmoid": ((0,), _sigmoid), "Identity": ((0,), _identity), "Neg": ((0,), _neg), "Sum": (None, _sum),
    "ReduceSum": ((0,), _reduce_sum), "Reshape": ((0,), _reshape), "Transpose": ((0,), _transpose),
    "Concat": (None, _concat), "Gather": ((0,), _gather), "Flatten": ((0,), _reshape),
    "Squeeze": ((0,), _reshape), "Unsqueeze": ((0,), _reshape),
}


def _differentiable(node: NodeProto) -> tuple[int, ...]:
    if node.domain not in ("", "ai.onnx") or node.op_type in NO_GRADIENT:
        return ()
    spec = SUPPORTED.get(node.op_type)
    if spec is None:
        return tuple(range(len(node.input)))  # unknown: every input might need one (checked by the caller)
    return tuple(range(len(node.input))) if spec[0] is None else tuple(i for i in spec[0] if i < len(node.input))


def unsupported_ops(pm: PreparedModel, input_grads: Sequence[str] = ()) -> list[str]:
    """The ops on a gradient path of ``pm`` that this builder does not differentiate (empty: it can build it)."""
    return sorted(unsupported_nodes(pm, input_grads))


def unsupported_nodes(pm: PreparedModel, input_grads: Sequence[str] = ()) -> dict[str, list[str]]:
    """:func:`unsupported_ops` with the nodes of each op (``{"Erf": ["/gelu/Erf", ...]}``), in graph order."""
    needs = _requires_grad(pm.model, set(pm.weights) | set(input_grads))
    bad: dict[str, list[str]] = {}
    for node in pm.model.graph.node:
        if any(node.input[i] in needs for i in _differentiable(node)) and \
                (node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED):
            op = f"{node.domain + ':' if node.domain not in ('', 'ai.onnx') else ''}{node.op_type}"
            bad.setdefault(op, []).append(node.name or node.output[0])
    return bad


def _named(bad: dict[str, list[str]]) -> str:
    """``Erf (nodes '/a/Erf', '/b/Erf'), Softmax (node 'sm')``: at most three nodes per op."""
    def nodes(names: list[str]) -> str:
        shown = ", ".join(repr(n) for n in names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        return f"node{'s' if len(names) > 1 else ''} {shown}"

    return ", ".join(f"{op} ({nodes(names)})" for op, names in sorted(bad.items()))


def _requires_grad(model: ModelProto, sources: set[str]) -> set[str]:
    needs = set(sources)
    for node in model.graph.node:  # topological order (ONNX requires it)
        if any(node.input[i] in needs for i in _differentiable(node)):
            needs.update(o for o in node.output if o)
    return needs


def _grad_of(tensor: str) -> str:
    """The name of ``tensor``'s gradient: ORT's naming, which the shape table and the rewrites follow."""
    return f"{tensor}_grad"


def build_own_gradient(pm: PreparedModel, input_grads: Sequence[str] = ()) -> GradientGraphs:
    """The gradient graphs of ``pm`` (as :func:`~streamfit._engine.gradient.builders.build_gradient_graphs`
    returns them), built here."""
    bad = unsupported_nodes(pm, input_grads)
    if bad:
        raise ModelError(f"streamfit's own gradient builder cannot differentiate {_named(bad)}: the gradient of ops "
                         f"{sorted(bad)} needs onnxruntime-training at train time (Python <= 3.12); "
                         f"streamfit's own gradient builder covers {sorted(SUPPORTED)}.  Compile the model on "
                         "Python <= 3.12 (`streamfit compile MODEL -o model.train.onnx`) and train the artifact here")
    model = pm.with_host_inputs(pm.model)  # host tensors: inputs the caller sets, never folded as constants
    graph = model.graph
    for node in graph.node:  # a copy: every node gets a name an error can give
        node.name = node.name or node.output[0]
    shapes = shape_table(model, pm.initial)
    sources = set(pm.weights) | set(input_grads)
    needs = _requires_grad(model, sources)
    y = pm.output_name
    if y not in needs:
        raise ModelError(f"no trained weight reaches output {y!r}")
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
    e = _Emitter(pm.dtype, shapes, taken)
    clash = sorted(_grad_of(t) for t in needs if _grad_of(t) in taken)
    if clash:
        raise ModelError(f"the model already has tensors named {clash[:3]}: streamfit's gradient builder names "
                         "gradients <tensor>_grad")
    grads = _backward(e, graph, needs, sources, y)
    out = _gradient_model(pm, model, e, grads, input_grads)
    forward = ModelProto()
    forward.CopyFrom(out)
    del forward.graph.node[len(graph.node):]
    del forward.graph.output[:]
    forward.graph.output.extend(o for o in model.graph.output)
    propagate_matmul_shapes(out, shapes)
    remove_noop_reshapes(out, shapes, protect={pm.output_name})
    info = SimpleNamespace(builder="streamfit", initializer_names_to_train=list(pm.weights),
                           initializer_grad_names_to_train=[grads[w] for w in pm.weights],
                           user_input_grad_names={t: grads[t] for t in input_grads})
    return GradientGraphs(forward, out, [grads[w] for w in pm.weights], info, shapes,
                          [grads[t] for t in input_grads])


def _backward(e: _Emitter, graph: GraphProto, needs: set[str], sources: set[str], y: str) -> dict[str, str]:
    """Emit the backward nodes of ``graph`` into ``e``, from dL/dy (the YieldOp's output) back to ``sources``;
    return the gradient name of each source."""
    contributions: dict[str, list[str]] = {y: [_grad_of(y)]}
    e.taken.add(_grad_of(y))

    def gradient(t: str) -> str | None:
        """The accumulated gradient of ``t`` (a Sum of its contributions), named ``<t>_grad``."""
        parts = contributions.get(t)
        if not parts:
            return None
        if len(parts) == 1:
            if parts[0] != _grad_of(t):  # one contribution: give it the final name
                e.nodes.append(helper.make_node("Identity", [parts[0]], [_grad_of(t)], name=e.fresh("Identity")))
            return _grad_of(t)
        e.nodes.append(helper.make_node("Sum", parts, [_grad_of(t)], name=e.fresh("Sum")))
        return _grad_of(t)

    for node in reversed(list(graph.node)):
        outs_needed = [o for o in node.output if o in needs]
        if not outs_needed:
            continue
        dys = [gradient(o) if o in needs else None for o in node.output]
        if all(d is None for d in dys):
            continue
        diff = set(_differentiable(node))
        need = [i in diff and name in needs for i, name in enumerate(node.input)]
        if not any(need):
            continue
        if dys[0] is None:
            raise ModelError(f"streamfit's gradient builder: node {node.name!r} has a gradient on a second output only")
        outs = []
        for i, name in enumerate(node.input):
            if need[i]:
                part = f"{_grad_of(name)}_{len(contributions.get(name, []))}"
                while part in e.taken:
                    part += "_"
                e.taken.add(part)
                contributions.setdefault(name, []).append(part)
                outs.append(part)
            else:
                outs.append("")
        try:
            SUPPORTED[node.op_type][1](e, node, dys, need, outs)
        except ModelError:
            raise
        except Exception as exc:  # a rule meeting what it cannot handle (a shape unknown statically, ...)
            raise ModelError(f"streamfit's own gradient builder cannot differentiate {node.op_type} node "
                             f"{node.name or node.output[0]!r}: {type(exc).__name__}: {exc}") from exc
    found = {t: gradient(t) for t in sources}
    missing = [t for t, g in found.items() if g is None]
    if missing:
        raise ModelError(f"weights {missing} get no gradient from output {y!r}")
    _collapse_identities(e.nodes)
    return {t: g for t, g in found.items() if g is not None}


def _gradient_model(pm: PreparedModel, model: ModelProto, e: _Emitter, grads: dict[str, str],
                    input_grads: Sequence[str]) -> ModelProto:
    """``model`` with the trained weights as inputs, a YieldOp where dL/dY enters, the backward nodes of ``e``
    and the gradients (of ``input_grads``, then of the weights) as outputs: the form ORT's builder gives."""
    y = pm.output_name
    yield_node = helper.make_node("YieldOp", [y], [_grad_of(y)], name="sf_ad_yield", domain="com.microsoft",
                                  full_shape_outputs=[0])
    out = ModelProto()
    out.CopyFrom(model)
    g = out.graph
    weights = set(pm.weights)
    kept = [i for i in g.initializer if i.name not in weights]
    moved = [i for i in g.initializer if i.name in weights]
    del g.initializer[:]
    g.initializer.extend(kept + list(e.inits.values()))
    g.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in moved)
    g.node.extend([yield_node] + e.nodes)
    del g.output[:]
    order = list(input_grads) + list(pm.weights)
    g.output.extend(helper.make_tensor_value_info(grads[t], _elem(pm), None) for t in order)
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    if not any(o.domain in ("", "ai.onnx") and o.version >= 16 for o in out.opset_import):
        raise ModelError("streamfit's gradient builder writes opset-16 ops (ScatterND with reduction); the model's "
                         "default opset is older")
    return out


def _collapse_identities(nodes: list[NodeProto]) -> None:
    """``X -> a``, ``Identity(a) -> b`` (a used only there) becomes ``X -> b``: a weight's gradient keeps the
    node that makes it (step_graphs.emit_sgd_folded folds the SGD update into a gradient Gemm it finds so)."""
    while True:
        producers = {o: n for n in nodes for o in n.output}
        uses: dict[str, int] = {}
        for n in nodes:
            for i in n.input:
                uses[i] = uses.get(i, 0) + 1
        for node in nodes:
            if node.op_type == "Identity" and node.input[0] in producers and uses[node.input[0]] == 1:
                src = producers[node.input[0]]
                src.output[list(src.output).index(node.input[0])] = node.output[0]
                nodes.remove(node)
                break
        else:
            return


def _elem(pm: PreparedModel) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(pm.dtype))


def builders_note(pm: PreparedModel) -> str:
    """Which gradient builders can differentiate ``pm``, in a line (``streamfit check`` prints it):
    onnxruntime-training's knows any op it registers; streamfit's own (the only one on an onnxruntime without
    training, Python 3.13+) the ops of :data:`SUPPORTED`, naming the nodes it cannot."""
    bad = unsupported_nodes(pm)
    if not bad:
        return ("gradient: streamfit's own builder differentiates this model too (it trains on an onnxruntime "
                "without training, Python 3.13+)")
    return (f"gradient: onnxruntime-training's builder only; streamfit's own cannot differentiate {_named(bad)} "
            "(on an onnxruntime without training, Python 3.13+: compile an artifact with `streamfit compile` "
            "where onnxruntime-training is installed)")
