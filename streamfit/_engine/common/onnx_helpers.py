"""Small ONNX helpers the engine's graph passes share: node attributes, node replacement, constants, order.

One home for what the model rewrites (``prepare.trainable_ops``, ``prepare.sklearn_ops``), the gradient
rewrites (``gradient.rewrites``, ``gradient.portable``), the gradient builder (``gradient.autodiff``) and the
step-graph builders (``steps``) each wrote for themselves.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from streamfit.exceptions import ModelError

__all__ = ["attrs", "attr", "replace_nodes", "prune", "add_const", "toposort", "copy_fields", "default_opset",
           "ShapedRewriter"]


def attrs(node: NodeProto, decode: bool = False) -> dict[str, Any]:
    """``node``'s attributes by name, as Python values (``decode``: bytes values as str)."""
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if decode and isinstance(value, bytes) else value
    return out


def attr(node: NodeProto, name: str, default: Any) -> Any:
    """One attribute of ``node`` (``default`` when it has none)."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def replace_nodes(model: ModelProto, rewrite: Callable[[NodeProto], "Iterable[NodeProto] | None"]) -> int:
    """Replace each node of ``model``'s graph by what ``rewrite`` returns for it (None: keep it); return how
    many were replaced."""
    nodes: list[NodeProto] = []
    count = 0
    for node in model.graph.node:
        new = rewrite(node)
        if new is None:
            nodes.append(node)
        else:
            nodes.extend(new)
            count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def rename_tensor(nodes: Iterable[NodeProto], old: str, new: str, inputs: bool = True, outputs: bool = True) -> None:
    """Rename tensor ``old`` to ``new`` where ``nodes`` read it (``inputs``) and where they write it (``outputs``)."""
    for node in nodes:
        for names, wanted in ((node.input, inputs), (node.output, outputs)):
            if wanted:
                for i, name in enumerate(names):
                    if name == old:
                        names[i] = new


def prune(model: ModelProto) -> None:
    """Drop the nodes no graph output depends on (a classifier's label branch once its scores are trained)."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    kept: list[NodeProto] = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    used = needed | {i.name for i in graph.input}
    unused = [init for init in graph.initializer if init.name not in used]
    for init in unused:
        graph.initializer.remove(init)


def add_const(model: ModelProto, name: str, value: np.ndarray) -> str:
    """The initializer ``name`` holding ``value``, added to ``model`` unless it has one of that name."""
    if not any(init.name == name for init in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def toposort(model: ModelProto) -> ModelProto:
    """Reorder ``model``'s nodes topologically (in place; returned for chaining)."""
    graph = model.graph
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(name in available for name in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            missing = sorted({n for node in rest for n in node.input if n not in available})
            raise ModelError(f"cannot order the training graph; unresolved inputs {missing[:5]}")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)
    return model


def copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` except the field ``skip``."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if getattr(fd, "is_repeated", None) or getattr(fd, "label", None) == 3:  # 3: LABEL_REPEATED
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def default_opset(model: ModelProto) -> int:
    """The version of ``model``'s default-domain opset (0 when it imports none)."""
    return max((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), default=0)


_NP: dict[int, type] = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16}


class ShapedRewriter:
    """What a rewrite of a model's nodes needs: fresh names, typed constants and the static shapes of one
    model (used by the rewrites before the gradient is built: ``trainable``, ``running_stats``)."""

    def __init__(self, model: ModelProto) -> None:
        self.model = model
        self.count = 0
        self.consts: list[onnx.TensorProto] = []
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # best effort: rewrites that need a shape say so
            inferred = model
        self.types: dict[str, tuple[int, list | None]] = {}
        for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
            t = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
            self.types[vi.name] = (t.elem_type, dims)
        for init in model.graph.initializer:
            self.types[init.name] = (init.data_type, list(init.dims))

    def name(self, hint: str) -> str:
        self.count += 1
        return f"sf_t_{hint}_{self.count}"

    def elem(self, tensor: str) -> int:
        return self.types.get(tensor, (TensorProto.FLOAT, None))[0] or TensorProto.FLOAT

    def const(self, value: "float | np.ndarray", like: str) -> str:
        dtype = _NP.get(self.elem(like), np.float32)
        name = self.name("c")
        self.consts.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def shape(self, tensor: str) -> list | None:
        return self.types.get(tensor, (0, None))[1]
