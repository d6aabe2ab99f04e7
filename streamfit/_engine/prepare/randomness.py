"""Random ops of a training-mode export: seeded in the training copy, replaced by their expectation in the
inference copy, so ``predict``, progressive validation and ``to_onnx()`` never draw a random number.

A training-mode export spells stochastic depth (torchvision's ``StochasticDepth``) and hand-written dropout
out: ``RandomUniformLike`` -> ``Less(u, p)`` -> ``Cast`` -> ``Div(mask, p)`` -> ``Mul(x, .)``.  The eval form
replaces each random draw by its expectation where the pattern says what that is:

- a comparison of a uniform draw with a constant, cast to a number (the keep mask): ``P(u < c)`` (or
  ``P(u > c)``), so ``mask / p`` becomes 1 and the layer the identity, as PyTorch's eval mode;
- ``Bernoulli(p)``: ``p``; a ``RandomUniform*``/``RandomNormal*`` draw used as a number: its mean.

A random op used otherwise (a bool mask into ``Where``, a draw whose expectation the pattern does not give)
is a :class:`~streamfit.exceptions.ModelError` naming the node: predicting with it would be random.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import attr
from streamfit.exceptions import ModelError

__all__ = ["RANDOM_OPS", "random_nodes", "seed_random_ops", "eval_random_ops"]

RANDOM_OPS = frozenset({"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli",
                        "Multinomial"})
_COMPARE = {"Less": 1, "LessOrEqual": 1, "Greater": -1, "GreaterOrEqual": -1}


def random_nodes(model: ModelProto) -> list[NodeProto]:
    return [n for n in model.graph.node if n.domain in ("", "ai.onnx") and n.op_type in RANDOM_OPS]


def seed_random_ops(model: ModelProto, seed: int) -> int:
    """Give every random op of ``model`` without a seed one of its own (``seed``, ``seed + 1``, ...), in place."""
    count = 0
    for k, node in enumerate(random_nodes(model)):
        if not any(a.name == "seed" for a in node.attribute):
            node.attribute.append(helper.make_attribute("seed", float(seed + k)))
            count += 1
    return count


def _constants(model: ModelProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = attr(node, "value", None)
            if value is not None:
                values[node.output[0]] = numpy_helper.to_array(value)
            for key in ("value_float", "value_int"):
                v = attr(node, key, None)
                if v is not None:
                    values[node.output[0]] = np.array(v)
    return values


def _constant_node(out: str, value: float, elem: int) -> NodeProto:
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    return helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.array(value, dtype)))


def _mean(node: NodeProto) -> float | None:
    if node.op_type.startswith("RandomUniform"):
        return (float(attr(node, "low", 0.0)) + float(attr(node, "high", 1.0))) / 2.0
    if node.op_type.startswith("RandomNormal"):
        return float(attr(node, "mean", 0.0))
    return None


def _draw_elem(node: NodeProto, types: dict[str, int]) -> int:
    dtype = attr(node, "dtype", None)
    if dtype is not None:
        return int(dtype)
    return types.get(node.input[0], TensorProto.FLOAT) if node.input else TensorProto.FLOAT


def eval_random_ops(model: ModelProto) -> int:
    """Replace each random draw of ``model`` (the inference copy) by its expectation, in place (module doc);
    return how many were replaced."""
    nodes = random_nodes(model)
    if not nodes:
        return 0
    consts = _constants(model)
    consumers: dict[str, list[NodeProto]] = {}
    for n in model.graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    types = {i.name: i.data_type for i in model.graph.initializer}
    types.update({i.name: i.type.tensor_type.elem_type for i in model.graph.input})
    replace: dict[int, NodeProto] = {}  # id of the node replaced -> the Constant (or Cast) replacing it
    for node in nodes:
        where = f"{node.op_type} node {node.name or node.output[0]!r}"
        users = consumers.get(node.output[0], [])
        if node.op_type == "Bernoulli":  # E = p: the probabilities, in the draw's type
            elem = _draw_elem(node, types)
            replace[id(node)] = helper.make_node("Cast", [node.input[0]], [node.output[0]], to=elem)
            continue
        mean = _mean(node)
        if mean is None:
            raise ModelError(f"{where}: a random op whose expectation streamfit cannot tell; predict and to_onnx() "
                             "would draw from it (export the model in eval mode)")
        if users and all(u.op_type in _COMPARE for u in users):
            for u in users:
                _replace_comparison(node, u, consts, consumers, replace, where)
        elif users and any(u.op_type in _COMPARE for u in users):
            raise ModelError(f"{where}: its draw is both compared and used as a number; its eval form is unknown")
        else:
            replace[id(node)] = _constant_node(node.output[0], mean, _draw_elem(node, types))
    new = [replace.get(id(n), n) for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(new)
    _drop_dead(model)
    return len(nodes)


def _replace_comparison(draw: NodeProto, cmp: NodeProto, consts: dict[str, np.ndarray],
                        consumers: dict[str, list[NodeProto]], replace: dict[int, Any], where: str) -> None:
    """``Cast(Less(u, c))`` of a uniform draw ``u`` -> the constant ``P(u < c)`` (Greater: ``P(u > c)``)."""
    if not draw.op_type.startswith("RandomUniform"):
        raise ModelError(f"{where}: a comparison of a non-uniform draw; its eval form is unknown")
    first = cmp.input[0] == draw.output[0]
    other = cmp.input[1] if first else cmp.input[0]
    if other not in consts or consts[other].size != 1:
        raise ModelError(f"{where}: compared with {other!r}, not a constant; its eval form is unknown")
    low, high = float(attr(draw, "low", 0.0)), float(attr(draw, "high", 1.0))
    c = float(consts[other].reshape(()))
    below = min(max((c - low) / (high - low), 0.0), 1.0)  # P(u < c)
    sign = _COMPARE[cmp.op_type] * (1 if first else -1)
    p = below if sign > 0 else 1.0 - below
    casts = consumers.get(cmp.output[0], [])
    if not casts or any(c.op_type != "Cast" for c in casts):
        raise ModelError(f"{where}: its mask ({cmp.op_type} node {cmp.name or cmp.output[0]!r}) is used as a "
                         "bool, not cast to a number; its eval form is unknown")
    for cast in casts:
        replace[id(cast)] = _constant_node(cast.output[0], p, int(attr(cast, "to", TensorProto.FLOAT)))


def _drop_dead(model: ModelProto) -> None:
    """Remove nodes none of whose outputs is used (the draws and comparisons replaced), in place."""
    graph = model.graph
    while True:
        used = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        live = [n for n in graph.node if any(o in used for o in n.output if o)]
        if len(live) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(live)
