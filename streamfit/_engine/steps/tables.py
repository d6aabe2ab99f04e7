"""Which trained weights are embedding tables trained row-sparsely (initializers read only by ``Gather`` of
integer model inputs), and the training model without them: each table ``Gather`` cut out, its output a graph
input.  The why and the rest of the scheme: :mod:`streamfit._engine.steps.sparse_tables`."""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx
from onnx import helper

from streamfit._engine.common.names import Names
from streamfit._engine.prepare.model import PreparedModel
from streamfit.optim.base import Optimizer
from streamfit.penalties import Penalty

__all__ = ["TableUse", "SparseTable", "find_tables", "training_model"]


@dataclass(frozen=True)
class TableUse:
    """One ``Gather`` of a table: the model input holding the ids and the tensor its rows feed."""

    ids: str
    rows: str


@dataclass(frozen=True)
class SparseTable:
    """A table trained row-sparsely: its name, shape and every ``Gather`` that reads it."""

    name: str
    shape: tuple[int, ...]
    uses: tuple[TableUse, ...]


def _axis(node: onnx.NodeProto) -> int:
    for a in node.attribute:
        if a.name == "axis":
            return int(helper.get_attribute_value(a))
    return 0


def find_tables(pm: PreparedModel, optimizer: Optimizer | None = None, penalty: Penalty | None = None
                ) -> tuple[SparseTable, ...]:
    """The trained weights of ``pm`` that can be trained row-sparsely (see the module docstring).

    Given ``optimizer`` (``sparse="auto"``), only the tables whose row-sparse update is exactly the dense one:
    the optimizer leaves rows with a zero gradient unchanged and no penalty applies to the table."""
    if optimizer is not None and not optimizer.zero_gradient_fixed:
        return ()
    exact_penalty = optimizer is None or penalty is None or (penalty.l1 == 0 and penalty.l2 == 0)
    graph = pm.model.graph
    integer_inputs = {i.name for i in pm.inputs if i.dtype.kind in "iu"}
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, k))
    tables = []
    for w in pm.weights:
        uses = consumers.get(w, [])
        if not uses or w in outputs or pm.initial[w].ndim < 1 or (w in pm.penalized and not exact_penalty):
            continue
        if all(node.op_type == "Gather" and node.domain in ("", "ai.onnx") and k == 0 and _axis(node) == 0
               and len(node.input) == 2 and node.input[1] in integer_inputs for node, k in uses):
            tables.append(SparseTable(w, tuple(pm.initial[w].shape),
                                      tuple(TableUse(node.input[1], node.output[0]) for node, _ in uses)))
    return tuple(tables)


def training_model(pm: PreparedModel, tables: tuple[SparseTable, ...]) -> PreparedModel:
    """``pm`` without its tables: each table ``Gather`` cut out and its output a graph input (the rows of the
    id positions); the tables are no longer weights and the new inputs not in ``inputs``.  What the gradient
    and fused graphs are built from."""
    names = {t.name for t in tables}
    elem = next(i.data_type for i in pm.model.graph.initializer if i.name in names)
    model = onnx.ModelProto()
    model.CopyFrom(pm.model)  # cheap: a large table is a data-less stub there (streamfit._engine.prepare.large_initializers)
    kept_inits = [i for i in model.graph.initializer if i.name not in names]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept_inits)
    graph = model.graph
    kept = [n for n in graph.node if not (n.op_type == "Gather" and n.input and n.input[0] in names)]
    del graph.node[:]
    graph.node.extend(kept)
    by_input = {i.name: i for i in pm.inputs}
    for t in tables:
        for k, use in enumerate(t.uses):
            dims = [d if isinstance(d, (int, str)) and d != 0 else Names.rows_dim(t.name, k, j)
                    for j, d in enumerate(by_input[use.ids].shape)]
            graph.input.append(helper.make_tensor_value_info(use.rows, elem, dims + list(t.shape[1:])))
    weights = [w for w in pm.weights if w not in names]
    return replace(pm, model=model, weights=weights, penalized=pm.penalized - names,
                   initial={w: pm.initial[w] for w in weights}, notes=list(pm.notes))
