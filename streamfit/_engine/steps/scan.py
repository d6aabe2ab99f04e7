"""Many steps in one session run: the fused step graph as the body of an ONNX ``Scan`` over a chunk's steps.

A chunk of ``n`` rows trained at ``batch_size`` B is ``n // B`` steps of B rows (a last short step, if any, is an
ordinary step).  The body is the fused step graph itself (:func:`~streamfit._engine.steps.step_graphs.build_fused`,
or a training artifact's), so a chunk computes what the same steps computed one session run each:

- carried (loop state): every tensor a step updates -- weights, optimizer slots, BatchNorm running statistics;
- scanned in: the step's rows (each model input, labels, the two per-row weight vectors) and its scalars (the
  schedule's learning rate and the optimizer's per-step scalars, computed on the host as the step path does);
- scanned out: each step's mean loss and model output, computed before its update (the inference output where
  training differs, e.g. BatchNorm: the model's own predict graph is spliced into the body);
- read from the enclosing graph: the host tensors (a ready-made model's scaling), constant within a chunk.

The body keeps no per-step finiteness checks (the node count is the per-step cost): the chunk checks each
step's loss on the host and the final state once, in the outer graph.  A non-finite value in a weight or its
state never becomes finite again under the update rules (``inf - inf`` and ``nan`` propagate), so a finite
final state means every step's state was finite.  When anything is not finite the run's result is dropped (it
was written into the spare ping-pong set only) and the chunk is replayed one step per run, which gives the step
path's answer exactly, ``on_nonfinite`` included.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import ModelProto, helper

from streamfit._engine.common import ort_private as C
from streamfit._engine.common.graph_builder import onnx_dtype
from streamfit._engine.common.names import Names
from streamfit._engine.common.onnx_helpers import prune
from streamfit._engine.runtime.device import make_session
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan_dense import dense_step_graph
from streamfit._engine.steps.scan_mlp import mlp_step_graph
from streamfit._engine.steps.scan_expose import expose_body_values
from streamfit._engine.steps.scan_flat import FlatLayout, flat_step_graph
from streamfit._engine.steps.scan_lean import lean_chunk_model, lean_plan
from streamfit._engine.steps.scan_lift import Lifted, lift
from streamfit._engine.steps.scan_tables import TableBlocks, table_names, with_tables
from streamfit._engine.steps.step_graphs import sample_weight_shape
from streamfit.exceptions import BadInputError
from streamfit.optim.adam import Adam
from streamfit.optim.base import Optimizer
from streamfit.schedules.base import Schedule
from streamfit.schedules.constant import Constant

#: the Trainer (``_engine/trainer.py``, a room above this one: not imported here)
Trainer = Any

__all__ = ["ChunkResult", "build_chunk_model", "train_chunk", "chunk_unsupported", "ChunkSteps"]

#: ops whose result differs from run to run (Dropout masks): a Scan would not draw what the step path draws
_RANDOM_OPS = {"Dropout", "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli",
               "Multinomial"}
_PREFIX = "sfc_"  # the outer graph's own names
_EVAL_PREFIX = "sfe_"  # the spliced predict graph's intermediate names


@dataclass(frozen=True)
class ChunkResult:
    """What a chunk of steps gave: each row's output before its step's update, each step's loss."""

    #: (n, *output tail): row i's model output from the step that trained it, before that step's update
    outputs: np.ndarray
    #: (steps,) float64: each step's mean loss (before its update; the non-finite value for a skipped step)
    losses: np.ndarray
    #: rows per step (the last step may have fewer)
    batch_size: int
    #: index (in steps) of the first non-finite step of the chunk, or None
    nonfinite: int | None
    #: steps applied (``len(losses)`` minus the skipped ones)
    applied: int
    #: True when the chunk's full steps ran as one Scan; False when they ran one step per session run
    scanned: bool

    @property
    def nonfinite_row(self) -> int | None:
        """The first row of the first non-finite step, or None."""
        return None if self.nonfinite is None else self.nonfinite * self.batch_size


def _vi(name: str, like: onnx.ValueInfoProto | None, elem: int | None = None,
        shape: list[Any] | None = None) -> onnx.ValueInfoProto:
    if like is not None and elem is None:
        elem = like.type.tensor_type.elem_type
    assert elem is not None
    return helper.make_tensor_value_info(name, elem, shape)


def _splice_eval(body: onnx.GraphProto, eval_model: ModelProto, kept: set[str], output: str) -> str:
    """Add ``eval_model``'s nodes to ``body`` (its inputs read by name, every other name prefixed); return the
    name of its output in the body."""
    graph = eval_model.graph
    keep = {i.name for i in graph.input} & kept

    def rename(name: str) -> str:
        return name if not name or name in keep else _EVAL_PREFIX + name

    for init in graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename(init.name)
        body.initializer.append(copy)
    for node in graph.node:
        copy_node = onnx.NodeProto()
        copy_node.CopyFrom(node)
        copy_node.input[:] = [rename(n) for n in node.input]
        copy_node.output[:] = [rename(n) for n in node.output]
        if copy_node.name:
            copy_node.name = _EVAL_PREFIX + copy_node.name
        body.node.append(copy_node)
    return rename(output)


def build_chunk_model(step: ModelProto, state: list[str], scanned: list[str], per_step: list[str],
                      output: str, eval_model: ModelProto | None = None, lift_nodes: bool = True) -> ModelProto:
    """The chunk graph: a ``Scan`` whose body is ``step`` (the fused step graph).

    ``state`` are the carried tensors (``step`` reads ``s`` and writes ``Names.new(s)``), ``scanned`` the per-row
    inputs (given as [steps, rows, ...]), ``per_step`` the per-step values (scalars, host tensors; given as [steps, ...]); every other input of
    ``step`` is read from the outer graph under its own name.  Outputs: ``sfc_out_<s>`` (the final state),
    ``sfc_losses`` [steps], ``sfc_y`` [steps, rows, ...] (``eval_model``'s output when given, else ``output``) and
    ``sfc_check`` (the sum of the final state: finite when all of it is).  With ``lift_nodes``, what does not
    depend on the carried state runs outside the loop (:mod:`~streamfit._engine.steps.scan_lift`).
    """
    inputs = {i.name: i for i in step.graph.input}
    missing = [n for n in state + scanned + per_step if n not in inputs]
    if missing:
        raise ValueError(f"the step graph has no inputs {missing}")
    body = onnx.GraphProto()
    body.CopyFrom(step.graph)
    body.name = "streamfit_chunk_step"
    news = [Names.new(s) for s in state]
    outs = {o.name: o for o in step.graph.output}
    y_out = output
    if eval_model is not None:
        known = set(inputs) | {o for node in body.node for o in node.output}  # weights may be made in the body
        y_out = _splice_eval(body, eval_model, known, eval_model.graph.output[0].name)
    del body.output[:]
    body.output.extend([_vi(n, inputs[s], shape=_dims(inputs[s])) for n, s in zip(news, state)])
    body.output.extend([_vi(Names.loss, outs[Names.loss], shape=[]),
                        _vi(y_out, outs[output], shape=_dims(outs[output]))])
    del body.input[:]
    body.input.extend([inputs[n] for n in state + scanned + per_step])
    body.ClearField("value_info")
    outer_refs = [inputs[n] for n in inputs if n not in set(state + scanned + per_step)]
    model = helper.make_model(body, opset_imports=list(step.opset_import), ir_version=step.ir_version)
    prune(model)  # the per-step check outputs are gone: their nodes too
    # drop what the pruned nodes no longer read
    used = {n for node in model.graph.node for n in node.input}
    kept_inits = [i for i in model.graph.initializer if i.name in used or i.name in {o.name for o in body.output}]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept_inits)
    outer_refs = [i for i in outer_refs if i.name in used]
    body = model.graph
    x_names = {n: _PREFIX + "x_" + n for n in scanned + per_step}
    lifted = Lifted()
    if lift_nodes:  # what does not depend on the state runs once per chunk, outside the loop
        lifted, outer_refs = _lift_body(body, list(step.opset_import), state, outer_refs, x_names, y_out)

    graph = _outer_graph(body, state, scanned + per_step, inputs, outs, output, outer_refs, x_names, lifted)
    return helper.make_model(graph, opset_imports=list(step.opset_import), ir_version=step.ir_version)


def _outer_graph(body: onnx.GraphProto, state: list[str], scanned: list[str], inputs: dict[str, onnx.ValueInfoProto],
                 outs: dict[str, onnx.ValueInfoProto], output: str, outer_refs: list[onnx.ValueInfoProto],
                 x_names: dict[str, str], lifted: Lifted) -> onnx.GraphProto:
    """The chunk graph around the Scan of ``body``: the lifted nodes before and after it, the final check."""
    outer_in: list[onnx.ValueInfoProto] = []
    for n in state:
        outer_in.append(_vi(_PREFIX + "in_" + n, inputs[n], shape=_dims(inputs[n])))
    for n in scanned:
        dims = _dims(inputs[n])
        outer_in.append(_vi(_PREFIX + "x_" + n, inputs[n], shape=None if dims is None else ["S"] + dims))
    outer_in += outer_refs
    scan_in = [_PREFIX + "in_" + n for n in state] + [x_names[n] for n in scanned if n not in lifted.unused]
    scan_in += [outer for _, outer in lifted.scanned]
    losses = _PREFIX + "losses"
    scan_out = [_PREFIX + "out_" + n for n in state] + ([losses] if lifted.losses is None else [])
    scan_out += [_PREFIX + "y"] + [outer for _, outer in lifted.outputs]
    nodes = list(lifted.before)
    nodes.append(helper.make_node("Scan", scan_in, scan_out, num_scan_inputs=len(scan_in) - len(state), body=body,
                                  name="sfc_scan"))
    nodes += lifted.after
    if lifted.losses is not None:
        nodes.append(helper.make_node("Identity", [lifted.losses], [losses]))
    elem = outs[Names.loss].type.tensor_type.elem_type
    sums = []
    for n in state:
        sums.append(_PREFIX + "sum_" + n)
        nodes.append(helper.make_node("ReduceSum", [_PREFIX + "out_" + n], [sums[-1]], keepdims=0))
    nodes.append(helper.make_node("Sum", sums, [_PREFIX + "check"]) if len(sums) > 1
                 else helper.make_node("Identity", sums, [_PREFIX + "check"]))
    outer_out = [_vi(_PREFIX + "out_" + n, inputs[n], shape=_dims(inputs[n])) for n in state]
    outer_out += [helper.make_tensor_value_info(_PREFIX + "losses", elem, ["S"]),
                  _vi(_PREFIX + "y", outs[output], shape=None),
                  helper.make_tensor_value_info(_PREFIX + "check", elem, [])]
    graph = helper.make_graph(nodes, "streamfit_chunk", outer_in, outer_out, initializer=lifted.initializers)
    return graph


def _lift_body(body: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto], state: list[str],
               outer_refs: list[onnx.ValueInfoProto], x_names: dict[str, str],
               y_out: str) -> tuple[Lifted, list[onnx.ValueInfoProto]]:
    """:func:`~streamfit._engine.steps.scan_lift.lift` on ``body``, its ports and initializers updated; the outer
    references still read."""
    lifted = lift(body, opsets, state, outer_refs, Names.loss, x_names, {y_out: _PREFIX + "y"})
    kept_in = [i for i in body.input if i.name not in lifted.unused]
    del body.input[:]
    body.input.extend(kept_in + [lifted.types[n] for n, _ in lifted.scanned])
    if lifted.losses is not None:
        kept_out = [o for o in body.output if o.name != Names.loss]
        del body.output[:]
        body.output.extend(kept_out)
    body.output.extend(lifted.types[n] for n, _ in lifted.outputs)
    used = {n for node in body.node for n in node.input} | {o.name for o in body.output}
    kept_inits = [i for i in body.initializer if i.name in used]
    del body.initializer[:]
    body.initializer.extend(kept_inits)
    return lifted, [i for i in outer_refs if i.name in used or i.name in _lifted_reads(lifted)]


def _lifted_reads(lifted: Lifted) -> set[str]:
    """The outer names the lifted nodes read."""
    return {i for n in lifted.before + lifted.after for i in n.input}


def _dims(vi: onnx.ValueInfoProto) -> list[Any] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def chunk_unsupported(trainer: Trainer) -> str | None:
    """Why ``trainer``'s steps cannot run as a Scan (None: they can)."""
    if trainer.step_kind != "fused":
        return f"the {trainer.step_kind!r} step strategy runs several graphs per step"
    if trainer.device.kind != "cpu":
        return "chunks run on CPU only for now"
    if type(trainer.schedule)._update is not Schedule._update:
        return f"the {type(trainer.schedule).__name__} schedule's rate depends on each step's loss"
    return None


#: which chunk graph a chunk runs: (large?, light?, the host tensors given per step, rows per step (0: any above
#: one), row weights given once (the same for every step: :func:`uniform_row_weights`)?)
ChunkKey = tuple[bool, bool, tuple[str, ...], int, bool]


class ChunkSteps:
    """The chunk graphs of one trainer (one per step graph: small and large batches) and their sessions."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._built: dict[ChunkKey, tuple[Any, list[str], list[str], list[str]] | None] = {}
        #: the keys built with the lean body of a hashed linear model (steps/scan_lean.py)
        self._lean: set[ChunkKey] = set()
        #: the bound buffers of the last chunk shapes run (:meth:`_binding`)
        self._bound: OrderedDict[tuple[Any, ...], _Bound] = OrderedDict()
        #: small-batch bodies carry one parameter vector where the rule allows (steps/scan_flat.py)
        self.flat = True
        #: a small body's intermediates written to scan outputs (steps/scan_expose.py)
        self.expose = True
        #: the parameter vector's layout of each chunk graph that carries one
        self.layouts: dict[ChunkKey, FlatLayout] = {}
        #: the chunk graphs built, by ``large`` (for tests and ``step_graphs``)
        self.models: dict[ChunkKey, ModelProto] = {}
        self.why_not: str | None = None

    def _kind(self, rows: int) -> tuple[bool, bool]:
        """Which step graph ``rows`` rows per step run (large?) and on which options (light?), as
        :class:`~streamfit._engine.steps.fused.FusedStep` chooses them."""
        fused = self.trainer._strategy
        large = rows >= fused.large_batch_rows  # type: ignore[union-attr]
        light = not large or (fused._light_large_batches  # type: ignore[union-attr]
                              and rows * fused._weights_size < fused.parallel_min_work)  # type: ignore[union-attr]
        return large, light

    def _key(self, rows: int, host_steps: tuple[str, ...], uniform: bool = False) -> ChunkKey:
        """The chunk graph ``rows`` rows per step run: (large?, light?, the host tensors given per step, rows, row
        weights given once?): a linear model's lean step is written for its number of rows; other bodies serve any
        number above one (0).  Only a linear model's lean step takes its row weights once (``uniform``: its body is
        a few nodes, of which a scanned input costs as much as one)."""
        uniform = uniform and self.trainer._dense is not None
        return self._kind(rows) + (host_steps, rows if rows == 1 or self.trainer._dense is not None else 0, uniform)

    def _build(self, key: ChunkKey) -> tuple[Any, list[str], list[str], list[str]] | None:
        if key in self._built:
            return self._built[key]
        large, light, host_steps, rows, uniform = key
        one_row = rows == 1
        tr = self.trainer
        strategy = tr._strategy
        step = strategy.large_graph() if large else strategy.model  # type: ignore[union-attr]
        if any(n.op_type in _RANDOM_OPS for n in step.graph.node):
            self.why_not = "the step graph draws random numbers (Dropout): a Scan would draw others"
            self._built[key] = None
            return None
        state = [n for n in tr.params.names]
        scanned: list[str] = []
        plan = lean_plan(tr) if not large and not host_steps else None
        flat = None
        if not large and self.flat and plan is None:  # a linear model's or an MLP's lean step, else the generic one
            flat = ((dense_step_graph(tr, rows) if tr._dense is not None else None) or mlp_step_graph(tr, rows)
                    or flat_step_graph(tr))
        if flat is not None:  # one parameter vector: the optimizer's update emitted once
            step, layout = flat
            self.layouts[key] = layout
            state = layout.state_names() + list(tr.prepared.buffers)
        if tr.tables is not None:  # the chunk's blocks of table rows, carried; their local ids, scanned
            step = with_tables(step, tr.tables)
            extra_state, scanned = table_names(tr.tables)
            state += extra_state
        names = {i.name for i in step.graph.input}
        scanned += [spec.name for spec in tr.prepared.inputs if spec.name in names]
        scanned += [Names.target] + ([] if uniform else [Names.loss_weight, Names.grad_weight])  # else outer inputs
        per_step = [n for n in (Names.scalar(s) for s in tr.optimizer.scalar_names) if n in names]
        if Names.decay in names:
            per_step.append(Names.decay)
        if fused_adam.STEP in names:
            per_step.append(fused_adam.STEP)
        per_step += [h for h in host_steps if h in names]
        eval_model = None
        if tr.prepared.train_differs:
            eval_model = tr.prepared.predict_model(list(tr.prepared.weights) + list(tr.prepared.buffers)
                                                   + list(tr.prepared.host))
        if plan is not None:
            self._lean.add(key)
            model = lean_chunk_model(tr, plan, state, scanned, per_step, one_row)
        else:
            model = build_chunk_model(step, state, scanned, per_step, tr.prepared.output_name, eval_model)
        if self.expose:  # a body of few small values: none allocated per iteration
            model, _ = expose_body_values(model)
        options = tr.small_batch_options if light else tr.options
        session = make_session(model.SerializeToString(), options, tr.device, tr.dtype)
        refs = [i.name for i in model.graph.input][len(state) + len(scanned) + len(per_step):]
        self.models[key] = model
        built = (session, scanned, per_step, refs)
        self._built[key] = built
        return built

    def available(self, batch_size: int, host_steps: tuple[str, ...] = (), uniform: bool = False) -> bool:
        return self._build(self._key(batch_size, host_steps, uniform)) is not None

    def lean(self, rows: int, host_steps: tuple[str, ...] = ()) -> bool:
        """Whether ``rows`` rows per step run the lean body of a hashed linear model (steps/scan_lean.py)."""
        return self._key(rows, host_steps) in self._lean

    def uniform(self, rows: int, host_steps: tuple[str, ...] = (), uniform: bool = True) -> bool:
        """Whether the chunk graph for ``rows`` rows per step takes its row weights once (``uniform`` asked: they
        are the same for every step) rather than per step."""
        return self._key(rows, host_steps, uniform)[4]

    def names(self, rows: int, host_steps: tuple[str, ...] = (), uniform: bool = False) -> list[str]:
        """The per-step inputs of the chunk graph for ``rows`` rows per step (scalars, then the host tensors
        given per step), in their order."""
        built = self._build(self._key(rows, host_steps, uniform))
        assert built is not None
        return built[2]

    def run(self, feeds: Mapping[str, np.ndarray], steps: int, rows: int, y_tail: tuple[int, ...],
            host_steps: tuple[str, ...] = (), blocks: Mapping[str, np.ndarray] | None = None, uniform: bool = False
            ) -> tuple[np.ndarray, np.ndarray, bool, dict[str, np.ndarray]]:
        """Run ``steps`` steps of ``rows`` rows: ``feeds`` holds each scanned input ([steps, rows, ...]) and
        per-step input ([steps, ...]) by name (the row weights of one step where :meth:`uniform`), ``blocks`` the
        carried blocks of table rows.  Return the per-step losses (float64), the outputs [steps, rows, *tail] (a
        buffer reused by the next chunk of this shape: copy it to keep it), whether all is finite, and the final
        blocks.  The final dense state is in the spare ping-pong set."""
        tr = self.trainer
        key = self._key(rows, host_steps, uniform)
        built = self._build(key)
        assert built is not None
        session, scanned, per_step, refs = built
        if blocks or (key in self.layouts and not self._columns(key)):
            return self._run_unbound(feeds, steps, rows, y_tail, key, blocks)
        bound = self._binding(key, steps, rows, y_tail, feeds)
        for name, buffer in bound.feeds.items():
            np.copyto(buffer, feeds[name], casting="same_kind")
        C.raw_session(session).run_with_iobinding(bound.io[tr.params.current], None)
        losses = bound.losses
        ok = math.isfinite(float(bound.check)) and bool(np.isfinite(losses).all())
        return losses.astype(np.float64), bound.y, ok, {}

    def _columns(self, key: ChunkKey) -> bool:
        """Whether the chunk graph of ``key`` carries the params' columns as they are held (PingPong.columns)."""
        layout = self.layouts.get(key)
        return layout is not None and layout.column and bool(self.trainer.params.column_sets[0])

    def _bind_state(self, io: Any, src: int, columns: bool, dense: list[str]) -> None:
        """Bind the carried state read from ping-pong set ``src`` and written into the other one: the params'
        columns (``columns``) and the values named ``dense``."""
        params = self.trainer.params
        pairs = [(params.column_sets[src], params.column_sets[1 - src])] if columns else []
        pairs.append(({n: params.sets[src][n] for n in dense}, params.sets[1 - src]))
        for live, spare in pairs:
            for name, value in live.items():
                io.bind_ortvalue_input(_PREFIX + "in_" + name, value)
                io.bind_ortvalue_output(_PREFIX + "out_" + name, spare[name])

    def _binding(self, key: ChunkKey, steps: int, rows: int, y_tail: tuple[int, ...],
                 feeds: Mapping[str, np.ndarray]) -> "_Bound":
        """The bound buffers of chunks of ``steps`` steps under ``key`` (made on first use; the few last used kept),
        one IOBinding per ping-pong direction: a chunk's inputs are copied in, nothing is bound per run."""
        held = self._bound.get((key, steps))
        if held is not None:
            self._bound.move_to_end((key, steps))
            return held
        tr = self.trainer
        session, scanned, per_step, refs = self._built[key]  # type: ignore[misc]
        given = scanned + per_step + [n for n in refs if n in feeds]  # the last: row weights given once
        bound = _Bound({n: np.empty(feeds[n].shape, feeds[n].dtype) for n in given},
                       np.empty((steps,), tr.dtype), np.empty((steps, rows) + y_tail, tr.dtype), np.zeros((), tr.dtype),
                       np.ones((rows,), tr.dtype))
        values = {n: C.from_numpy(a, _CPU) for n, a in bound.feeds.items()}
        outs = {n: C.from_numpy(a, _CPU) for n, a in (("losses", bound.losses), ("y", bound.y), ("check", bound.check))}
        ones = C.from_numpy(bound.ones, _CPU)
        bound.keep = [values, outs, ones]
        columns = key in self.layouts  # run() sends a packed parameter vector to _run_unbound
        dense = list(tr.prepared.buffers) if columns else list(tr.params.names)
        ios = []
        for src in (0, 1):
            io = C.io_binding(session)
            for name, value in values.items():
                io.bind_ortvalue_input(name if name in refs else _PREFIX + "x_" + name, value)
            for name in refs:
                if name not in values:
                    io.bind_ortvalue_input(name, ones if name == Names.ones else tr.scalars.values[name])
            self._bind_state(io, src, columns, dense)
            for name, value in outs.items():
                io.bind_ortvalue_output(_PREFIX + name, value)
            ios.append(io)
        bound.io = (ios[0], ios[1])
        self._bound[(key, steps)] = bound
        while len(self._bound) > _BOUND_SHAPES:
            self._bound.popitem(last=False)
        return bound

    def _run_unbound(self, feeds: Mapping[str, np.ndarray], steps: int, rows: int, y_tail: tuple[int, ...],
                     key: ChunkKey, blocks: Mapping[str, np.ndarray] | None
                     ) -> tuple[np.ndarray, np.ndarray, bool, dict[str, np.ndarray]]:
        """:meth:`run` binding everything for this run: a chunk with table blocks (new ones each chunk), or a
        parameter vector packed from the weights (their new values unpacked after)."""
        tr = self.trainer
        session, scanned, per_step, refs = self._built[key]  # type: ignore[misc]
        io = C.io_binding(session)
        keep = []
        for name in scanned + per_step:
            value = C.from_numpy(feeds[name], _CPU)
            keep.append(value)
            io.bind_ortvalue_input(_PREFIX + "x_" + name, value)
        new_blocks: dict[str, np.ndarray] = {}
        for name, array in (blocks or {}).items():
            new_blocks[name] = np.empty_like(array)
            for kind, a in (("in_", array), ("out_", new_blocks[name])):
                value = C.from_numpy(a, _CPU)
                keep.append(value)
                (io.bind_ortvalue_input if kind == "in_" else io.bind_ortvalue_output)(_PREFIX + kind + name, value)
        host = tr.scalars.values
        for name in refs:
            if name in feeds:  # a row weight given once
                array = np.ascontiguousarray(feeds[name])
                value = C.from_numpy(array, _CPU)
                keep += [array, value]
                io.bind_ortvalue_input(name, value)
            elif name == Names.ones:
                ones = np.ones((rows,), tr.dtype)
                keep.append(ones)
                value = C.from_numpy(ones, _CPU)
                keep.append(value)
                io.bind_ortvalue_input(name, value)
            else:
                io.bind_ortvalue_input(name, host[name])
        live, spare = tr.params.live(), tr.params.spare()
        layout = self.layouts.get(key)
        flat_out: dict[str, np.ndarray] = {}
        dense = list(tr.params.names)
        columns = self._columns(key)
        if columns:  # the params hold them as columns already (PingPong.columns): bound as they are
            dense = list(tr.prepared.buffers)
        elif layout is not None:  # the weights and their slots packed into one vector each
            packed = layout.pack({n: live[n].numpy() for n in dense}, tr.dtype)
            for name, array in packed.items():
                flat_out[name] = np.empty_like(array)
                for kind, a in (("in_", array), ("out_", flat_out[name])):
                    value = C.from_numpy(a, _CPU)
                    keep.append(value)
                    (io.bind_ortvalue_input if kind == "in_" else io.bind_ortvalue_output)(_PREFIX + kind + name, value)
            dense = list(tr.prepared.buffers)
        self._bind_state(io, tr.params.current, columns, dense)
        losses = np.empty((steps,), tr.dtype)
        y = np.empty((steps, rows) + y_tail, tr.dtype)
        check = np.zeros((), tr.dtype)
        outs = [C.from_numpy(a, _CPU) for a in (losses, y, check)]
        for name, value in zip(("losses", "y", "check"), outs):
            io.bind_ortvalue_output(_PREFIX + name, value)
        C.raw_session(session).run_with_iobinding(io, None)
        ok = math.isfinite(float(check)) and bool(np.isfinite(losses).all())
        if ok and layout is not None and not columns:  # the new values into the spare set, per weight
            for name, array in layout.unpack(flat_out).items():
                np.copyto(spare[name].numpy(), array)
        return losses.astype(np.float64), y, ok, new_blocks


#: the chunk shapes (graph, steps) whose bound buffers a ChunkSteps keeps: a stream's chunks come in a few sizes
_BOUND_SHAPES = 4
_CPU = C.cpu_device()


@dataclass(eq=False)
class _Bound:
    """A chunk shape's buffers, bound once: the inputs copied in per run, the outputs read after it."""

    feeds: dict[str, np.ndarray]
    losses: np.ndarray
    y: np.ndarray
    check: np.ndarray
    ones: np.ndarray
    io: tuple[Any, Any] = (None, None)
    #: the OrtValues over these arrays (alive as long as the bindings)
    keep: list[Any] = field(default_factory=list)


def _per_step_rows(factors: np.ndarray | float, sw: np.ndarray | None, steps: int, rows: int,
                   shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Per-row weights of ``steps`` steps as the step path's :meth:`Staging.load` writes them: ``factor`` per
    step (one float: the same for every step), times the sample weights when given (computed in the dtype the
    step path computes in)."""
    out = np.empty((steps,) + shape, dtype)
    if sw is None:
        if isinstance(factors, float):
            out.fill(factors)  # cast to dtype as astype casts it
        else:
            out[...] = factors.astype(dtype).reshape((steps,) + (1,) * len(shape))
        return out
    if isinstance(factors, float):
        factors = np.full(steps, factors)
    kind = np.float32 if sw.dtype == np.float32 else np.float64  # a Python float is weak against float32
    w = sw.reshape((steps,) + shape)
    np.multiply(w, factors.astype(kind).reshape((steps,) + (1,) * len(shape)), out=out, casting="same_kind")
    return out


def train_chunk(trainer: Trainer, X: Any, y: Any, sample_weight: Any = None, batch_size: int = 1,
                host_steps: Mapping[str, np.ndarray] | None = None) -> ChunkResult:
    """Train ``trainer`` on ``ceil(n / batch_size)`` steps over the ``n`` rows of ``X`` in order, the full steps in one
    session run, and return each row's output before its step and each step's loss (:class:`ChunkResult`).

    The result (weights, optimizer state, running statistics, schedule, counters, outputs) is the one of
    ``trainer.step`` called on each step's rows in turn; where the Scan cannot be used
    (:func:`chunk_unsupported`) the chunk runs exactly that way.

    ``host_steps`` gives host tensors (``Trainer(host=...)``) a value per step, [steps, *shape] each: step ``k``
    reads ``host_steps[name][k]`` as if it had been written into ``trainer.host_arrays[name]`` before it (a
    ready-made model's running input statistics after the rows up to that step).  The host arrays then hold the
    last step's values.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    tr = trainer
    arrays = _arrays(tr, X)
    n = tr._signature.check(arrays)
    y = np.asarray(y)
    sw = None if sample_weight is None else tr._sample_weights(sample_weight, n)
    steps, rest = divmod(n, batch_size)
    host = _host_steps(tr, host_steps, steps + bool(rest))
    names = tuple(host)
    per_run = _steps_per_run(tr, arrays, batch_size)
    if steps > per_run:  # the tables' block stays small: several runs of at most per_run steps
        return _in_pieces(tr, arrays, y, sw, n, batch_size, host, per_run)
    if tr._strategy is None:
        tr._ensure_strategy(arrays)
    why = chunk_unsupported(tr)
    chunks: ChunkSteps | None = tr.__dict__.get("_chunk_steps")
    uniform = False
    if why is None and steps >= 2:
        if chunks is None:
            chunks = tr.__dict__["_chunk_steps"] = ChunkSteps(tr)
        uniform = chunks.uniform(batch_size, names, uniform_row_weights(tr, sw))
        if not chunks.available(batch_size, names, uniform):
            why = chunks.why_not
    if why is not None or steps < 2:
        return _step_by_step(tr, arrays, y, sw, n, batch_size, 0, host, scanned=False)
    assert chunks is not None
    m = steps * batch_size
    y_tail = tuple(tr._y_tail or ())
    feeds = _scan_feeds(tr, chunks.names(batch_size, names, uniform), arrays, y, sw, n, steps, batch_size, host,
                        uniform)
    blocks = None
    if tr.tables is not None:
        try:
            blocks = TableBlocks.gather(tr.tables, arrays, steps, batch_size, chunks.lean(batch_size, names))
        except BadInputError:  # an id outside its table: the steps before it are trained, then the step path raises
            return _step_by_step(tr, arrays, y, sw, n, batch_size, 0, host, scanned=False)
        feeds.update(blocks.scanned)
    losses, out, ok, new_blocks = chunks.run(feeds, steps, batch_size, y_tail, names,
                                             None if blocks is None else blocks.carried, uniform)
    if not ok:  # replay one step per run: the step path's own answer (on_nonfinite, counters)
        return _step_by_step(tr, arrays, y, sw, n, batch_size, 0, host, scanned=False)
    if blocks is not None:
        blocks.write_back(tr.tables, new_blocks)
    tr.params.swap()
    tr.n_steps += steps
    tr.schedule.advance(steps)  # its rate does not depend on the losses (chunk_unsupported)
    tr.last_loss = float(losses[-1])
    outputs = np.empty((n,) + y_tail, tr.dtype)
    outputs[:m] = out.reshape((m,) + y_tail)
    if not rest:
        for name, values in host.items():
            tr.scalars.arrays[name][...] = values[-1]
        return ChunkResult(outputs, losses, batch_size, None, steps, True)
    tail = _step_by_step(tr, tuple(a[m:] for a in arrays), y[m:], None if sw is None else sw[m:], rest,
                         batch_size, steps, {k: v[steps:] for k, v in host.items()}, scanned=True)
    outputs[m:] = tail.outputs
    return ChunkResult(outputs, np.concatenate([losses, tail.losses]), batch_size, tail.nonfinite,
                       steps + tail.applied, True)


def uniform_row_weights(tr: Trainer, sw: np.ndarray | None) -> bool:
    """Whether every step of a chunk weighs its rows alike: no sample weights, and a constant rate where the
    rate is folded into the gradient's row weights."""
    return sw is None and (not tr._lr_in_grad_weights or type(tr.schedule) is Constant)


def _scan_feeds(tr: Trainer, per_step: list[str], arrays: tuple[np.ndarray, ...], y: np.ndarray,
                sw: np.ndarray | None, n: int, steps: int, batch_size: int, host: Mapping[str, np.ndarray],
                uniform: bool = False) -> dict[str, np.ndarray]:
    """The Scan's inputs for the chunk's ``steps`` full steps, by name: the per-step values (``per_step``), each
    model input, the targets and the two row weights, as [steps, batch_size, ...] arrays (the row weights as
    one step's, ``uniform``: the same for every step)."""
    T = tr._targets(y, n)
    if tr._integer_labels:
        T = T.astype(np.int64)
    m = steps * batch_size
    feeds = _per_step_inputs(tr, per_step, steps, host)
    feeds.update((spec.name, np.ascontiguousarray(a[:m], dtype=spec.dtype).reshape((steps, batch_size) + a.shape[1:]))
                 for spec, a in zip(tr.model_inputs, arrays))
    t_dtype = np.int64 if tr.loss.integer_labels else tr.dtype
    feeds[Names.target] = np.ascontiguousarray(T[:m], dtype=t_dtype).reshape((steps, batch_size) + T.shape[1:])
    feeds[Names.loss_weight], feeds[Names.grad_weight] = _row_weights(
        tr, None if sw is None else sw[:m], steps, batch_size, tuple(tr._y_tail or ()), feeds.pop("lrs"), uniform)
    return feeds


#: a chunk with row-sparse tables runs at most this many id positions per Scan (its block of distinct rows,
#: copied by each iteration, stays at most this many rows)
BLOCK_POSITIONS = 4096


def _steps_per_run(tr: Trainer, arrays: tuple[np.ndarray, ...], batch_size: int) -> int:
    if tr.tables is None or not arrays or len(arrays[0]) == 0:
        return 1 << 62
    per_row = sum(int(np.prod(arrays[i].shape[1:], dtype=np.int64)) for slots in tr.tables._slots for i, _ in slots)
    per_step = max(1, per_row * batch_size)
    if batch_size > 1:  # a step of many rows costs more than its copy of the block: up to 4x the ids, 32 steps a run
        return max(2, BLOCK_POSITIONS // per_step, min(32, 4 * BLOCK_POSITIONS // per_step))
    return max(2, BLOCK_POSITIONS // per_step)


def _in_pieces(tr: Trainer, arrays: tuple[np.ndarray, ...], y: np.ndarray, sw: np.ndarray | None, n: int,
               batch_size: int, host: Mapping[str, np.ndarray], per_run: int) -> ChunkResult:
    """:func:`train_chunk` as consecutive chunks of ``per_run`` steps (the last with the short step)."""
    results = []
    rows = per_run * batch_size
    for k, start in enumerate(range(0, n, rows)):
        sl = slice(start, min(start + rows, n))
        X = arrays[0][sl] if tr._single else {s.name: a[sl] for s, a in zip(tr.model_inputs, arrays)}
        part = train_chunk(tr, X, y[sl], None if sw is None else sw[sl], batch_size,
                           {name: v[k * per_run:(k + 1) * per_run] for name, v in host.items()} or None)
        results.append(part)
        if part.nonfinite is not None and tr.on_nonfinite == "raise":
            break
    first = next((k * per_run + r.nonfinite for k, r in enumerate(results) if r.nonfinite is not None), None)
    return ChunkResult(np.concatenate([r.outputs for r in results]), np.concatenate([r.losses for r in results]),
                       batch_size, first, sum(r.applied for r in results), all(r.scanned for r in results))


def _host_steps(tr: Trainer, given: Mapping[str, np.ndarray] | None, steps: int) -> dict[str, np.ndarray]:
    """The per-step host tensor values, checked against the trainer's host tensors."""
    out: dict[str, np.ndarray] = {}
    arrays = tr.host_arrays
    for name, values in (given or {}).items():
        if name not in arrays:
            raise KeyError(f"{name!r} is not a host tensor of this trainer; it has {sorted(arrays)}")
        values = np.asarray(values, arrays[name].dtype)
        if values.shape != (steps,) + arrays[name].shape:
            raise ValueError(f"host_steps[{name!r}] has shape {values.shape}, expected {(steps,) + arrays[name].shape}"
                             f" (one value per step)")
        out[name] = np.ascontiguousarray(values)
    return out


def _per_step_inputs(tr: Trainer, names: list[str], steps: int, host: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
    """The Scan's per-step inputs (by name, in ``names`` order) as the step path would feed each step, and
    ``"lrs"``: the steps' learning rates (the schedule's rate does not depend on the losses: chunk_unsupported)."""
    lrs = tr.schedule.rates(steps) * tr.lr_scale
    columns = {Names.scalar(s): i for i, s in enumerate(tr.optimizer.scalar_names)}
    # the rate itself needs no table where the rule feeds it as it is (Adam's kernel body reads only it)
    as_is = Names.scalar("lr") if _feeds_lr_as_is(tr.optimizer) else None
    table = (tr.optimizer.scalars_of_steps(lrs, tr.n_steps) if any(n in columns and n != as_is for n in names)
             else None)
    out: dict[str, np.ndarray] = {}
    for name in names:
        if name == as_is:
            out[name] = lrs.astype(tr.dtype)
        elif name == Names.decay:
            out[name] = (1.0 - lrs * tr._l2).astype(tr.dtype)
        elif name == fused_adam.STEP:
            out[name] = fused_adam.step_numbers(tr.n_steps, steps).astype(tr.dtype)
        elif name in host:
            out[name] = host[name][:steps]
        else:
            assert table is not None
            out[name] = table[:, columns[name]].astype(tr.dtype)
    out["lrs"] = lrs
    return out


def _feeds_lr_as_is(opt: Any) -> bool:
    """Whether ``opt``'s scalar ``lr`` is the step's rate unchanged (the base rule's and Adam's :meth:`scalars`)."""
    scalars = type(opt).scalars
    return "lr" in opt.scalar_names and (scalars is Optimizer.scalars or scalars is Adam.scalars)


def _row_weights(tr: Trainer, sw: np.ndarray | None, steps: int, batch_size: int, y_tail: tuple[int, ...],
                 lrs: np.ndarray, uniform: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The per-row loss and gradient weights of each step, as :meth:`Staging.load` writes them (``uniform``: the
    one step's that every step has, :func:`uniform_row_weights`)."""
    gfac: np.ndarray | float
    if tr._lr_in_grad_weights:
        gfac = float(lrs[0] / batch_size) if uniform else lrs / batch_size  # the same float64 operation
    else:
        gfac = 1.0 if tr._summed_gradient else 1.0 / batch_size
    lfac = float(tr._strategy.cache.loss_factor / batch_size)  # type: ignore[union-attr]
    shape = sample_weight_shape(batch_size, len(y_tail) + 1)
    if uniform:
        assert isinstance(gfac, float)
        return np.full(shape, lfac, tr.dtype), np.full(shape, gfac, tr.dtype)
    return (_per_step_rows(lfac, sw, steps, batch_size, shape, tr.dtype),
            _per_step_rows(gfac, sw, steps, batch_size, shape, tr.dtype))


def _arrays(tr: Trainer, X: Any) -> tuple[np.ndarray, ...]:
    """``X`` as one array per model input (model order), as :meth:`Trainer.step` reads it."""
    if type(X) is np.ndarray and tr._single:
        return (X,)
    if tr._columns is not None and tr._columns.takes(X):
        X = tr._columns.arrays(X)
    return tuple(tr._signature.arrays(X))


def _step_by_step(tr: Trainer, arrays: tuple[np.ndarray, ...], y: np.ndarray, sw: np.ndarray | None, n: int,
                  batch_size: int, first: int, host: Mapping[str, np.ndarray], scanned: bool) -> ChunkResult:
    """The chunk as ``trainer.step`` calls, one per step (``first``: the index of the first of these steps)."""
    y_tail: tuple[int, ...] = ()
    outputs: np.ndarray | None = None
    losses = []
    nonfinite = None
    applied = 0
    for k, start in enumerate(range(0, n, batch_size)):
        sl = slice(start, min(start + batch_size, n))
        before = tr.n_skipped
        for name, values in host.items():
            tr.scalars.arrays[name][...] = values[k]
        loss = tr.step(arrays[0][sl] if tr._single else {s.name: a[sl] for s, a in zip(tr.model_inputs, arrays)}, y[sl],
                       None if sw is None else sw[sl])
        if tr.n_skipped != before:
            nonfinite = first + k if nonfinite is None else nonfinite
        else:
            applied += 1
        out = tr.last_output
        if outputs is None:
            y_tail = tuple(out.shape[1:])
            outputs = np.empty((n,) + y_tail, tr.dtype)
        outputs[sl] = out.reshape((sl.stop - sl.start,) + y_tail)
        losses.append(loss)
    if outputs is None:
        outputs = np.empty((0,), tr.dtype)
    return ChunkResult(outputs, np.array(losses, np.float64), batch_size, nonfinite, applied, scanned)
