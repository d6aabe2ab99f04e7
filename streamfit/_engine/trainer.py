"""The Trainer: trains the weights of one ONNX model, batch by batch, on one device.

Inputs follow the contract written in :mod:`streamfit._engine.prepare.model`: ``X`` is an ndarray (a one-input
model) or a mapping {model input name: array}; each input keeps its declared dtype and shape.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from onnx import ModelProto

from streamfit._columns.mapping import check_inputs
from streamfit._columns.memory import ColumnInputs
from streamfit._engine.artifact import Artifact, check_compiled, is_artifact, read_artifact, unavailable_kernels_hint
from streamfit._engine.common.names import Names
from streamfit._engine.common.ort_errors import as_model_error
from streamfit._engine.common.ort_private import has_ort_training
from streamfit._engine.gradient.builders import build_gradient_graphs
from streamfit._engine.gradient.portable import make_portable
from streamfit._engine.prepare.input_signature import InputSignature
from streamfit._engine.prepare.model import ModelInput, load_model, prepare_model
from streamfit._engine.runtime.buffers import HostScalars, PingPong
from streamfit._engine.runtime.device import Device, make_session, parse_device, session_options
from streamfit._engine.runtime.predictor import Predictor
from streamfit._engine.runtime.staging import Staging
from streamfit._engine.steps.forward_backward import ForwardBackwardStep
from streamfit._engine.steps.fused import FusedStep
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan import ChunkResult, train_chunk
from streamfit._engine.steps.scan_dense import ROW_EPS, ROW_RATE, batch_step_graph, dense_plan, row_step_graph
from streamfit._engine.steps.sparse_tables import SparseTables
from streamfit._engine.steps.tables import find_tables, training_model
from streamfit._engine.steps.step_graphs import sample_weight_shape
from streamfit._public import reexport
from streamfit.exceptions import BadInputError, ModelError, NonFiniteError, StreamfitError
from streamfit.losses import Loss, get_loss
from streamfit.optim import Optimizer, get_optimizer
from streamfit.penalties import Penalty
from streamfit.schedules import Schedule, as_schedule

__all__ = ["Trainer"]

_log = logging.getLogger("streamfit.engine")

StepKind = Literal["fused", "forward_backward"]
_STRATEGIES = {"fused": FusedStep, "forward_backward": ForwardBackwardStep}
#: steps of per-step scalars (Adam's bias corrections) computed at once at a constant rate
_SCALAR_ROWS = 256


@dataclass(frozen=True)
class ScalarRows:
    """The host scalars of the steps ``first, first + 1, ...`` at rate ``lr``: row ``j`` is the scalar block's
    values for step ``first + j`` (Adam's bias corrections change every step: computed a block at a time and a
    row written in one assignment, a step's scalars cost 0.35 us, against 0.9 us computed and written one by
    one)."""

    lr: float
    first: int
    values: np.ndarray


def _source(model: "str | os.PathLike[str] | bytes | ModelProto") -> "str | os.PathLike[str] | ModelProto":
    """The model to prepare: a proto as given, bytes parsed; a path stays a path unless its file is a training
    artifact (only the header is read to tell), so a big table's external data is read once, straight into
    its array (:mod:`streamfit._engine.prepare.large_initializers`), never into a protobuf first."""
    if isinstance(model, ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        import onnx

        try:
            header = onnx.load(os.fspath(model), load_external_data=False)
        except Exception:  # not readable: load_model raises the ModelError
            return load_model(model)
        if not is_artifact(header):
            return model
    return load_model(model)


def _check_options(step: str, on_nonfinite: str) -> None:
    """The step strategy and the non-finite policy a Trainer is given, checked before any work."""
    if step not in _STRATEGIES:
        raise ValueError(f"unknown step strategy {step!r}; expected one of {sorted(_STRATEGIES)}")
    if step == "forward_backward" and not has_ort_training():
        raise ModelError("step='forward_backward' runs onnxruntime's TrainingAgent: it needs onnxruntime-training "
                         "at train time (Python <= 3.12); step='fused' needs only onnxruntime")
    if on_nonfinite not in ("raise", "skip"):
        raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")


class Trainer:
    """Online training of an ONNX model's weights with onnxruntime-training.

    Weights and optimizer state stay on the device between steps; a batch is copied into a staging
    buffer bound once per batch shape, then one step runs (one session run with ``step="fused"``).
    A step whose loss, gradients or new weights are not finite is never applied: it raises
    :class:`~streamfit.exceptions.NonFiniteError` (``on_nonfinite="raise"``) or is counted in
    ``n_skipped`` (``"skip"``).

    Embedding tables (initializers read only by ``Gather`` with ids from a model input) are trained
    row-sparsely with ``sparse=True``: a step reads and writes only the rows of the ids in its batch, so it
    costs the same whatever the table's size (lazy rules: Adam as PyTorch's SparseAdam, penalties applied
    to touched rows).  ``"auto"`` (default) does so only where that is exactly the dense step (SGD,
    AdaGrad, RowWiseAdaGrad, FTRL on unpenalized tables); ``False`` never.  See :mod:`streamfit._engine.steps.sparse_tables`.

    ``inputs=`` maps model input names to Arrow columns, as the estimators' ``inputs=`` does (a column name,
    a list of column names, or an encoder of :mod:`streamfit.features` such as ``Hashed``); :meth:`step`,
    :meth:`predict` and :meth:`forward` then also take an Arrow Table/RecordBatch or a dict of columns.  The
    mapping is checked against the model here (a :class:`~streamfit.exceptions.ModelError` naming the input),
    each new schema once against it; encoder state (vocabularies) is in :meth:`state_dict`.

    The gradient graph comes from ``gradient``: ``"onnxruntime"`` (onnxruntime-training's builder, any op it
    knows; Python <= 3.12), ``"streamfit"`` (:mod:`streamfit._engine.gradient.autodiff`: the ready-made models' ops,
    standard ONNX ops only, so any onnxruntime runs it), ``"auto"`` the first where installed, else the second.
    A model given as a training artifact (``streamfit compile``) needs neither.

    ``portable=True`` rewrites the training-only kernels of the gradient graph into ops that inference
    builds of onnxruntime implement (:mod:`streamfit._engine.gradient.portable`): the step graphs then run on the
    newest onnxruntime too (same results up to float rounding; at small batches a little slower).

    ``host=`` names initializers that no step trains but the caller changes between steps (the ready-made
    models' input standardization: a mean and a scale the estimator keeps): every step and prediction reads
    them from :attr:`host_arrays`, bound once, and :meth:`to_onnx` exports their current values.

    Parameters
    ----------
    model
        The ONNX model: a path, bytes or an ``onnx.ModelProto`` (not changed here), or a training artifact
        written by ``streamfit compile`` (its loss, optimizer, penalty, weights and inputs are then the
        compiled ones; a different one given here raises).
    weights
        Names of the initializers to train, in this order; default: every float initializer that feeds
        computation (not shapes, axes, indices, statistics, nor the exporter's scalar constants by
        ``streamfit._engine.prepare.constants.RULE``).
    freeze
        Names of initializers to keep out of the trained set (frozen at their initial values); a name the
        model lacks raises :class:`~streamfit.exceptions.ModelError`.
    input_name, output_name
        The model input an ndarray feeds and the output the loss trains through (default: the first of
        each).
    loss
        A loss name (:mod:`streamfit.losses`) or :class:`~streamfit.losses.Loss`; default ``"squared_error"``.
    optimizer
        An optimizer name (:mod:`streamfit.optim`) or :class:`~streamfit.optim.Optimizer`; default ``"sgd"``.
    learning_rate
        A constant rate (float) or a :class:`~streamfit.schedules.Schedule` (rate per step).
    penalty
        A :class:`~streamfit.penalties.Penalty` (L1/L2/elastic net on the trained weights), or None.
    device
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``: where the weights, optimizer state and steps live.
    step
        ``"fused"``: forward, backward and update in one session run; ``"forward_backward"``: onnxruntime's
        TrainingAgent (needs onnxruntime-training at train time).
    on_nonfinite
        ``"raise"`` (a :class:`~streamfit.exceptions.NonFiniteError`) or ``"skip"`` (counted in
        ``n_skipped``) for a step whose loss, gradients or new weights are not finite.
    threads
        onnxruntime's intra-op threads; None: one for light steps (small batches, little work per batch),
        all cores for heavy ones.
    spinning
        Whether idle intra-op threads spin (``session.intra_op.allow_spinning``); False frees the cores
        between steps at some latency.
    freeze_batchnorm
        Train through BatchNormalization's running statistics as constants, never updating them (default:
        PyTorch's training semantics, batch statistics with the running ones updated).
    seed
        Seed of the random ops of training (Dropout masks), so runs are reproducible.
    sparse
        ``True``, ``False`` or ``"auto"``: embedding tables trained row-sparsely, as above.
    inputs
        Model input names mapped to Arrow columns or encoders, as above; None: arrays only.
    gradient
        ``"auto"``, ``"onnxruntime"`` or ``"streamfit"``: who builds the gradient graph, as above.
    portable
        Rewrite training-only kernels into ops that inference builds of onnxruntime run, as above.
    host
        Names of initializers the caller sets between steps (never trained), as above.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit.testing import linear_model
    >>> trainer = Trainer(linear_model(n_features=2), learning_rate=0.1)
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32); y = np.array([2.0, -1.0], np.float32)
    >>> for _ in range(200):
    ...     loss = trainer.step(X, y)
    >>> trainer.predict(X).ravel().round(3)
    array([ 2., -1.], dtype=float32)
    """

    #: a ready-made linear model's steps of one row and its chunks of small steps run its lean step
    #: (steps/scan_dense.py: fewer nodes, within float32 rounding of the generic step graph, not bit for bit), its
    #: weights and slots laid out as columns; False (on the class, before a trainer is made): the generic graphs
    lean_steps = True

    def __init__(self, model: "str | os.PathLike[str] | bytes | ModelProto", *, weights: Sequence[str] | None = None,
                 input_name: str | None = None, output_name: str | None = None, loss: "str | Loss | None" = None,
                 optimizer: "str | Optimizer | None" = None, learning_rate: "float | Schedule" = 0.01,
                 penalty: Penalty | None = None, device: "str | Device" = "cpu", step: StepKind = "fused",
                 on_nonfinite: Literal["raise", "skip"] = "raise", threads: int | None = None,
                 spinning: bool = True, freeze_batchnorm: bool = False, seed: int = 0,
                 sparse: "bool | Literal['auto']" = "auto", inputs: Mapping[str, Any] | None = None,
                 gradient: Literal["auto", "onnxruntime", "streamfit"] = "auto",
                 portable: bool = False, host: Sequence[str] = (), freeze: Sequence[str] = ()) -> None:
        _check_options(step, on_nonfinite)
        self.device = parse_device(device)
        source = _source(model)  # the caller's proto is not changed here
        owned = source is not model
        #: the training artifact this trainer runs (``streamfit compile``), or None: graphs built here
        self.artifact: Artifact | None = read_artifact(source) if isinstance(source, ModelProto) and \
            is_artifact(source) else None
        if self.artifact is not None:
            info = self.artifact.info
            loss, optimizer, penalty = check_compiled(info, loss, optimizer, penalty, step, self.device.kind,
                                                      weights, input_name, output_name)
            weights, input_name, output_name = info.weight_names, info.input_name, info.output_name
            freeze_batchnorm, seed, sparse = info.freeze_batchnorm, info.seed, False
            source, owned = self.artifact.model, True
        self.prepared = prepare_model(source, weights, input_name, output_name, freeze_batchnorm=freeze_batchnorm,
                                      seed=seed, owned=owned, host=host, freeze=freeze)
        self.loss = get_loss("squared_error" if loss is None else loss)
        self.optimizer = get_optimizer("sgd" if optimizer is None else optimizer)
        self.penalty = penalty
        self.schedule = (as_schedule(learning_rate) if not isinstance(learning_rate, Schedule)
                         else learning_rate)
        self.step_kind: StepKind = step
        self.on_nonfinite = on_nonfinite
        self._init_session_options(threads, spinning)
        self._init_inputs(inputs)
        self._init_tables(sparse)
        self._init_graphs(gradient, portable)
        self._init_params_and_predictor()
        self._init_step_state()

    def _init_session_options(self, threads: int | None, spinning: bool) -> None:
        self.options = session_options(threads, spinning)
        # threads=None: light steps (small batches, or little work per batch: a linear model) run on one
        # thread (handing a tiny GEMM to a second thread costs more than it saves, and an idle spinning
        # thread takes a core from the reader), heavy ones on all cores
        self.small_batch_options = session_options(1 if threads is None else threads, spinning)
        self._threads_given = threads is not None

    def _init_inputs(self, inputs: Mapping[str, Any] | None) -> None:
        """The model inputs' signature, and the column plan of ``inputs=`` (checked against the model)."""
        self._signature = InputSignature(self.prepared.inputs, self.prepared.input_name)
        self._single = self._signature.single
        #: ``inputs=``: the column plan that turns Arrow tables (or dicts of columns) into the model's inputs
        self.inputs = inputs
        self._columns: ColumnInputs | None = None
        if inputs is not None:
            check_inputs(self.prepared.inputs, inputs)  # a ModelError naming the input
            self._columns = ColumnInputs(self.prepared.inputs, inputs)

    def _init_tables(self, sparse: "bool | Literal['auto']") -> None:
        """The host scalars, and the embedding tables trained row-sparsely (see _engine/steps/sparse_tables.py):
        initializers read only by Gather."""
        if sparse not in (True, False, "auto"):
            raise ValueError(f"sparse must be True, False or 'auto', got {sparse!r}")
        penalty = self.penalty
        tables = () if not sparse or self.step_kind != "fused" or self.device.kind != "cpu" else \
            find_tables(self.prepared, *((self.optimizer, penalty) if sparse == "auto" else ()))
        self._sparse: SparseTables | None = None
        self._train_pm = self.prepared
        self.scalars = HostScalars([Names.scalar(s) for s in self.optimizer.scalar_names] + [Names.decay],
                                   self.prepared.dtype, self.prepared.host)
        if tables:
            self._train_pm = training_model(self.prepared, tables)
            self._sparse = SparseTables(tables, self.prepared, self.optimizer, penalty, self.device, self.scalars,
                                        self.small_batch_options)

    def _init_graphs(self, gradient: str, portable: bool) -> None:
        #: the gradient graphs the step graphs are built from (None for an artifact: its graphs are built)
        self.graphs = None if self.artifact is not None else \
            build_gradient_graphs(self._train_pm, self._sparse.rows_names if self._sparse else (), gradient)
        #: the step graphs hold only ops inference builds of onnxruntime run (see _engine/gradient/portable.py)
        self.portable = portable
        if portable and self.graphs is not None:
            self.graphs.gradient = make_portable(self.graphs.gradient)
        if self._sparse is not None and self.graphs is not None:
            self._sparse.set_grad_names(self.graphs.input_grad_names)

    def _init_params_and_predictor(self) -> None:
        """The weights and optimizer state on the device (two ping-pong sets), and the predictor reading them."""
        # predict runs the author's graph (eval semantics, every op as exported), weights bound per run
        predict_model = self.prepared.predict_model(list(self.prepared.weights) + list(self.prepared.buffers)
                                                    + list(self.prepared.host))
        predict_bytes = predict_model.SerializeToString()
        # small predictions (and any, on a small model) run on one thread, as light steps do: an idle pool of
        # spinning threads would burn a core through the whole stream; large ones get a session with the pool
        light = not self._threads_given
        self._predict_session = make_session(predict_bytes, self.small_batch_options if light else self.options,
                                             self.device, self.prepared.dtype)
        heavy = (lambda: make_session(predict_bytes, self.options, self.device, self.prepared.dtype)) if light else None
        values: dict[str, np.ndarray] = {}
        for w in self._train_pm.weights:
            values[w] = self.prepared.initial[w]
            for slot, arr in self.optimizer.init_state(self.prepared.initial[w]).items():
                values[Names.slot(w, slot)] = arr
        values.update(self.prepared.buffers)  # BatchNorm running statistics: updated by the steps, not trained
        self.params = PingPong(self.device, values)
        #: the lean step's plan (steps/scan_dense.py), or None: the weights and slots it carries as columns
        self._dense = dense_plan(self)  # (its conditions: scan_dense.lean_applies)
        if self._dense is not None:  # before anything binds the values
            self.params.columns(self._dense.columns())
            self.scalars.add_to_block(self._dense.row_scalars(self.prepared.dtype))
        fixed = {name: self.scalars.values[name] for name in self.prepared.host}
        if self._sparse is not None:
            fixed.update(self._sparse.values)
        self._predictor = Predictor(self._predict_session, self.prepared, self.params, self.device, fixed=fixed,
                                    heavy=heavy, weights_size=sum(int(self._train_pm.initial[w].size)
                                                                  for w in self._train_pm.weights))
        self._predict_checked: set[tuple[Any, ...]] = set()

    def _init_step_state(self) -> None:
        """What a step reads and counts: the bound scalars, the strategy (made on the first step), counters."""
        self._l2 = self.penalty.l2 if self.penalty is not None else 0.0
        arrays = self.scalars.arrays  # bound once; a step writes these 0-d arrays in place when they change
        self._optimizer_scalars = [arrays[Names.scalar(s)] for s in self.optimizer.scalar_names]
        self._decay = arrays[Names.decay]
        #: the lean one-row step's Adam rate and epsilon (steps/scan_dense.py), written with the optimizer's scalars
        self._row_rates = (arrays[ROW_RATE], arrays[ROW_EPS]) if ROW_RATE in arrays else None
        #: or the step number its Adam kernel reads (steps/fused_adam.py)
        self._row_step_number = arrays.get(fused_adam.STEP)
        # an optimizer that keeps the base scalars() feeds the lr only: rewritten only when the lr changes
        self._scalars_per_step = type(self.optimizer).scalars is not Optimizer.scalars
        self._fed_lr: float | None = None
        #: the block's values for the coming steps at one rate (per-step scalars, a constant rate), or None
        self._scalar_rows: ScalarRows | None = None
        block = [Names.scalar(s) for s in self.optimizer.scalar_names] + [Names.decay]
        if self._row_rates is not None:
            block += [ROW_RATE, ROW_EPS]
        if self._row_step_number is not None:
            block.append(fused_adam.STEP)
        #: the block holds the scalars _set_scalars writes, and only those: a row of them is one assignment
        self._block_rows = self._scalars_per_step and self.scalars.block_names == block
        self._lr_in_grad_weights = False
        # rows' gradient weights: 1/n (the batch's mean loss), or 1 for a rule on the summed loss (FTRL)
        self._summed_gradient = bool(self.optimizer.summed_gradient)
        self._integer_labels = self.loss.integer_labels
        self._strategy: FusedStep | ForwardBackwardStep | None = None
        self._y_tail: tuple[int, ...] | None = None
        self._staged: dict[tuple[Any, ...], Staging] = {}
        self.lr_scale = 1.0  # multiplies the schedule's rate (the divergence guard lowers it)
        self.n_steps = 0  # applied steps (the optimizer's t)
        self.n_skipped = 0
        self.last_loss = float("nan")
        #: why the fused step was given up for forward/backward (None: it was not)
        self.fallback: str | None = None
        self._eval_differs = self.prepared.train_differs
        self._last_eval: np.ndarray | None = None

    # -- properties ---------------------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self.prepared.dtype

    @property
    def weight_names(self) -> list[str]:
        return list(self.prepared.weights)

    @property
    def host_arrays(self) -> dict[str, np.ndarray]:
        """The host tensors (``host=``) as the arrays every step and prediction reads: write them in place
        (``trainer.host_arrays[name][...] = value``) between calls; never trained."""
        return {name: self.scalars.arrays[name] for name in self.prepared.host}

    @property
    def learning_rate(self) -> float:
        """The rate the next step uses: the schedule's, times ``lr_scale``."""
        return float(self.schedule.lr) * self.lr_scale

    # -- inputs -------------------------------------------------------------------------------------
    @property
    def model_inputs(self) -> tuple[ModelInput, ...]:
        """The model's non-weight inputs (declared dtype and shape), in model order."""
        return self.prepared.inputs

    def _checked(self, X: Any) -> tuple[np.ndarray, ...]:
        """``X`` as one checked array per model input (model order); raises a clear error on a mismatch."""
        if self._columns is not None and self._columns.takes(X):
            X = self._columns.arrays(X)
        arrays = self._signature.arrays(X)
        self._signature.check(arrays)
        return arrays

    def _ensure_strategy(self, arrays: tuple[np.ndarray, ...]) -> None:
        if self._strategy is not None:
            return
        probe = arrays if self._signature.fixed_batch else tuple(a[:1] if a.ndim else a for a in arrays)
        y = self._predict_arrays(probe)
        self._y_tail = tuple(y.shape[1:])
        self._strategy = self._make_strategy(y.ndim)

    def _make_strategy(self, y_rank: int) -> "FusedStep | ForwardBackwardStep":
        cls = _STRATEGIES[self.step_kind]
        extra = {"small_batch_options": self.small_batch_options,
                 "light_large_batches": not self._threads_given, "sparse": self._sparse} if cls is FusedStep else {}
        if cls is FusedStep and self._dense is not None and self.artifact is None:  # steps of one row: the lean one
            extra["row_step"] = row_step_graph(self)
            extra["batch_step"] = batch_step_graph(self)
        if self.artifact is not None:
            if y_rank != self.artifact.info.y_rank:
                raise ModelError(f"the training artifact was compiled for an output of rank {self.artifact.info.y_rank}, "
                                 f"but the model gives rank {y_rank}")
            extra["compiled"] = self.artifact.steps  # no fallback: the artifact is all there is
            try:
                strategy = FusedStep(self._train_pm, None, self.loss, self.optimizer, self.penalty, self.device,
                                     self.options, y_rank, self.params, self.scalars, **extra)
            except StreamfitError:
                raise
            except Exception as exc:
                raise ModelError(f"the training artifact's step graph could not be built: {type(exc).__name__}: {exc}"
                                 f"{unavailable_kernels_hint(exc)}") from exc
            self._lr_in_grad_weights = strategy.lr_in_grad_weights
            return strategy
        try:
            strategy = cls(self._train_pm, self.graphs, self.loss, self.optimizer, self.penalty, self.device,
                           self.options, y_rank, self.params, self.scalars, **extra)
        except Exception as exc:
            if isinstance(exc, BadInputError):
                raise
            if cls is not FusedStep:
                raise self._model_error(exc, "building the forward/backward step") from exc
            self._fall_back(exc, "built")
            return self._make_strategy(y_rank)
        self._lr_in_grad_weights = strategy.lr_in_grad_weights
        return strategy

    def _model_error(self, exc: Exception, what: str) -> StreamfitError:
        """An error of the forward/backward step as a ModelError naming the node (and the fused step's failure
        that led here, if one did): no raw onnxruntime error reaches the user."""
        err = as_model_error(exc, what, self._train_pm.model)
        if self.fallback and not isinstance(exc, StreamfitError):
            err = ModelError(f"{err}; neither strategy trains this model ({self.fallback})")
        return err

    def _fall_back(self, exc: Exception, what: str) -> None:
        """The fused graph failed: switch to the forward/backward step once, loudly (weights are kept)."""
        if self.artifact is not None:
            raise ModelError(f"the training artifact's step graph could not be {what}: {type(exc).__name__}: {exc}"
                             f"{unavailable_kernels_hint(exc)}") from exc
        if not has_ort_training():
            raise ModelError(f"the fused step could not be {what} ({type(exc).__name__}: {str(exc)[:500]}), and the "
                             "forward/backward fallback needs onnxruntime-training at train time (Python <= 3.12)") from exc
        if self._sparse is not None:  # the tables live outside the graphs the other step would train
            raise ModelError(f"the fused step could not be {what}, and a model with row-sparse tables "
                             f"({sorted(self._sparse.arrays)}) cannot fall back (pass sparse=False to train "
                             f"them densely): {type(exc).__name__}: {exc}") from exc
        self.fallback = f"the fused step could not be {what} ({type(exc).__name__}: {str(exc)[:500]})"
        _log.warning("%s; falling back to step='forward_backward' for the rest of this run", self.fallback)
        self.step_kind = "forward_backward"
        self._staged.clear()
        if self._strategy is not None:
            self._strategy = self._make_strategy(len(self._y_tail or ()) + 1)

    def _targets(self, y: Any, n: int) -> np.ndarray:
        y = np.asarray(y)
        if y.dtype.kind not in "fiub":
            raise BadInputError(f"labels are {y.dtype}, expected numbers", reason="wrong_type")
        if y.ndim == 0 or y.shape[0] != n:
            raise BadInputError(f"got {n} rows of features but {f'{y.shape[0]} labels' if y.ndim else 'a scalar label'}",
                                reason="shape_mismatch")
        if self.loss.integer_labels:
            if y.dtype.kind not in "iub" and not (y.dtype.kind == "f" and np.all(y == np.round(y))):
                raise BadInputError(f"labels must be integer class indices, got {y.dtype}", reason="wrong_type")
            return y.reshape(n)
        assert self._y_tail is not None
        size = math.prod(self._y_tail) if self._y_tail else 1
        if y.size != n * size:
            raise BadInputError(f"labels of shape {y.shape} do not fit the model output (N, *{self._y_tail})",
                                reason="shape_mismatch")
        return y.reshape((n,) + self._y_tail)

    def _staging_for(self, arrays: tuple[np.ndarray, ...], y: np.ndarray, key: tuple[Any, ...]) -> Staging:
        """The staging buffers of a batch signature not seen recently: inputs and labels checked, buffers bound."""
        n = self._signature.check(arrays)
        for stats in self.prepared.running_stats:
            if stats.spatial is not None and n * stats.spatial <= 1:
                raise BadInputError(f"BatchNormalization {stats.node!r} needs more than one value per channel in "
                                    f"training, got a batch of {n} row(s) (PyTorch refuses it too); batch rows "
                                    "together or pass freeze_batchnorm=True", reason="shape_mismatch")
        if self._strategy is None:
            self._ensure_strategy(arrays)
        assert self._strategy is not None
        T = self._targets(y, n)
        t_dtype = np.int64 if self.loss.integer_labels else self.dtype
        sw_shape = sample_weight_shape(n, len(self._y_tail or ()) + 1)
        y_shape = (n,) + tuple(self._y_tail or ())
        try:
            staging = self._strategy.cache.get(tuple(a.shape for a in arrays), tuple(i.dtype for i in self.model_inputs),
                                               T.shape, t_dtype, sw_shape, y_shape, self.dtype)
        except Exception as exc:  # the large-batch graph is built on the first large batch
            if isinstance(exc, StreamfitError) and not isinstance(exc, ModelError):
                raise
            if self.step_kind != "fused":
                raise self._model_error(exc, "building the forward/backward step") from exc
            self._fall_back(exc, "built")
            return self._staging_for(arrays, y, key)
        if len(self._staged) >= self._strategy.cache.size:
            self._staged.clear()
        self._staged[key] = staging
        return staging

    @staticmethod
    def _sample_weights(sample_weight: Any, n: int) -> np.ndarray:
        sw = np.asarray(sample_weight)
        if sw.size != n:
            raise BadInputError(f"got {sw.size} sample weights for {n} rows", reason="shape_mismatch")
        if sw.dtype.kind not in "fiub":
            raise BadInputError(f"sample weights are {sw.dtype}, expected numbers", reason="wrong_type")
        return sw

    # -- training -----------------------------------------------------------------------------------
    def _set_scalars(self, lr: float) -> None:
        rows = self._scalar_rows
        if rows is not None and lr == rows.lr and 0 <= self.n_steps - rows.first < len(rows.values):
            self.scalars.block[:] = rows.values[self.n_steps - rows.first]
            self._fed_lr = lr
            return
        if self._block_rows and lr == self._fed_lr:  # per-step scalars at a rate held since the last step
            rows = self._scalar_rows = ScalarRows(lr, self.n_steps, self._scalar_table(lr, _SCALAR_ROWS))
            self.scalars.block[:] = rows.values[0]
            self._fed_lr = lr
            return
        values = self.optimizer.scalars(lr, self.n_steps)
        for target, value in zip(self._optimizer_scalars, values):
            target[()] = value
        self._decay[()] = 1.0 - lr * self._l2
        self._fed_lr = lr
        if self._row_rates is not None:  # Adam's for the lean one-row step: step_size / c and eps / c
            rate, eps = self._row_rates
            rate[...] = values[1] / values[2]
            eps[()] = self.optimizer.eps / values[2]  # type: ignore[attr-defined]
        if self._row_step_number is not None:
            self._row_step_number[()] = fused_adam.step_number(self.n_steps)

    def _scalar_table(self, lr: float, steps: int) -> np.ndarray:
        """The block's values (:class:`HostScalars`) for the ``steps`` steps from this one at rate ``lr``:
        what :meth:`_set_scalars` writes at each, computed at once (the optimizer's :meth:`scalars_of_steps`, the
        same float64 arithmetic, cast to the block's dtype as an assignment casts)."""
        values = self.optimizer.scalars_of_steps(np.full(steps, lr), self.n_steps)
        columns = [values[:, j] for j in range(values.shape[1])] + [np.full(steps, 1.0 - lr * self._l2)]
        if self._row_rates is not None:
            columns += [values[:, 1] / values[:, 2], self.optimizer.eps / values[:, 2]]  # type: ignore[attr-defined]
        if self._row_step_number is not None:
            columns.append(fused_adam.step_numbers(self.n_steps, steps))
        return np.stack(columns, axis=1).astype(self.scalars.block.dtype)

    def step(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Train on one batch; return its mean loss (computed before the update).

        ``X`` is an ndarray (a one-input model) or a mapping {model input name: array}.  The path for a
        batch signature seen before is kept lean (at batch 1 the whole step is a few microseconds): the
        names, shapes and dtype kinds were checked against the model when the signature was first staged.

        Parameters
        ----------
        X
            An ndarray (a one-input model), a mapping {model input name: array}, or, with ``inputs=``, an Arrow
            Table/RecordBatch or a dict of columns.
        y
            The batch's targets, in the loss's form (floats for a regression loss, class indices or 0/1 labels for
            a classification loss).
        sample_weight
            Row weights (``N`` values), or None for 1 each.
        """
        if type(X) is np.ndarray and self._single:
            arrays: tuple[np.ndarray, ...] = (X,)
            key: tuple[Any, ...] = (X.shape, X.dtype.kind)
        else:
            if self._columns is not None and self._columns.takes(X):
                X = self._columns.arrays(X)
            arrays = self._signature.arrays(X)
            key = self._signature.signature(arrays)
        if type(y) is not np.ndarray:
            y = np.asarray(y)
        if self._integer_labels and y.dtype.kind == "f":  # whole-valued floats: checked on every call
            y = self._targets(y, self._signature.check(arrays)).astype(np.int64)
        key += (y.shape, y.dtype.kind)
        staging = self._staged.get(key)
        if staging is None:
            staging = self._staging_for(arrays, y, key)
        n = staging.n
        lr = self.schedule.lr * self.lr_scale
        staging.load(arrays, y, None if sample_weight is None else self._sample_weights(sample_weight, n),
                     lr / n if self._lr_in_grad_weights else (1.0 if self._summed_gradient else 1.0 / n))
        if self._sparse is not None:  # the batch's touched table rows into the step's buffers
            self._sparse.gather(staging.xs, staging.extra["sparse"])
        if lr != self._fed_lr or self._scalars_per_step:
            self._set_scalars(lr)
        if self._eval_differs:
            self._last_eval = self._predict_arrays(arrays)
        try:
            loss, ok = self._strategy.run(staging)  # type: ignore[union-attr]
        except Exception as exc:
            if self.step_kind != "fused":
                raise self._model_error(exc, "running the forward/backward step") from exc
            self._fall_back(exc, "run")
            return self.step(X, y, sample_weight)
        self._last_staging = staging
        if ok:  # the common case, inline (ok implies a finite loss)
            self.last_loss = loss
            self.n_steps += 1
            self.schedule.step(loss)
            return loss
        return self._finish(loss, ok)

    def step_chunk(self, X: Any, y: Any, sample_weight: Any = None, *, batch_size: int = 1,
                   host_steps: Mapping[str, np.ndarray] | None = None) -> ChunkResult:
        """Train ``ceil(n / batch_size)`` steps over the ``n`` rows of ``X`` in order, in one session run (a
        ``Scan`` over the steps, :mod:`streamfit._engine.steps.scan`); the result is :meth:`step` on each step's
        rows in turn.  Returns each row's output before its step and each step's loss (:class:`ChunkResult`).
        ``host_steps`` gives host tensors one value per step ([steps, *shape]).

        Parameters
        ----------
        X
            An ndarray (a one-input model), a mapping {model input name: array}, or, with ``inputs=``, an Arrow
            Table/RecordBatch or a dict of columns.
        y, sample_weight
            As for :meth:`step`, for all the rows.
        batch_size
            Rows per step; the last step takes the rows left over.
        host_steps
            ``{host tensor name: [steps, *shape] array}``: the value of a ``host=`` tensor for each step (the
            ready-made models' input statistics after each step's rows); None: the current values for every step.
        """
        return train_chunk(self, X, y, sample_weight, batch_size, host_steps)

    @property
    def last_output(self) -> np.ndarray:
        """The model's output on the last batch passed to :meth:`step`, computed before its update.

        A view into a reused buffer, valid until the next step with the same batch shape: copy it to
        keep it.  Progressive validation reads it instead of running a separate prediction; for a model
        whose training differs from inference (BatchNorm batch statistics, Dropout) it is the inference
        output (running statistics, no dropout), predicted before the step.
        """
        if self._last_eval is not None:
            return self._last_eval
        return self._last_staging.y

    def _finish(self, loss: float, ok: bool) -> float:
        self.last_loss = loss
        if not ok:
            self.n_skipped += 1
            if self.on_nonfinite == "raise":
                what = "loss" if not math.isfinite(loss) else "gradients or updated weights"
                raise NonFiniteError(f"step {self.n_steps + 1}: non-finite {what} (loss={loss}); the step was "
                                     "not applied and the weights are unchanged", step=self.n_steps + 1, what=what)
            return loss
        self.n_steps += 1
        self.schedule.step(loss if math.isfinite(loss) else None)
        return loss

    # -- piece by piece (forward/backward strategy) -------------------------------------------------
    def _fb(self) -> ForwardBackwardStep:
        if not isinstance(self._strategy, ForwardBackwardStep):
            raise StreamfitError("forward()/backward()/apply_gradients() need step='forward_backward'")
        return self._strategy

    def forward(self, X: Any) -> np.ndarray:
        """Forward pass that remembers what :meth:`backward` needs; returns the model output.

        ``X`` as in :meth:`step`: an ndarray or a mapping {model input name: array}.

        Parameters
        ----------
        X
            As for :meth:`step`.
        """
        arrays = self._checked(X)
        self._ensure_strategy(arrays)
        fb = self._fb()
        self._fb_x = self._as_declared(arrays)  # kept alive until backward
        y = fb.forward(tuple(self.device.resident(a) for a in self._fb_x))
        return self.device.to_numpy(y)

    def backward(self, dy: Any) -> dict[str, np.ndarray]:
        """Gradients of the trained weights for a caller-computed dL/dY of the last :meth:`forward`.

        Parameters
        ----------
        dy
            dL/dY for the output of the last :meth:`forward` (its shape).
        """
        fb = self._fb()
        dy = np.ascontiguousarray(dy, dtype=self.dtype)
        grads = fb.backward(self.device.resident(dy))
        return {w: self.device.to_numpy(g) for w, g in zip(self.prepared.weights, grads)}

    def apply_gradients(self, grads: Mapping[str, Any], loss: float | None = None) -> bool:
        """Apply gradients (penalty, optimizer, schedule step) as a normal step would.

        Parameters
        ----------
        grads
            ``{weight name: gradient}`` for every trained weight.
        loss
            The loss these gradients are of (the schedule's step and ``last_loss`` see it), or None.
        """
        fb = self._fb()
        missing = [w for w in self.prepared.weights if w not in grads]
        if missing:
            raise KeyError(f"gradients missing for {missing}")
        arrays = [np.ascontiguousarray(grads[w], dtype=self.dtype) for w in self.prepared.weights]
        self._set_scalars(self.schedule.lr * self.lr_scale)
        ok = fb.apply([self.device.resident(a) for a in arrays])
        self._finish(float("nan") if loss is None else float(loss), ok)
        return ok

    # -- inference ----------------------------------------------------------------------------------
    def predict(self, X: Any) -> np.ndarray:
        """The model's output for ``X`` (as in :meth:`step`) with the current weights.

        A batch signature is checked against the model the first time it is seen; small batches then
        run through bindings made once (a copy in, one session run, a copy out).

        Parameters
        ----------
        X
            As for :meth:`step`.
        """
        return self._predict(X, True)

    def _predict(self, X: Any, copy: bool) -> np.ndarray:
        """:meth:`predict`; ``copy=False`` may return a reused buffer, valid until the next prediction."""
        if type(X) is np.ndarray and self._single:
            arrays: tuple[np.ndarray, ...] = (X,)
            key: tuple[Any, ...] = (X.shape, X.dtype.kind)
        else:
            if self._columns is not None and self._columns.takes(X):
                X = self._columns.arrays(X, learn=False)  # a prediction teaches a vocabulary nothing
            arrays = self._signature.arrays(X)
            key = self._signature.signature(arrays)
        if key not in self._predict_checked:
            self._signature.check(arrays)
            if len(self._predict_checked) >= 64:
                self._predict_checked.clear()
            self._predict_checked.add(key)
        try:
            return self._predictor.run(arrays, key, copy)
        except StreamfitError:
            raise
        except Exception as exc:  # a kernel's refusal (a shape the graph cannot take): named, not raw
            raise as_model_error(exc, "predicting", self.prepared.inference) from exc

    def _as_declared(self, arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        return tuple(np.ascontiguousarray(a, dtype=spec.dtype) for spec, a in zip(self.model_inputs, arrays))

    def _predict_arrays(self, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
        """The model's output for checked arrays (model order), without binding them for later calls."""
        try:
            return self._predictor.run(arrays)
        except StreamfitError:
            raise
        except Exception as exc:
            raise as_model_error(exc, "predicting", self.prepared.inference) from exc

    def step_graphs(self) -> dict[str, ModelProto]:
        """Every graph this trainer trains with, by role: ``fused`` / ``fused_large`` / ``fused_row`` / ``fused_batch``
        (step="fused"; the last two: a linear model's lean steps of one row and of a small batch),
        ``gradient`` / ``loss`` / ``update`` (step="forward_backward"), ``sparse_rows`` (tables trained
        row-sparsely).  The step graphs are built on the first step: call :meth:`step` first."""
        if self._strategy is None:
            raise RuntimeError("the step graphs are built on the first step: call step() first")
        graphs = self._strategy.graphs()
        if self._sparse is not None:
            graphs["sparse_rows"] = self._sparse.model
        return graphs

    # -- state --------------------------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """Host copies of the trained weights (tables included)."""
        return self._weights(copy=True)

    def _weights(self, copy: bool) -> dict[str, np.ndarray]:
        """The trained weights; ``copy=False`` gives the live row-sparse tables themselves (not copied), unless
        the tables are lent (:meth:`SparseTables.lend`: what the lend says)."""
        if self._sparse is None:
            return self.params.read(self.prepared.weights)
        live = not copy and not self._sparse.lending
        values = {**self.params.read(self._train_pm.weights), **(self._sparse.arrays if live else self._sparse.read())}
        return {w: values[w] for w in self.prepared.weights}

    @property
    def tables(self) -> SparseTables | None:
        """The embedding tables trained row-sparsely (their live arrays and touched rows), or ``None``."""
        return self._sparse

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Overwrite trained weights (the others keep theirs); a name that is not trained raises ``KeyError``.

        Parameters
        ----------
        weights
            ``{weight name: array}``, each of the weight's shape (cast to the trainer's dtype).
        """
        unknown = set(weights) - set(self.prepared.weights)
        if unknown:
            raise KeyError(f"unknown weights {sorted(unknown)}; trained weights are {self.prepared.weights}")
        values = {k: np.asarray(v, self.dtype) for k, v in weights.items()}
        if self._sparse is not None:
            self._sparse.write({k: v for k, v in values.items() if k in self._sparse.arrays})
            values = {k: v for k, v in values.items() if k not in self._sparse.arrays}
        self.params.write(values)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's per-weight state as named arrays (``<weight>__<slot>``)."""
        names = [n for n in self.params.names if n not in self.prepared.initial and n not in self.prepared.buffers]
        state = self.params.read(names)
        if self._sparse is not None:
            state.update(self._sparse.read_state())
        return state

    def running_statistics(self) -> dict[str, np.ndarray]:
        """Host copies of the BatchNorm running means and variances (empty for a model without any)."""
        return self.params.read(list(self.prepared.buffers))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimizer state, schedule, counters."""
        states = self._columns.plan.states if self._columns is not None else {}
        return {"weights": self.get_weights(), "optimizer": self.optimizer_state(),
                "schedule": self.schedule.state_dict(), "n_steps": self.n_steps, "n_skipped": self.n_skipped,
                "lr_scale": self.lr_scale,
                **({"buffers": self.running_statistics()} if self.prepared.buffers else {}),
                **({"encoders": {k: v.to_dict() for k, v in states.items()}} if states else {})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: weights, running statistics, optimizer state, schedule, counters.

        Parameters
        ----------
        state
            What :meth:`state_dict` returned (from a checkpoint); names that differ from this trainer's raise
            ``KeyError`` naming them.
        """
        self.set_weights(state["weights"])
        if "buffers" in state:  # older checkpoints have none: the statistics stay as they are
            unknown = set(state["buffers"]) - set(self.prepared.buffers)
            if unknown:
                raise KeyError(f"unknown running statistics {sorted(unknown)}; the model has {sorted(self.prepared.buffers)}")
            self.params.write({k: np.asarray(v, self.dtype) for k, v in state["buffers"].items()})
        dense = {n for n in self.params.names if n not in self.prepared.initial and n not in self.prepared.buffers}
        tables = self._sparse.state_names() if self._sparse is not None else set()
        given = set(state.get("optimizer", {}))
        if given != dense | tables:
            raise KeyError(f"optimizer state has {sorted(given)}, expected {sorted(dense | tables)}")
        self.params.write({k: v for k, v in state["optimizer"].items() if k in dense})
        if self._sparse is not None:
            self._sparse.write_state(state["optimizer"])
        if "schedule" in state:
            self.schedule.load_state_dict(state["schedule"])  # says what differs if configured otherwise
        self.n_steps = int(state.get("n_steps", 0))
        self.n_skipped = int(state.get("n_skipped", 0))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        states = self._columns.plan.states if self._columns is not None else {}
        saved = state.get("encoders", {})
        if set(saved) != set(states):
            raise KeyError(f"encoder state for inputs {sorted(saved)}, expected {sorted(states)} (inputs=)")
        for name, value in saved.items():
            states[name].load_dict(value)

    def to_onnx(self) -> ModelProto:
        """The inference model with the trained weights; plain onnxruntime runs it.  With encoders in
        ``inputs=`` it takes the raw columns (one input per source column) and encodes them in its graph."""
        # the live tables are serialized into the copy directly: a table is not copied twice
        model = self.prepared.inference_model({**self._weights(copy=False), **self.running_statistics(),
                                               **{k: v.copy() for k, v in self.host_arrays.items()}})
        return model if self._columns is None else self._columns.export(model)


reexport("streamfit", globals(), ["Trainer"])  # streamfit.Trainer
