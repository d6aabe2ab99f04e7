"""PyTorch's ``nn.EmbeddingBag`` as exported: a ``Loop`` over bags, rewritten into ``Gather`` + a reduction.

Both exporters of torch 2.13 write ``EmbeddingBag`` as a ``Loop`` that slices each bag's ids (or its
gathered rows) and reduces them; onnxruntime-training has no gradient for ``Loop``, so such a model could
not be trained at all.  With a 2-D input (every row of ``ids`` one bag, the form a batch of rows has) the
loop computes exactly ``ReduceSum(Gather(table, ids), axis=1)`` (``mode="sum"``) or that divided by the bag
size (``"mean"``): this module writes it so, for the training, predicted and exported graphs alike (the
same arithmetic, no per-bag loop), and the table is then read only by a ``Gather`` of a model input, so it
is trained row-sparsely (:mod:`streamfit._engine.steps.sparse_tables`).

Recognised: a top-level ``Loop`` whose body (with its ``If`` branches) reduces rows of one float
initializer (``ReduceSum``; ``ReduceMean`` or a ``Div`` for mean), gathered inside the body (the legacy
exporter) or before the loop (dynamo, times all-ones per-sample weights), by ids that come from one model
input through ``Reshape``/``Slice``/``Identity``/``Cast``.  Refused with a clear error: the offsets form
(1-D ``ids`` plus ``offsets``: its inputs are not per-row, streamfit batches rows), ``mode="max"``,
``padding_idx`` (dynamo's inner loop; the legacy exporter refuses it) and per-sample weights.  Loops that match none of this are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import prune
from streamfit.exceptions import ModelError

__all__ = ["rewrite_embedding_bags"]

_PASS = {"Reshape", "Slice", "Identity", "Cast", "Squeeze", "Unsqueeze", "Flatten"}


@dataclass(frozen=True)
class _Bag:
    """One recognised EmbeddingBag loop: its table, ids input, mode and the tensor its result is."""

    loop: NodeProto
    table: str
    ids: str
    mode: str
    output: str
    concat: NodeProto | None  # dynamo: the ConcatFromSequence of the loop's sequence output


def _subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for a in node.attribute:
        if a.type == a.GRAPH:
            yield a.g
        for g in a.graphs:
            yield g


def _body_nodes(graph: GraphProto) -> Iterator[NodeProto]:
    for node in graph.node:
        yield node
        for g in _subgraphs(node):
            yield from _body_nodes(g)


def _ones(name: str, producers: dict[str, NodeProto], consts: dict[str, np.ndarray]) -> bool:
    """``name`` is a tensor of ones (a constant, or an Expand/Unsqueeze/Reshape of one)."""
    for _ in range(8):
        if name in consts:
            return bool(np.all(consts[name] == 1))
        node = producers.get(name)
        if node is None or node.op_type not in ("Expand", "Unsqueeze", "Reshape", "Identity", "Cast"):
            return False
        name = node.input[0]
    return False


def _source(name: str, producers: dict[str, NodeProto]) -> str:
    """Follow ``name`` back through shape-only ops (first input) to where it comes from."""
    for _ in range(16):
        node = producers.get(name)
        if node is None or node.op_type not in _PASS:
            return name
        name = node.input[0]
    return name


def _match(loop: NodeProto, graph: GraphProto, producers: dict[str, NodeProto], consts: dict[str, np.ndarray],
           tables: set[str], inputs: dict[str, int], consumers: dict[str, list[NodeProto]]) -> _Bag | None:
    body = [n for g in _subgraphs(loop) for n in _body_nodes(g)]
    ops = {n.op_type for n in body}
    if not ops & {"ReduceSum", "ReduceMean", "ReduceMax"}:
        return None
    inner = {o for n in body for o in n.output} | {i.name for g in _subgraphs(loop) for i in g.input}
    body_producers = {o: n for n in body for o in n.output}
    gathers = [n for n in body if n.op_type == "Gather" and n.input[0] in tables]
    table = ids = None
    if len(gathers) == 1:  # legacy: the rows are gathered inside the loop
        table = gathers[0].input[0]
        ids = _source(_source(gathers[0].input[1], body_producers), producers)
    elif not gathers:  # dynamo: rows gathered before the loop, sliced inside it
        outer = {i for n in body for i in n.input if i and i not in inner}
        for name in outer:
            node = producers.get(name)
            for _ in range(4):
                if node is None:
                    break
                if node.op_type == "Mul":
                    a, b = node.input
                    if not (_ones(a, producers, consts) or _ones(b, producers, consts)):
                        raise ModelError(f"EmbeddingBag loop {loop.name or loop.output[0]!r}: per-sample weights "
                                         "are not supported (streamfit rewrites the bag into Gather + ReduceSum)")
                    node = producers.get(b if _ones(a, producers, consts) else a)
                elif node.op_type == "Identity":
                    node = producers.get(node.input[0])
                elif node.op_type == "Gather" and node.input[0] in tables:
                    table, ids = node.input[0], _source(node.input[1], producers)
                    break
                else:
                    break
            if table is not None:
                break
    if table is None or ids is None:
        return None
    where = f"EmbeddingBag loop {loop.name or loop.output[0]!r} over table {table!r}"
    if "ReduceMax" in ops:
        raise ModelError(f"{where}: mode='max' is not supported (sum and mean are)")
    if "Loop" in ops or "Not" in ops:  # dynamo's padding_idx: an inner loop skipping the padding ids
        raise ModelError(f"{where}: padding_idx is not supported (its bags skip ids, which Gather + ReduceSum "
                         "does not); export without padding_idx")
    if ids not in inputs:
        return None
    if inputs[ids] != 2:
        raise ModelError(f"{where}: its ids input {ids!r} has rank {inputs[ids]}; streamfit trains EmbeddingBag with "
                         "a 2-D input (one bag per row, as a batch of rows is): the offsets form's inputs are not "
                         "per-row (export nn.EmbeddingBag(input=[N, bag_size]) instead, padding short bags with "
                         "padding_idx)")
    mode = "mean" if "ReduceMean" in ops or "Div" in ops else "sum"
    used = [o for o in loop.output if o and consumers.get(o)]
    if len(used) != 1:
        return None
    concat = None
    users = consumers[used[0]]
    if len(users) == 1 and users[0].op_type == "ConcatFromSequence":
        concat = users[0]
        return _Bag(loop, table, ids, mode, concat.output[0], concat)
    return _Bag(loop, table, ids, mode, used[0], None)


def rewrite_embedding_bags(model: ModelProto, notes: list[str]) -> None:
    """Rewrite ``model`` in place: every recognised EmbeddingBag loop becomes Gather + ReduceSum (+ Div)."""
    graph = model.graph
    if not any(n.op_type == "Loop" for n in graph.node):
        return
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer
              if int(np.prod(list(i.dims), dtype=np.int64)) <= 16 and i.data_location != TensorProto.EXTERNAL}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    tables = {i.name for i in graph.initializer
              if i.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE) and len(i.dims) == 2}
    inits = {i.name: i for i in graph.initializer}
    inputs = {i.name: len(i.type.tensor_type.shape.dim) for i in graph.input
              if i.name not in inits and i.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.INT32)}
    bags = [b for n in graph.node if n.op_type == "Loop"
            for b in [_match(n, graph, producers, consts, tables, inputs, consumers)] if b is not None]
    if not bags:
        return
    replaced = {id(b.loop): b for b in bags}
    dropped = {id(b.concat) for b in bags if b.concat is not None}
    nodes: list[NodeProto] = []
    axes = f"sf_bag_axes_{len(graph.initializer)}"
    graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), axes))
    for n in graph.node:
        if id(n) in dropped:
            continue
        bag = replaced.get(id(n))
        if bag is None:
            nodes.append(n)
            continue
        k = len(nodes)
        rows, total = f"sf_bag{k}_rows", f"sf_bag{k}_sum" if bag.mode == "mean" else bag.output
        nodes += [helper.make_node("Gather", [bag.table, bag.ids], [rows], name=f"sf_bag{k}_gather"),
                  helper.make_node("ReduceSum", [rows, axes], [total], keepdims=0, name=f"sf_bag{k}_reduce")]
        if bag.mode == "mean":  # PyTorch divides the bag's sum by its size
            shape, size, count = f"sf_bag{k}_shape", f"sf_bag{k}_size", f"sf_bag{k}_count"
            one = f"sf_bag{k}_one"
            graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), one))
            elem = inits[bag.table].data_type
            nodes += [helper.make_node("Shape", [bag.ids], [shape]),
                      helper.make_node("Gather", [shape, one], [size], axis=0),
                      helper.make_node("Cast", [size], [count], to=elem),
                      helper.make_node("Div", [total, count], [bag.output])]
        notes.append(f"EmbeddingBag loop {n.name or n.output[0]!r} (mode={bag.mode}, table {bag.table!r}, ids "
                     f"{bag.ids!r}) rewritten as Gather + ReduceSum{' / bag size' if bag.mode == 'mean' else ''}")
    del graph.node[:]
    graph.node.extend(nodes)
    prune(model)  # the loop's index arithmetic and the dynamo pre-gather feed nothing any more
