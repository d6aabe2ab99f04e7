"""The column plan exported: the model of an estimator (or Trainer) with column encoders takes the raw columns.

Each source column becomes one graph input named after it (``[N]`` for a scalar column, ``[N, d]`` for a
FixedSizeList, ``[N, *shape]`` for a fixed_shape_tensor, ``[N, L]`` for a list column fed through
:class:`~streamfit.features.Padded`), of the type the estimator was trained from (strings as ONNX strings).
In front of the trained graph, nodes rebuild every model input exactly as training built it: MurmurHash3
(``com.microsoft``) for :class:`~streamfit.features.Hashed`, ``ai.onnx.ml.LabelEncoder`` over the committed
vocabulary for :class:`~streamfit.features.Vocabulary`, Cast/Concat/Reshape for plain columns.  A serving
process needs no preprocessing code.  (ONNX tensors have no nulls: a serving caller cannot pass one.)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from streamfit._columns.mapping import normalize_inputs
from streamfit.features._encoders import OOV_ID, Encoder, Hashed, Lengths, Mask, Padded, Vocabulary
from streamfit.features._murmur import MURMUR_DOMAIN, murmur_node

__all__ = ["raw_column_model"]


def _elem(info: Mapping[str, Any]) -> int:
    dtype_name = info["dtype"]
    if dtype_name == "str":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype_name))


class _Builder:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"_sf_{hint}_{self._n}"

    def const(self, value: Any, dtype: Any, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], hint: str, out: str | None = None, domain: str = "",
             **attrs: Any) -> str:
        out = out or self.name(hint)
        self.nodes.append(helper.make_node(op, inputs, [out], domain=domain, name=self.name(op), **attrs))
        return out

    def cast(self, x: str, elem: int) -> str:
        return self.node("Cast", [x], "cast", to=elem)


def _rename_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_input(attr.g, old, new)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _rename_input(g, old, new)


class _RawColumns:
    """The raw-column inputs of the exported graph (one per source column, as first seen in training) and the
    nodes that rebuild each model input from them, encoder by encoder."""

    def __init__(self, b: _Builder, columns_seen: Mapping[str, Any], pads: Mapping[str, float]) -> None:
        self.b = b
        self.seen = columns_seen
        self.types = {c: v["dtype"] for c, v in columns_seen.items()}
        self.pads = pads
        self.shapes: dict[str, list[Any]] = {}  # column -> graph input shape (the input is named as the column)

    def column(self, c: str, length: int | None = None) -> str:
        if c not in self.seen:
            raise ValueError(f"column {c!r} was never seen in training: its type is unknown, cannot export")
        dims = [length if d == -1 else d for d in self.seen[c]["dims"]]
        self.shapes.setdefault(c, ["N", *dims])
        return c

    def hashed(self, enc: Hashed, cols: Sequence[str]) -> str:
        """MurmurHash3 of each column (seeded per column), into buckets ``1..buckets-1`` (0: padding)."""
        b, parts = self.b, []
        for k, c in enumerate(cols):
            x = self.column(c)
            if self.types[c] != "str":
                x = b.cast(x, TensorProto.INT64)
            h = b.name("hash")
            b.nodes.append(murmur_node(x, h, enc.column_seed(k), name=b.name("MurmurHash3")))
            h = b.cast(h, TensorProto.INT64)
            h = b.node("Mod", [h, b.const(enc.buckets - 1, np.int64)], "mod")
            parts.append(b.node("Add", [h, b.const(1, np.int64)], "id"))
        return _stack(b, parts)

    def vocabulary(self, state: Any, cols: Sequence[str]) -> str:
        """A LabelEncoder over the committed vocabulary of each column (unknown values: the OOV id)."""
        b, parts = self.b, []
        for k, c in enumerate(cols):
            x = self.column(c)
            table = state.ids[k]
            if self.types[c] == "str":
                attrs: dict[str, Any] = {"keys_strings": [str(v) for v in table] or [""]}
            else:
                x = b.cast(x, TensorProto.INT64)
                attrs = {"keys_int64s": [int(v) for v in table] or [0]}
            values = [int(table[v]) for v in table] or [OOV_ID]
            parts.append(b.node("LabelEncoder", [x], "vocab", domain="ai.onnx.ml", values_int64s=values,
                                default_int64=OOV_ID, **attrs))
        return _stack(b, parts)

    def padding(self, enc: "Mask | Lengths", shape: tuple[int, ...]) -> str:
        """The mask (or lengths) of a padded column, found by its pad value."""
        if enc.column not in self.pads:
            raise ValueError(f"{enc!r} exports only beside a Padded input of the same column (the exported "
                             f"model takes the padded column and finds the padding by its pad value)")
        b = self.b
        x = self.column(enc.column, enc.length or (shape[-1] if shape else None))
        pad = b.const(self.pads[enc.column], np.dtype(self.types[enc.column]), "pad")
        present = b.node("Not", [b.node("Equal", [x, pad], "eq")], "not")
        if isinstance(enc, Mask):
            return present
        return b.node("ReduceSum", [b.cast(present, TensorProto.INT64), b.const([1], np.int64)], "len", keepdims=0)

    def values(self, enc: Encoder | None, cols: Sequence[str], state: Any, shape: tuple[int, ...],
               target: int) -> str:
        """The graph value that encodes model input columns ``cols`` as training did (before its reshape)."""
        if isinstance(enc, Hashed):
            return self.hashed(enc, cols)
        if isinstance(enc, Vocabulary):
            return self.vocabulary(state, cols)
        if isinstance(enc, Padded):
            return self.column(enc.column, shape[-1] if shape else enc.length)
        if isinstance(enc, (Mask, Lengths)):
            return self.padding(enc, shape)
        if enc is not None:
            raise ValueError(f"cannot export encoder {enc!r}")
        parts = [self.column(c) for c in cols]
        return parts[0] if len(parts) == 1 else _stack(self.b, [self.b.cast(p, target) for p in parts])


def raw_column_model(model: ModelProto, inputs: Mapping[str, Any], model_inputs: tuple[Any, ...],
                     states: Mapping[str, Any], columns_seen: Mapping[str, Any],
                     row_shapes: Mapping[str, tuple[int, ...]]) -> ModelProto:
    """``model`` (inputs as declared) with its inputs rebuilt from raw columns; see the module docstring."""
    out = ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    sources = {s.input: s for s in normalize_inputs(inputs)}
    b = _Builder(graph)
    pads = {s.encoder.column: s.encoder.pad for s in sources.values() if isinstance(s.encoder, Padded)}
    raw = _RawColumns(b, columns_seen, pads)
    declared = {m.name: m for m in model_inputs}
    for name, m in declared.items():
        src = sources.get(name)
        shape = tuple(row_shapes.get(name, ()))
        target = helper.np_dtype_to_tensor_dtype(np.dtype(m.dtype))
        internal = f"_sf_input_{name}"
        _rename_input(graph, name, internal)
        ids = raw.values(src.encoder if src is not None else None, src.columns if src is not None else (name,),
                         states.get(name), shape, target)
        b.node("Reshape", [b.cast(ids, target), b.const([-1, *shape], np.int64, "shape")], "reshape", out=internal)
    _finish(out, b, raw, declared)
    return out


def _finish(out: ModelProto, b: _Builder, raw: _RawColumns, declared: Mapping[str, Any]) -> None:
    """The raw columns as the graph's inputs (for the declared ones), the new nodes first, their opsets."""
    graph = out.graph
    kept = [i for i in graph.input if i.name not in declared]
    del graph.input[:]
    graph.input.extend(kept)
    for c, shape in raw.shapes.items():
        graph.input.append(helper.make_tensor_value_info(c, _elem(raw.seen[c]), shape))
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(b.nodes + nodes)
    graph.initializer.extend(b.inits)
    domains = {op.domain: op for op in out.opset_import}
    if any(n.domain == MURMUR_DOMAIN for n in b.nodes) and MURMUR_DOMAIN not in domains:
        out.opset_import.append(helper.make_opsetid(MURMUR_DOMAIN, 1))
    if any(n.domain == "ai.onnx.ml" for n in b.nodes):
        if "ai.onnx.ml" not in domains:
            out.opset_import.append(helper.make_opsetid("ai.onnx.ml", 2))
        elif domains["ai.onnx.ml"].version < 2:
            domains["ai.onnx.ml"].version = 2


def _stack(b: _Builder, parts: list[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    axes = b.const([1], np.int64, "axes")
    return b.node("Concat", [b.node("Unsqueeze", [p, axes], "col") for p in parts], "stack", axis=1)
