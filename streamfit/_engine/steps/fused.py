"""The fused step: forward, loss, backward and update in one session run per batch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import onnxruntime as ort
from onnx import ModelProto

from streamfit._engine.common import ort_private as C
from streamfit._engine.common.names import Names
from streamfit._engine.gradient.graphs import GradientGraphs
from streamfit._engine.prepare.model import PreparedModel
from streamfit._engine.runtime.buffers import HostScalars, PingPong
from streamfit._engine.runtime.device import PARALLEL_MIN_WORK, Device, make_session
from streamfit._engine.runtime.staging import Staging, StagingCache
from streamfit._engine.steps.check_plan import CheckPlan
from streamfit._engine.steps.scan_dense import ONES, row_loss
from streamfit._engine.steps.step_graphs import build_fused, folds_lr_into_gradients
from streamfit.exceptions import ModelError
from streamfit.losses.base import Loss
from streamfit.optim.base import Optimizer
from streamfit.penalties import Penalty

__all__ = ["FusedStep", "FusedRun", "MagnitudeBound"]


@dataclass(frozen=True)
class FusedRun:
    """What the fused step runs for one batch shape (``staging.extra["run"]``), bound once.

    Each pair is indexed by the weight set the run reads (``params.current``): 0 writes set 1, 1 writes 0.
    """

    #: the onnxruntime session (its C object, run with ``run_with_iobinding``)
    session: Any
    #: the IOBinding reading weight set 0, and the one reading set 1
    io: tuple[Any, Any]
    #: per set read: the 0-d arrays that must all be finite -- the graph's check outputs, then views of the
    #: new values of the single-element weights the graph leaves to the host (``CheckPlan.host``)
    checks: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]
    #: the small-batch graph's sums of squares of the bounded Gemms' operands (``sf_bound0_*``, ``sf_bound1_*``)
    #: for :class:`MagnitudeBound`; None when this graph bounds nothing
    bound_sums: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]] | None = None
    #: the large-batch graph checks the bounded weights exactly: after its run the bound is recomputed
    forget_bound: bool = False
    #: the step's loss computed on the host after the run, for a graph without a loss output (the lean row step)
    loss_of: Callable[[], float] | None = None
    #: per set read: whether the new values are all finite, checked exactly, when a check is not finite but
    #: may be on finite values (the lean row step's dot product can overflow); None: the checks are exact
    recheck: Callable[[int], bool] | None = None


class FusedStep:
    """Runs the fused graph through two IOBindings per batch shape (A->B and B->A), bound once."""

    name = "fused"
    #: Batches of at least this many rows use the graph built for large batches.
    large_batch_rows = 64
    #: With ``light_large_batches``, a large batch runs on the light (one-thread) options unless rows x
    #: trained weights reach this (:data:`~streamfit._engine.runtime.device.PARALLEL_MIN_WORK`).
    parallel_min_work = PARALLEL_MIN_WORK

    def __init__(self, pm: PreparedModel, graphs: GradientGraphs | None, loss: Loss, optimizer: Optimizer,
                 penalty: Penalty | None, device: Device, options: ort.SessionOptions, y_rank: int,
                 params: PingPong, scalars: HostScalars,
                 small_batch_options: ort.SessionOptions | None = None, light_large_batches: bool = False,
                 sparse: Any = None, compiled: Mapping[str, ModelProto] | None = None,
                 row_step: ModelProto | None = None, batch_step: ModelProto | None = None) -> None:
        self.pm = pm
        #: a one-row step of its own (a linear model's lean step, steps/scan_dense.py), reading and writing the
        #: params' columns; its session is made on the first one-row batch
        self.row_model = row_step
        #: and its step of a small batch (2 rows to fewer than large_batch_rows: the nodes of its chunks' steps)
        self.batch_model = batch_step
        self.loss = loss
        self._row_session: ort.InferenceSession | None = None
        self._batch_session: ort.InferenceSession | None = None
        #: the tables trained row-sparsely (:class:`~streamfit._engine.steps.sparse_tables.SparseTables`), or None
        self.sparse = sparse
        host_checks = device.kind == "cpu"  # the step reads single-element new weights itself
        self.large_model: Any = None  # built with its session on the first large batch
        if compiled is not None:  # a training artifact's graphs ("small"/"large"; one class serves all batches)
            small, large = compiled.get("small"), compiled.get("large")
            either = small if small is not None else large
            if either is None:
                raise ModelError("a training artifact without step graphs (expected 'small' and/or 'large')")
            self.model: ModelProto = either
            self._build_large: Callable[[], ModelProto] = lambda: large if large is not None else either
        else:
            if graphs is None:
                raise ValueError("FusedStep needs the gradient graphs, or the compiled step graphs of an artifact")
            built = graphs
            self.model = build_fused(pm, built, loss, optimizer, penalty, y_rank, host_checks=host_checks)
            self._build_large = lambda: build_fused(pm, built, loss, optimizer, penalty, y_rank, large_batch=True,
                                                    host_checks=host_checks)
        # batches below large_batch_rows may run with their own options (the Trainer gives them one thread)
        self._light_options = small_batch_options or options
        self.session = make_session(self.model.SerializeToString(), self._light_options, device, pm.dtype)
        self._options = options
        self._large_session: ort.InferenceSession | None = None  # built on the first heavy large batch
        self._large_light_session: ort.InferenceSession | None = None  # ... on the first light one
        self._light_large_batches = light_large_batches
        self._weights_size = sum(int(pm.initial[w].size) for w in pm.weights)
        self.device = device
        self.params = params
        self.scalars = scalars
        self._scalar_outputs: dict[str, tuple[Any, np.ndarray]] = {}  # name -> (bound OrtValue, 0-d array)
        self._loss = self._scalar_output(Names.loss)
        self._bound = MagnitudeBound(CheckPlan.of(self.model), params, scalars.arrays.get(Names.decay), pm.dtype)
        #: the grad weights carry the learning rate (plain SGD: the update rides on the gradient GEMMs)
        self.lr_in_grad_weights = folds_lr_into_gradients(optimizer, penalty)
        self.cache = StagingCache(device, self._bindings, loss_factor=loss.loss_factor)

    def large_graph(self) -> ModelProto:
        """The graph large batches run (built on first use: the first large batch, or a caller asking)."""
        if self.large_model is None:
            self.large_model = self._build_large()
        return self.large_model

    def graphs(self) -> dict[str, ModelProto]:
        """The step graphs by role: ``fused`` (small batches), ``fused_large`` and, for a linear model's lean step of
        one row, ``fused_row``."""
        graphs = {"fused": self.model, "fused_large": self.large_graph()}
        if self.row_model is not None:
            graphs["fused_row"] = self.row_model
        if self.batch_model is not None:
            graphs["fused_batch"] = self.batch_model
        return graphs

    def _session_for(self, rows: int) -> ort.InferenceSession:
        if rows < self.large_batch_rows:
            return self.session
        self.large_graph()
        if self._light_large_batches and rows * self._weights_size < self.parallel_min_work:
            if self._large_light_session is None:
                self._large_light_session = make_session(self.large_model.SerializeToString(), self._light_options,
                                                         self.device, self.pm.dtype)
            return self._large_light_session
        if self._large_session is None:
            self._large_session = make_session(self.large_model.SerializeToString(), self._options, self.device,
                                               self.pm.dtype)
        return self._large_session

    def _scalar_output(self, name: str) -> np.ndarray:
        """The 0-d host array a scalar output of the graphs is written to (one per name, bound once)."""
        if name not in self._scalar_outputs:
            array = np.zeros((), self.pm.dtype)
            self._scalar_outputs[name] = (C.from_numpy(array, C.cpu_device()), array)
        return self._scalar_outputs[name][1]

    def _bind_batch(self, io: Any, staging: Staging, inputs: set[str]) -> None:
        """Bind the batch's buffers and the host scalars and tensors that a graph of ``inputs`` reads."""
        for spec, value in zip(self.pm.inputs, staging.x_values):
            if spec.name in inputs:  # an ids input read only by a cut-out table Gather is not one
                io.bind_ortvalue_input(spec.name, value)
        io.bind_ortvalue_input(Names.target, staging.t_value)
        io.bind_ortvalue_input(Names.loss_weight, staging.lw_value)
        io.bind_ortvalue_input(Names.grad_weight, staging.gw_value)
        for name, value in self.scalars.values.items():
            if name in inputs:
                io.bind_ortvalue_input(name, value)

    def _lean_session(self, row: bool) -> ort.InferenceSession:
        """The session of the one-row lean step (``row``) or of the small-batch one, made on first use."""
        if row:
            if self._row_session is None:
                self._row_session = make_session(self.row_model.SerializeToString(), self._light_options,  # type: ignore[union-attr]
                                                 self.device, self.pm.dtype)
            return self._row_session
        if self._batch_session is None:
            self._batch_session = make_session(self.batch_model.SerializeToString(), self._light_options,  # type: ignore[union-attr]
                                               self.device, self.pm.dtype)
        return self._batch_session

    def _lean_bindings(self, staging: Staging) -> dict[str, Any]:
        """The lean step's bindings (one row, or a small batch): the batch, the host scalars and tensors, the
        params' columns; a batch's loss and its column of 1s."""
        row = staging.n == 1
        session = self._lean_session(row)
        inputs = {i.name for i in session.get_inputs()}
        extra: dict[str, Any] = {}
        if not row:  # kept alive with the staging buffers
            extra["ones"] = self.device.staging((staging.n, 1), self.pm.dtype)
            extra["ones"][1].fill(1)
        dot = session.get_outputs()[[o.name for o in session.get_outputs()].index(Names.check)].shape == [1, 1]
        if dot:  # theta . v (Adam): a [1, 1] output, read through a 0-d view
            if Names.check + "_row" not in self._scalar_outputs:
                array = np.zeros((1, 1), self.pm.dtype)
                self._scalar_outputs[Names.check + "_row"] = (C.from_numpy(array, C.cpu_device()), array.reshape(()))
            check_value, check = self._scalar_outputs[Names.check + "_row"]
        else:
            check = self._scalar_output(Names.check)
            check_value = self._scalar_outputs[Names.check][0]
        bindings = []
        for src, dst in ((0, 1), (1, 0)):
            io = C.io_binding(session)
            self._bind_batch(io, staging, inputs)
            for name, value in self.params.column_sets[src].items():
                io.bind_ortvalue_input(name, value)
                io.bind_ortvalue_output(Names.new(name), self.params.column_sets[dst][name])
            io.bind_ortvalue_output(Names.check, check_value)
            io.bind_ortvalue_output(self.pm.output_name, staging.y_value)
            if not row:
                io.bind_ortvalue_input(ONES, extra["ones"][0])
                io.bind_ortvalue_output(Names.loss, self._scalar_outputs[Names.loss][0])
            bindings.append(io)
        # it checks all it writes; a magnitude bound kept by the small-batch graph is recomputed after it
        run = FusedRun(C.raw_session(session), (bindings[0], bindings[1]), ((check,), (check,)), None,
                       forget_bound=bool(self._bound.weights), loss_of=row_loss(self.loss, staging) if row else None,
                       recheck=self._exact_row_check if dot else None)
        return {"run": run, **extra}

    def _exact_row_check(self, current: int) -> bool:
        """Whether every value the lean row step wrote (reading set ``current``) is finite, checked exactly."""
        return all(bool(np.isfinite(value.numpy()).all()) for value in self.params.column_sets[1 - current].values())

    def _bindings(self, staging: Staging) -> dict[str, Any]:
        if (staging.n == 1 and self.row_model is not None
                or 1 < staging.n < self.large_batch_rows and self.batch_model is not None):
            return self._lean_bindings(staging)
        bindings = []
        session = self._session_for(staging.n)
        extra: dict[str, Any] = {}
        inputs = {i.name for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        scalars = {name: self._scalar_output(name) for name in outputs
                   if name == Names.check or name.startswith((Names.check + "_", Names.bound_in0, Names.bound_in1))}
        scalars[Names.loss] = self._loss
        if self.sparse is not None:  # the blocks of touched table rows, their state and new values
            extra["sparse"] = self.sparse.staged(staging.xs)
        if Names.ones in inputs:
            value, ones = self.device.staging((staging.n,), self.pm.dtype)
            ones.fill(1)
            extra["ones"] = (value, ones)  # kept alive with the staging buffers
        for src, dst in ((0, 1), (1, 0)):
            io = C.io_binding(session)
            self._bind_batch(io, staging, inputs)
            if "sparse" in extra:  # the rows of the id positions, and their gradients
                for name, (value, _) in extra["sparse"].fused_inputs.items():
                    io.bind_ortvalue_input(name, value)
                for name, (value, _) in extra["sparse"].fused_outputs.items():
                    io.bind_ortvalue_output(name, value)
            if "ones" in extra:
                io.bind_ortvalue_input(Names.ones, extra["ones"][0])
            for name in self.params.names:
                io.bind_ortvalue_input(name, self.params.sets[src][name])
                io.bind_ortvalue_output(Names.new(name), self.params.sets[dst][name])
            for name in scalars:
                io.bind_ortvalue_output(name, self._scalar_outputs[name][0])
            io.bind_ortvalue_output(self.pm.output_name, staging.y_value)
            bindings.append(io)
        checks = tuple(a for name, a in scalars.items() if name.startswith(Names.check))
        # per direction (reading set 0 or 1): the check outputs, and 0-d views of the new values of the
        # single-element weights the graph leaves to the step
        host = CheckPlan.of(self.model if session is self.session else self.large_model).host
        per_set = (checks + tuple(_host_view(self.params.sets[1][w]) for w in host),
                   checks + tuple(_host_view(self.params.sets[0][w]) for w in host))
        # the small-batch graph checks some weights by a bound; after a step of the large-batch graph
        # (which checks them exactly) the bound must be recomputed
        small = session is self.session
        sums = None
        if self._bound.weights and small:
            s0, s1 = (tuple(a for name, a in scalars.items() if name.startswith(prefix))
                      for prefix in (Names.bound_in0, Names.bound_in1))
            sums = (s0, s1)
        run = FusedRun(C.raw_session(session), (bindings[0], bindings[1]), per_set, sums,
                       forget_bound=bool(self._bound.weights) and not small)
        return {"run": run, **extra}

    def run(self, staging: Staging) -> tuple[float, bool]:
        """One step on the batch already in ``staging``; swaps the weights only if all is finite."""
        run: FusedRun = staging.extra["run"]
        current = self.params.current
        run.session.run_with_iobinding(run.io[current], None)
        loss = float(self._loss) if run.loss_of is None else run.loss_of()
        ok = math.isfinite(loss)
        for check in run.checks[current]:
            ok = ok and math.isfinite(check)
        if not ok and run.recheck is not None and math.isfinite(loss):
            ok = run.recheck(current)
        if ok:
            if run.forget_bound:
                self._bound.forget()
            elif run.bound_sums is not None:
                s0, s1 = run.bound_sums
                ok = self._bound.accept(sum(map(float, s0)), sum(map(float, s1)))
        if ok and self.sparse is not None:  # the touched rows: updated, and written back if all is finite
            ok = self.sparse.update(staging.extra["sparse"])
        if ok:
            self.params.swap()
        return loss, ok


def _host_view(value: C.OrtValue) -> np.ndarray:
    """A 0-d numpy view of a single-element CPU OrtValue's memory (reads what the last run wrote)."""
    view = value.numpy()
    if view.ctypes.data != value.data_ptr():
        raise RuntimeError("this onnxruntime build copies CPU OrtValues in numpy(); host checks need a view")
    return view.reshape(())


class MagnitudeBound:
    """Proves the new values of large SGD-updated weights finite without reading them (small batches).

    The graph gives ``s0, s1`` (in parts), the sums of squares of the operands of those weights' gradient Gemms;
    every update element is at most ``d = alpha * sqrt(s0 * s1)`` in magnitude.  Keeping ``bound``, an
    upper bound of the weights' magnitude (``decay * bound + d`` after each step, recomputed from the
    values after any write or exactly checked step), the new weights are finite when ``bound`` stays
    below a quarter of the dtype's largest value.  When it does not (a non-finite or huge operand), the
    new weights are checked exactly, so the answer is always the exact one.
    """

    def __init__(self, plan: CheckPlan, params: PingPong, decay: np.ndarray | None, dtype: np.dtype) -> None:
        self.weights: list[str] = list(plan.bounded)
        self.alpha = plan.alpha
        self.params = params
        self._decay = decay
        self.limit = float(np.finfo(dtype).max) / 4
        self.bound: float | None = None  # None: not known for the live values
        self._generation = -1
        self.exact_checks = 0  # steps the bound could not prove finite (checked exactly instead)

    def forget(self) -> None:
        self.bound = None

    def _magnitude(self, values: dict[str, Any]) -> float:
        return max(float(np.abs(values[w].numpy()).max()) for w in self.weights)

    def accept(self, s0: float, s1: float) -> bool:
        """True when the spare (new) values of the bounded weights are all finite."""
        if self.bound is None or self._generation != self.params.generation:
            self.bound = self._magnitude(self.params.live())
            self._generation = self.params.generation
        d = self.alpha * math.sqrt(s0 * s1)  # nan/inf for non-finite operands
        decay = 1.0 if self._decay is None else max(1.0, abs(float(self._decay)))
        bound = self.bound * decay + d
        if bound < self.limit:  # False for nan
            self.bound = bound
            return True
        self.exact_checks += 1
        spare = self.params.spare()
        if not all(np.isfinite(spare[w].numpy()).all() for w in self.weights):
            return False
        self.bound = self._magnitude(spare)
        return True
