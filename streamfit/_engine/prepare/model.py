"""Model preparation: load an ONNX model, make it loadable by onnxruntime 1.19, pick what to train.

**The inputs contract** (what the engine takes, what the column plan produces):

* :class:`ModelInput` ``(name, dtype, shape)`` is one non-weight graph input: its declared element type
  as a numpy dtype and its declared shape (dim 0 the batch; an int is a fixed dim, a str a named
  symbolic dim, None an unnamed one).  ``Trainer.model_inputs`` lists them in model order.
* ``Trainer.step(X, y, sample_weight=None)``, ``Trainer.predict(X)`` and ``Trainer.forward(X)`` take ``X``
  as an ndarray (one-input models, or the input named by ``input_name``) or a ``Mapping[str, ndarray]``
  keyed by model input name (any model).  Every input keeps its declared dtype (float16/32/64, int32/64,
  bool, ...) and shape (N-D): float inputs accept any real numbers (cast to the declared float type),
  integer inputs integers (or bool), bool inputs bool; nothing is cast to the weights' float type.
  A mismatch (unknown or missing name, element kind, rank, fixed dim, row counts) is an
  :class:`~streamfit.exceptions.InputMismatchError` (a ``ModelError`` and a ``BadInputError``) naming
  the input and what was expected, raised the first time a batch shape is seen, never a raw
  onnxruntime error.
* Estimators (``OnnxRegressor``, ``OnnxClassifier``) take ``inputs=None`` (model input name -> column
  name | list of column names | encoder object; the column plan gives it meaning for Arrow data),
  ``input_name=None`` and ``output_name=None``.  In memory ``X`` is an ndarray (one-input models), a
  dict ``{input name: array}``, or an Arrow Table/RecordBatch, turned into such a dict by
  ``OnnxEstimator._arrow_inputs(table)`` when ``inputs`` is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from streamfit._engine.common.onnx_helpers import copy_fields, default_opset
from streamfit._engine.prepare.constants import constant_reason, stamp_trained_set
from streamfit._engine.prepare.embedding_bag import rewrite_embedding_bags
from streamfit._engine.prepare.large_initializers import attach, load_holding
from streamfit._engine.prepare.recurrent import rnn_layouts
from streamfit._engine.prepare.randomness import eval_random_ops, random_nodes, seed_random_ops
from streamfit._engine.prepare.running_stats import RunningStats, eval_semantics
from streamfit._engine.prepare.sklearn_ops import ML, rewrite_ml_ops
from streamfit._engine.prepare.trainable_ops import make_trainable
from streamfit.exceptions import ModelError

__all__ = ["ModelInput", "PreparedModel", "prepare_model", "load_model"]

#: Highest IR version and default-domain opset onnxruntime 1.19 loads.
MAX_IR_VERSION = 10
MAX_OPSET = 21
#: Lowest default-domain opset our loss/update nodes are written for (ReduceSum with an axes input).
MIN_OPSET = 13

# (op_type, input index) pairs where an initializer is a shape, axis, index, bound or statistic, not a weight.
_STRUCTURAL = {
    ("Reshape", 1), ("Expand", 1), ("Tile", 1), ("Squeeze", 1), ("Unsqueeze", 1), ("Pad", 1), ("Pad", 2),
    ("Pad", 3), ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4), ("Resize", 1), ("Resize", 2),
    ("Resize", 3), ("Upsample", 1), ("Clip", 1), ("Clip", 2), ("OneHot", 1), ("OneHot", 2),
    ("ConstantOfShape", 0), ("Range", 0), ("Range", 1), ("Range", 2), ("TopK", 1), ("Split", 1),
    ("Gather", 1), ("GatherElements", 1), ("GatherND", 1), ("ScatterElements", 1), ("ScatterND", 1),
    ("BatchNormalization", 3), ("BatchNormalization", 4), ("Dropout", 1), ("Dropout", 2), ("Pow", 1),
    ("CumSum", 1), ("Trilu", 1), ("ReduceSum", 1), ("ReduceMean", 1), ("ReduceMax", 1), ("ReduceMin", 1),
    ("ReduceProd", 1), ("ReduceL2", 1), ("ReduceL1", 1), ("ReduceLogSumExp", 1), ("ReduceSumSquare", 1),
}
# (op_type, input index) pairs where a weight multiplies: these get the penalty; biases (Add, Gemm C) do not.
_MULTIPLICATIVE = {("MatMul", 0), ("MatMul", 1), ("Gemm", 0), ("Gemm", 1), ("Conv", 1), ("ConvTranspose", 1),
                   ("Gather", 0), ("Mul", 0), ("Mul", 1), ("Einsum", 0), ("Einsum", 1)}
# Inputs through which no gradient flows (comparisons, shapes, conditions): a float initializer reaching the
# output only through these is a constant, not a weight (dynamo's softplus threshold, a Where's condition).
_NO_GRAD_OPS = {"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor", "Shape",
                "Size", "ArgMax", "ArgMin", "NonZero", "Round", "Floor", "Ceil", "Sign", "IsNaN", "IsInf",
                "ConstantOfShape", "EyeLike", "RandomNormalLike", "RandomUniformLike", "Bernoulli"}
_NO_GRAD_INPUTS = {("Where", 0), ("LayerNormalization", 3)} | _STRUCTURAL
_FLOATS: dict[int, np.dtype] = {TensorProto.FLOAT: np.dtype(np.float32), TensorProto.DOUBLE: np.dtype(np.float64)}
_ANY_FLOAT = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
# Element types an IR-10 model may hold (IR 11+ adds FLOAT4E2M1 and later types).
_IR10_TYPES = set(range(0, 23))


@dataclass(frozen=True)
class ModelInput:
    """One non-weight input of a model: declared element type and shape (dim 0 the batch).

    A dim is an int (fixed), a str (named symbolic dim) or None (unnamed); ``shape`` is ``()`` for
    a scalar input.

    >>> ModelInput("ids", np.dtype(np.int64), (None, 4)).describe()
    "'ids' (int64, shape [N, 4])"
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def shape_text(self) -> str:
        dims = ["N" if i == 0 and not isinstance(d, int) else "?" if d is None else str(d)
                for i, d in enumerate(self.shape)]
        return "[" + ", ".join(dims) + "]"

    def describe(self) -> str:
        return f"{self.name!r} ({self.dtype}, shape {self.shape_text()})"


def _model_input(vi: onnx.ValueInfoProto) -> ModelInput:
    if not vi.type.HasField("tensor_type"):
        raise ModelError(f"input {vi.name!r} is not a tensor; streamfit feeds tensor inputs only")
    tt = vi.type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    except Exception:  # undefined or exotic element types
        dtype = None
    if dtype is None or dtype.kind not in "fiub":
        kind = TensorProto.DataType.Name(tt.elem_type).lower()
        raise ModelError(f"input {vi.name!r} is {kind}; streamfit feeds numeric and bool inputs (encode "
                         "strings into ids outside the graph, e.g. with streamfit.features)")
    shape: tuple[int | str | None, ...] = ()
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                      for d in tt.shape.dim)
    return ModelInput(vi.name, dtype, shape)


@dataclass
class PreparedModel:
    """A model ready for training: loadable by ORT 1.19, one output, what to train and penalize.

    ``inputs`` are the non-weight graph inputs in model order; ``input_name`` is the one an ndarray
    ``X`` feeds (the first unless chosen).

    ``model`` is the training copy (rewritten so its gradient can be built, see
    :mod:`streamfit._engine.prepare.trainable_ops`); ``inference`` is the author's graph, which ``predict`` runs and
    ``to_onnx()`` exports.  Both keep only the trained output.
    """

    model: ModelProto
    input_name: str
    output_name: str
    weights: list[str]
    penalized: set[str]
    dtype: np.dtype
    initial: dict[str, np.ndarray] = field(repr=False)
    notes: list[str] = field(default_factory=list)
    inputs: tuple[ModelInput, ...] = ()
    inference: ModelProto | None = field(default=None, repr=False)
    #: BatchNormalizations whose running statistics training updates (see streamfit._engine.prepare.running_stats)
    running_stats: tuple[RunningStats, ...] = ()
    #: initial values of those statistics (the buffers kept and updated beside the weights)
    buffers: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    #: training and inference differ (batch statistics, dropout): progressive validation predicts separately
    train_differs: bool = False
    #: host tensors: initializers that no step trains or updates but whose values the caller changes between
    #: steps (a standardization's mean and scale kept by the estimator); initial values.  The gradient
    #: graph takes them as inputs, the trainer binds them from host arrays, ``to_onnx`` exports their values.
    host: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def with_host_inputs(self, model: ModelProto) -> ModelProto:
        """A copy of ``model`` (the training copy or one made from it) with the host tensors as graph inputs."""
        out = ModelProto()
        out.CopyFrom(model)
        if not self.host:
            return out
        kept = [i for i in out.graph.initializer if i.name not in self.host]
        del out.graph.initializer[:]
        out.graph.initializer.extend(kept)
        out.graph.input.extend(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                             list(a.shape)) for name, a in self.host.items())
        return out
    #: trained weights held out of ``model`` and ``inference`` (data-less stubs there; the data is in
    #: ``initial``, see :mod:`streamfit._engine.prepare.large_initializers`)
    held: frozenset[str] = frozenset()
    #: float initializers left out of training and why: the constants rule
    #: (:mod:`streamfit._engine.prepare.constants`) or ``freeze=``
    constants: dict[str, str] = field(default_factory=dict)

    def inference_model(self, values: dict[str, np.ndarray]) -> ModelProto:
        """A copy of the inference model with ``values`` as its initializers (what ``to_onnx`` returns);
        held weights not in ``values`` get their ``initial`` data.  Stamped with what trained
        (:func:`~streamfit._engine.prepare.constants.stamp_trained_set`)."""
        source = self.inference if self.inference is not None else self.model
        out = ModelProto()
        copy_fields(source, out, skip="graph")
        copy_fields(source.graph, out.graph, skip="initializer")  # the initializers replaced are never copied
        for init in source.graph.initializer:
            if init.name in values:
                out.graph.initializer.append(numpy_helper.from_array(np.asarray(values[init.name]), init.name))
            else:
                out.graph.initializer.append(init)
        stamp_trained_set(out, self.weights, self.constants)  # what trained, for `streamfit inspect`
        return attach(out, self.initial)

    def standalone_model(self) -> ModelProto:
        """A copy of the training model with the held weights' data (``initial``) put back."""
        out = ModelProto()
        out.CopyFrom(self.model)
        return attach(out, self.initial)

    def predict_model(self, names: Sequence[str]) -> ModelProto:
        """The inference model with the initializers ``names`` turned into graph inputs (bound per run)."""
        out = ModelProto()
        out.CopyFrom(self.inference if self.inference is not None else self.model)
        attach(out, self.initial, self.held - set(names))
        moved = [init for init in out.graph.initializer if init.name in set(names)]
        kept = [init for init in out.graph.initializer if init.name not in set(names)]
        del out.graph.initializer[:]
        out.graph.initializer.extend(kept)
        out.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in moved)
        return out


def load_model(model: "str | os.PathLike[str] | bytes | ModelProto") -> ModelProto:
    """Load a model from a path, serialized bytes or a ModelProto (copied: the caller's is untouched)."""
    if isinstance(model, ModelProto):
        out = ModelProto()
        out.CopyFrom(model)
        return out
    if not isinstance(model, (bytes, bytearray, str, os.PathLike)):
        raise ModelError(f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        return onnx.load(os.fspath(model))
    except Exception as exc:  # onnx raises DecodeError, OSError, ...: all mean "not a model we can read"
        raise ModelError(f"cannot load the ONNX model: {exc}") from exc


def _used_element_types(model: ModelProto) -> set[int]:
    types = {init.data_type for init in model.graph.initializer}
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if vi.type.HasField("tensor_type"):
            types.add(vi.type.tensor_type.elem_type)
    return types


def _make_loadable(model: ModelProto, notes: list[str]) -> ModelProto:
    """Lower the IR version and convert the opset into what ORT 1.19 accepts, or say why not."""
    versions: dict[str, int] = {}  # skl2onnx may import a domain twice: one entry each, the highest version
    for imp in model.opset_import:
        versions[imp.domain] = max(versions.get(imp.domain, 0), imp.version)
    if len(versions) < len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in versions.items())
    opset = default_opset(model)
    if opset and not MIN_OPSET <= opset <= MAX_OPSET:
        target = min(max(opset, MIN_OPSET), MAX_OPSET)
        try:
            model = onnx.version_converter.convert_version(model, target)
        except Exception as exc:
            raise ModelError(f"the model uses opset {opset}; onnxruntime-training 1.19 needs an opset in "
                             f"[{MIN_OPSET}, {MAX_OPSET}] and the conversion to {target} failed: {exc}") from exc
        notes.append(f"converted opset {opset} -> {target}")
    if model.ir_version > MAX_IR_VERSION:
        newer = _used_element_types(model) - _IR10_TYPES
        if newer:
            raise ModelError(f"the model has IR version {model.ir_version} and uses element types {sorted(newer)} "
                             f"that IR {MAX_IR_VERSION} (the highest onnxruntime 1.19 loads) cannot express")
        notes.append(f"lowered IR version {model.ir_version} -> {MAX_IR_VERSION}")
        model.ir_version = MAX_IR_VERSION
    return model


def _uses(model: ModelProto) -> dict[str, set[tuple[str, int]]]:
    uses: dict[str, set[tuple[str, int]]] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
            uses.setdefault(name, set()).add((op, i))
    return uses


def _reaching(model: ModelProto, output: str) -> set[str]:
    """Tensors with a differentiable path to ``output`` (a gradient can flow from it back to them)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    seen, todo = {output}, [output]
    while todo:
        node = producers.get(todo.pop())
        if node is None or (node.domain in ("", "ai.onnx") and node.op_type in _NO_GRAD_OPS):
            continue
        for i, name in enumerate(node.input):
            if name and name not in seen and (node.op_type, i) not in _NO_GRAD_INPUTS:
                seen.add(name)
                todo.append(name)
    return seen


def _is_trainable_use(use: tuple[str, int]) -> bool:
    return use not in _STRUCTURAL and ":" not in use[0]


def prepare_model(model: "str | os.PathLike[str] | bytes | ModelProto", weights: Sequence[str] | None = None,
                  input_name: str | None = None, output_name: str | None = None, *,
                  freeze_batchnorm: bool = False, seed: int = 0, owned: bool = False,
                  host: Sequence[str] = (), freeze: Sequence[str] = ()) -> PreparedModel:
    """Load ``model`` and decide what to train.

    ``weights=None`` trains every float initializer that feeds computation (not shapes, axes, indices, bounds,
    statistics, inputs of non-differentiable ML-domain ops, constants by ``prepare.constants.RULE``); a list is
    taken in the caller's order; ``freeze`` names more to keep out.  The rest stays frozen, except the ``host``
    tensors (float initializers the caller sets between steps, never trained).  ``owned``: ``model`` is a
    ModelProto nobody else holds, used (and changed) in place instead of copied.
    """
    notes: list[str] = []
    if not isinstance(model, (bytes, bytearray, str, os.PathLike, ModelProto)):
        raise ModelError(f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    try:  # large float initializers come out of the protobufs here, once (see streamfit._engine.prepare.large_initializers)
        proto, held = load_holding(model, owned=owned)
    except Exception as exc:  # onnx raises DecodeError, OSError, ...: all mean "not a model we can read"
        raise ModelError(f"cannot load the ONNX model: {exc}") from exc
    if held and (proto.producer_name == "skl2onnx" or any(n.domain == ML for n in proto.graph.node)):
        attach(proto, held)  # the ML-op rewrites read initializers as constants
        held = {}
    proto = _make_loadable(proto, notes)
    rnn_layouts(proto, notes)  # batch-first LSTM/GRU: layout 0 between Transposes (predicted and exported too)
    graph = proto.graph
    inits = {init.name: init for init in graph.initializer}
    init_names = set(inits)
    inputs = [i.name for i in graph.input if i.name not in init_names]
    if not inputs or not graph.output:
        raise ModelError("the model must have at least one input and one output")
    input_name = _chosen(inputs, input_name, "input")
    output_name = _chosen([o.name for o in graph.output], output_name, "output")
    _keep_output(graph, output_name)
    inits = rewrite_ml_ops(proto, notes)  # ai.onnx.ml linear models -> trainable MatMul + Add (sklearn_ops.py)
    if any(n.op_type == "Loop" for n in graph.node):  # PyTorch's EmbeddingBag loops -> Gather + ReduceSum
        rewrite_embedding_bags(proto, notes)
        inits = {init.name: init for init in graph.initializer}
    model_inputs = _drop_initializer_inputs(graph, init_names)
    uses = _uses(proto)
    reaching = _reaching(proto, output_name)
    weights, constants = _chosen_weights(weights, inits, uses, reaching, output_name, freeze)
    host = _checked_host(host, inits, weights)
    penalized = {w for w in weights if uses.get(w, set()) & _MULTIPLICATIVE}
    frozen = set(held) - set(weights)
    if frozen:  # large frozen initializers stay in the graphs that read them
        attach(proto, held, frozen)
    inference = ModelProto()  # the author's graph: predicted and exported (held weights are stubs in both)
    inference.CopyFrom(proto)
    initial = {w: held[w] if w in held else numpy_helper.to_array(inits[w]).copy() for w in weights}
    stats: list[RunningStats] = []
    proto = make_trainable(proto, notes, freeze_batchnorm=freeze_batchnorm, seed=seed, running_stats=stats)
    if eval_semantics(inference):
        notes.append("BatchNormalization/Dropout exported in training mode: predicted and exported in eval mode")
    buffers = {name: numpy_helper.to_array(inits[name]).astype(_FLOATS.get(inits[name].data_type, np.float32))
               for s in stats for name in (s.mean, s.var)}
    random_ops = _random_ops(proto, inference, seed, notes)  # stochastic depth: random in training only
    differs = bool(stats) or bool(random_ops) or any(n.op_type == "Dropout" for n in proto.graph.node)
    host_values = {name: numpy_helper.to_array(inits[name]).copy() for name in host}
    return PreparedModel(proto, input_name, output_name, list(weights), penalized, _FLOATS[inits[weights[0]].data_type],
                         initial, notes, model_inputs, inference, tuple(stats), buffers, differs, host_values,
                         held=frozenset(w for w in weights if w in held), constants=constants)


def _random_ops(training: ModelProto, inference: ModelProto, seed: int, notes: list[str]) -> int:
    """Random ops a training-mode export spelled out (stochastic depth, dropout by hand): seeded in the training
    copy, their expectation in the inference copy (:mod:`streamfit._engine.prepare.randomness`); how many."""
    count = len(random_nodes(training))
    if count:
        seed_random_ops(training, seed + 1000)
        eval_random_ops(inference)
        notes.append(f"{count} random op(s) (stochastic depth or dropout spelled out): seeded in training, "
                     "their expectation in predict and to_onnx()")
    return count


def _chosen(names: list[str], given: str | None, what: str) -> str:
    """The model input or output ``given`` (the first of ``names`` when None), checked to be one of them."""
    name = given or names[0]
    if name not in names:
        raise ModelError(f"unknown {what} {name!r}; the model's {what}s are {names}")
    return name


def _chosen_weights(weights: Sequence[str] | None, inits: dict[str, TensorProto], uses: dict[str, set[tuple[str, int]]],
                    reaching: set[str], output_name: str, freeze: Sequence[str] = ()
                    ) -> tuple[list[str], dict[str, str]]:
    """The weights to train: those given (checked), or every float initializer that feeds computation and is no
    constant under the rule; less ``freeze``; all float32 or all float64, each reaching the trained output.
    With them, each float initializer left out by the rule or ``freeze``, and why."""
    constants: dict[str, str] = {}
    unknown = [name for name in freeze if name not in inits]
    if unknown:
        raise ModelError(f"freeze names unknown initializers {unknown}; the model's initializers are {sorted(inits)}")
    frozen = set(freeze)
    if weights is None:
        weights = []
        for name, init in inits.items():
            if not (init.data_type in _ANY_FLOAT and name in uses and name in reaching
                    and all(map(_is_trainable_use, uses[name]))):
                continue
            why = "freeze=" if name in frozen else constant_reason(init, uses[name])
            if why is None:
                weights.append(name)
            else:
                constants[name] = why
        if not weights:
            raise ModelError("the model has nothing to train: no float initializer feeds computation "
                             f"(initializers: {sorted(inits) or 'none'})")
    else:
        weights = list(weights)
        if not weights:
            raise ModelError("weights=[] leaves nothing to train")
        for name in weights:
            if name not in inits:
                raise ModelError(f"unknown weight {name!r}; the model's initializers are {sorted(inits)}")
            if inits[name].data_type not in _FLOATS:
                kind = TensorProto.DataType.Name(inits[name].data_type).lower()
                raise ModelError(f"weight {name!r} is {kind}; only float32 and float64 weights can be trained")
        if len(set(weights)) != len(weights):
            raise ModelError(f"weights lists a name twice: {weights}")
        constants.update({name: "freeze=" for name in weights if name in frozen})
        weights = [name for name in weights if name not in frozen]
        if not weights:
            raise ModelError("freeze= leaves none of weights= to train")
    dtypes = {inits[w].data_type for w in weights}
    if len(dtypes) > 1 or not dtypes <= set(_FLOATS):
        kinds = sorted(TensorProto.DataType.Name(d).lower() for d in dtypes)
        raise ModelError(f"trained weights must all be float32 or all float64, got {kinds}")
    unreachable = [w for w in weights if w not in reaching]
    if unreachable:
        raise ModelError(f"weights {unreachable} do not affect output {output_name!r}: no gradient reaches them")
    return list(weights), constants


def _checked_host(host: Sequence[str], inits: dict[str, TensorProto], weights: list[str]) -> list[str]:
    """The host tensors, checked: float initializers of the model, none of them trained."""
    host = list(host)
    for name in host:
        if name not in inits or inits[name].data_type not in _FLOATS:
            raise ModelError(f"host tensor {name!r} must be a float initializer of the model")
        if name in weights:
            raise ModelError(f"{name!r} is both trained and a host tensor; host tensors are set by the caller")
    return host


def _keep_output(graph: onnx.GraphProto, output_name: str) -> None:
    """Train through one output: the others would need gradients nobody provides."""
    kept = [o for o in graph.output if o.name == output_name]
    del graph.output[:]
    graph.output.extend(kept)


def _drop_initializer_inputs(graph: onnx.GraphProto, init_names: set[str]) -> tuple[ModelInput, ...]:
    """The graph inputs without the initializers also listed there (IR < 4 style: plain initializers for us);
    return the model inputs left."""
    real_inputs = [i for i in graph.input if i.name not in init_names]
    del graph.input[:]
    graph.input.extend(real_inputs)
    return tuple(_model_input(vi) for vi in real_inputs)
