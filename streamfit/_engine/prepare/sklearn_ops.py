"""scikit-learn's ``ai.onnx.ml`` operators rewritten into standard ops that onnxruntime-training differentiates.

skl2onnx writes the weights of Ridge, Lasso, LinearSVR, PassiveAggressiveRegressor, LinearSVC and
LogisticRegression into node attributes (``LinearRegressor``/``LinearClassifier``), where nothing can train
them, and ends classifiers in ops without gradients (``Normalizer``, ``ZipMap``, ``ArrayFeatureExtractor``).
This pass (run by model preparation once the trained output is chosen) drops the nodes that feed no output
(the label branch), then rewrites each remaining one into ``MatMul`` + ``Add`` with the weights as
initializers, followed by the operator's post-transform, so the model predicts what onnxruntime 1.19 predicts
with the original and every coefficient is trainable.  Operators it cannot rewrite faithfully are refused by
name (``PROBIT``, ``SOFTMAX_ZERO``); other ML ops are left alone (they train when no weight is upstream).
In a graph skl2onnx made, the float initializers that are not a layer's weights or bias (``unity`` in
``1 - p``, ``negate``, a MinMaxScaler's ``Mul``/``Add`` constants) become ``Constant`` nodes: they are
arithmetic, and training them would bend the model's probabilities or its fitted scaling.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import attrs, prune
from streamfit.exceptions import ModelError

__all__ = ["rewrite_ml_ops"]

ML = "ai.onnx.ml"
_FLOAT = TensorProto.FLOAT


def rewrite_ml_ops(model: ModelProto, notes: list[str]) -> dict[str, TensorProto]:
    """Rewrite ``model`` in place (its outputs already chosen); return its initializers by name, afterwards."""
    graph = model.graph
    from_skl2onnx = model.producer_name == "skl2onnx"
    if not from_skl2onnx and not any(node.domain == ML for node in graph.node):
        return {init.name: init for init in graph.initializer}
    prune(model)
    if from_skl2onnx:
        _freeze_constants(model, notes)
    types = _elem_types(model)
    rw = _MlRewriter(model, types)
    nodes: list[NodeProto] = []
    for node in graph.node:
        new = rw.rewrite(node) if node.domain == ML else None
        if new is None:
            nodes.append(node)
        else:
            nodes.extend(new)
            notes.append(f"rewrote {ML} {node.op_type} {node.name or node.output[0]!r} into standard ops")
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rw.added.values())
    return {init.name: init for init in graph.initializer}


def _freeze_constants(model: ModelProto, notes: list[str]) -> None:
    """skl2onnx's float initializers other than a MatMul/Gemm weight or the bias added to its product ->
    ``Constant`` nodes (weight selection trains initializers only)."""
    graph = model.graph
    producers = {o: node for node in graph.node for o in node.output}
    weights: set[str] = set()
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx"):
            weights.update(node.input[1:])  # B, and Gemm's C
        elif node.op_type == "Add" and node.domain in ("", "ai.onnx"):
            sources = [producers.get(i) for i in node.input]
            if any(p is not None and p.op_type == "MatMul" for p in sources):
                weights.update(node.input)
    frozen = [init for init in graph.initializer
              if init.name not in weights and init.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE)]
    if not frozen:
        return
    keep = [init for init in graph.initializer if init not in frozen]
    constants = [helper.make_node("Constant", [], [init.name], value=init) for init in frozen]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    nodes = constants + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    notes.append(f"kept skl2onnx's constants {sorted(i.name for i in frozen)} frozen")


def _elem_types(model: ModelProto) -> dict[str, int]:
    """Element type of every tensor that has one (graph inputs, initializers, inferred values)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is a convenience: unknown types are treated as float below
        inferred = model
    types = {init.name: init.data_type for init in model.graph.initializer}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


class _MlRewriter:
    """Rewrites one ``ai.onnx.ml`` node into standard ops (a method per operator), with fresh names and the
    model's constants."""

    def __init__(self, model: ModelProto, types: dict[str, int]) -> None:
        self.model = model
        self.types = types
        self.added: dict[str, TensorProto] = {}
        self.taken = {init.name for init in model.graph.initializer} | {
            name for node in model.graph.node for name in list(node.input) + list(node.output)}
        self.consumed = {i for node in model.graph.node for i in node.input} | {o.name for o in model.graph.output}
        self.constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = attrs(node, decode=True).get("value")
                if value is not None:
                    self.constants[node.output[0]] = numpy_helper.to_array(value)

    def name(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", hint)
        name, i = base, 1
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def init(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.added[name] = numpy_helper.from_array(value, name)
        return name

    def const(self, hint: str, value: np.ndarray, nodes: list[NodeProto]) -> str:
        """A constant that must not be trained: a ``Constant`` node (weight selection trains initializers)."""
        name = self.name(hint)
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        return name

    def as_float(self, x: str, nodes: list[NodeProto]) -> str:
        """ML ops compute in float32 whatever their input (double, int): a Cast where the input is not float."""
        if self.types.get(x, _FLOAT) == _FLOAT:
            return x
        out = self.name(f"{x}_as_float")
        nodes.append(helper.make_node("Cast", [x], [out], to=_FLOAT))
        return out

    def rewrite(self, node: NodeProto) -> list[NodeProto] | None:
        method = getattr(self, f"_{node.op_type}", None)
        return None if method is None else method(node, attrs(node, decode=True))

    # -- the linear models ------------------------------------------------------------------------
    def _affine(self, node: NodeProto, coefficients: list[float], intercepts: list[float], rows: int,
                nodes: list[NodeProto]) -> str:
        x = self.as_float(node.input[0], nodes)
        coef = np.asarray(coefficients, np.float32)
        if rows < 1 or coef.size % rows:
            raise ModelError(f"{ML} {node.op_type} {node.name!r}: {coef.size} coefficients do not split into "
                             f"{rows} rows")
        bias = np.asarray(intercepts if intercepts else np.zeros(rows), np.float32).reshape(-1)
        if bias.shape != (rows,):
            raise ModelError(f"{ML} {node.op_type} {node.name!r}: {bias.size} intercepts for {rows} outputs")
        hint = node.name or node.output[-1]
        w = self.init(f"{hint}_coef", np.ascontiguousarray(coef.reshape(rows, -1).T))
        b = self.init(f"{hint}_intercept", bias)
        product, score = self.name(f"{hint}_matmul"), self.name(f"{hint}_score")
        nodes += [helper.make_node("MatMul", [x, w], [product]), helper.make_node("Add", [product, b], [score])]
        return score

    def _post(self, node: NodeProto, transform: str, score: str, out: str, nodes: list[NodeProto]) -> None:
        if transform == "NONE":
            nodes.append(helper.make_node("Identity", [score], [out]))
        elif transform == "LOGISTIC":
            nodes.append(helper.make_node("Sigmoid", [score], [out]))
        elif transform == "SOFTMAX":
            nodes.append(helper.make_node("Softmax", [score], [out], axis=-1))
        else:
            raise ModelError(f"{ML} {node.op_type} {node.name!r} has post_transform={transform}, which streamfit "
                             "cannot rewrite into trainable ops (NONE, LOGISTIC and SOFTMAX are supported)")

    def _LinearRegressor(self, node: NodeProto, a: dict) -> list[NodeProto]:
        nodes: list[NodeProto] = []
        score = self._affine(node, a.get("coefficients", []), a.get("intercepts", []), int(a.get("targets", 1)),
                             nodes)
        self._post(node, a.get("post_transform", "NONE"), score, node.output[0], nodes)
        return nodes

    def _LinearClassifier(self, node: NodeProto, a: dict) -> list[NodeProto]:
        if node.output[0] in self.consumed:
            raise ModelError(f"the trained output depends on the label output {node.output[0]!r} of {ML} "
                             "LinearClassifier, which has no gradient: train through its scores (output_name=)")
        labels = a.get("classlabels_ints") or a.get("classlabels_strings") or []
        intercepts = a.get("intercepts", [])
        rows = len(intercepts) if intercepts else len(labels) if len(labels) > 2 else 1
        transform = a.get("post_transform", "NONE")
        nodes: list[NodeProto] = []
        score = self._affine(node, a.get("coefficients", []), intercepts, rows, nodes)
        out = node.output[1] if len(node.output) > 1 else self.name("unused_scores")
        if rows == 1 and len(labels) == 2 and transform != "PROBIT":
            # onnxruntime's binary case: scores [1 - s, s] on the raw score s, whatever the post-transform
            one = self.const(f"{node.name or out}_one", np.ones(1, np.float32), nodes)
            negative = self.name(f"{out}_negative")
            nodes += [helper.make_node("Sub", [one, score], [negative]),
                      helper.make_node("Concat", [negative, score], [out], axis=1)]
            return nodes
        self._post(node, transform, score, out, nodes)
        return nodes

    # -- what classifiers end with ------------------------------------------------------------------
    def _Normalizer(self, node: NodeProto, a: dict) -> list[NodeProto]:
        nodes: list[NodeProto] = []
        x = self.as_float(node.input[0], nodes)
        norm, axes = a.get("norm", "MAX"), self.const(f"{node.output[0]}_axes", np.array([1], np.int64), nodes)
        total = self.name(f"{node.output[0]}_norm")
        if norm == "L1":
            magnitude = self.name(f"{node.output[0]}_abs")
            nodes += [helper.make_node("Abs", [x], [magnitude]),
                      helper.make_node("ReduceSum", [magnitude, axes], [total], keepdims=1)]
        elif norm == "L2":
            squares = self.name(f"{node.output[0]}_sq")
            nodes += [helper.make_node("ReduceSumSquare", [x], [squares], axes=[1], keepdims=1),
                      helper.make_node("Sqrt", [squares], [total])]
        elif norm == "MAX":
            nodes.append(helper.make_node("ReduceMax", [x], [total], axes=[1], keepdims=1))
        else:
            raise ModelError(f"{ML} Normalizer {node.name!r}: unknown norm {norm!r}")
        nodes.append(helper.make_node("Div", [x, total], [node.output[0]]))
        return nodes

    def _ZipMap(self, node: NodeProto, a: dict) -> list[NodeProto]:
        """A sequence of maps cannot be trained through: the probabilities tensor it wraps takes its place."""
        for out in self.model.graph.output:
            if out.name == node.output[0]:
                out.type.CopyFrom(helper.make_tensor_type_proto(_FLOAT, [None, None]))
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]])]

    def _ArrayFeatureExtractor(self, node: NodeProto, a: dict) -> list[NodeProto] | None:
        """Constant column indices (skl2onnx's positive-class column): a Gather on the last axis."""
        indices = self.constants.get(node.input[1])
        if indices is None or indices.dtype.kind not in "iu" or self.types.get(node.input[0]) not in (None, _FLOAT):
            return None
        nodes: list[NodeProto] = []
        idx = self.const(f"{node.output[0]}_indices", np.asarray(indices, np.int64).reshape(-1), nodes)
        return nodes + [helper.make_node("Gather", [node.input[0], idx], [node.output[0]], axis=-1)]

    def _Scaler(self, node: NodeProto, a: dict) -> list[NodeProto]:
        """``(X - offset) * scale`` (skl2onnx's StandardScaler and friends) as Sub and Mul."""
        nodes: list[NodeProto] = []
        x = self.as_float(node.input[0], nodes)
        offset = self.const(f"{node.output[0]}_offset", np.asarray(a.get("offset", [0.0]), np.float32), nodes)
        scale = self.const(f"{node.output[0]}_scale", np.asarray(a.get("scale", [1.0]), np.float32), nodes)
        centered = self.name(f"{node.output[0]}_centered")
        nodes += [helper.make_node("Sub", [x, offset], [centered]),
                  helper.make_node("Mul", [centered, scale], [node.output[0]])]
        return nodes
