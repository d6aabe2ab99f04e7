"""Training artifacts: a model and its compiled fused step graphs in one ONNX file (``streamfit compile``).

Building a step graph needs a gradient builder (onnxruntime-training's, Python <= 3.12, or streamfit's own
for the ready-made models' ops); running one needs only an inference build of onnxruntime >= 1.19.  An
artifact is the built graphs, saved, so a model of any ops trains where onnxruntime-training is absent.

**Why one ONNX file.**  The file is the author's model as it was (``onnx.load`` and
``onnxruntime.InferenceSession`` read it and predict with the initial weights), and the step graphs
are ``training_info`` entries of it (``TrainingInfoProto.algorithm``, the ONNX place for "the graph that
trains this model"), so nothing beside it can get lost or paired with the wrong model, and the step graphs
take the weights as inputs rather than holding a copy.  What the engine needs to run them is typed JSON in
``metadata_props`` (key :data:`KEY`), read into the frozen dataclasses below and checked against the
graphs.  No pickle, no code: loading parses protobuf and JSON only.  A sha256 over the model, the graphs
and the metadata catches a damaged or edited file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import ModelProto, helper

from streamfit._engine.steps.check_plan import CheckPlan
from streamfit.exceptions import ModelError

__all__ = ["KEY", "FORMAT_VERSION", "BATCH_CLASSES", "Artifact", "ArtifactInfo", "OptimizerSpec",
           "StepGraphSpec", "TensorSpec", "read_artifact", "save_artifact", "is_artifact"]

#: metadata key of the artifact's description (its presence makes a model an artifact)
KEY = "streamfit.artifact"
FORMAT_VERSION = 1
#: the batch-size classes a step graph is built for: "small" (fewer than ``large_batch_rows`` rows) and "large"
BATCH_CLASSES = ("small", "large")


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor: numpy dtype name and shape (an int, a symbolic name or None per dim)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer by registered name and constructor parameters, and the state layout it implies."""

    name: str
    params: tuple[tuple[str, Any], ...]
    slots: tuple[str, ...]
    scalar_names: tuple[str, ...]


@dataclass(frozen=True)
class StepGraphSpec:
    """One compiled fused step graph: its batch class, model header and graph interface."""

    batch_class: str
    ir_version: int
    opsets: tuple[tuple[str, int], ...]
    metadata: tuple[tuple[str, str], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: what the step running this graph checks itself (the plan its metadata holds)
    check_plan: CheckPlan


@dataclass(frozen=True)
class ArtifactInfo:
    """Everything the engine needs besides the graphs (what ``metadata_props[KEY]`` holds)."""

    format_version: int
    dtype: str
    input_name: str
    output_name: str
    y_rank: int
    weights: tuple[TensorSpec, ...]
    inputs: tuple[TensorSpec, ...]
    loss: tuple[str, tuple[tuple[str, Any], ...]]
    optimizer: OptimizerSpec
    #: (alpha, l1_ratio), or None: no penalty
    penalty: tuple[float, float] | None
    #: per weight, its optimizer state tensors (``<weight>__<slot>``)
    state: tuple[TensorSpec, ...]
    graphs: tuple[StepGraphSpec, ...]
    large_batch_rows: int
    device_kind: str
    freeze_batchnorm: bool
    seed: int
    compiled_with: str
    checksum: str = ""

    @property
    def weight_names(self) -> list[str]:
        return [w.name for w in self.weights]

    def describe_training(self) -> str:
        """The compiled loss, optimizer and penalty in words (for error messages)."""
        pen = "penalty=None" if self.penalty is None else f"Penalty(alpha={self.penalty[0]}, l1_ratio={self.penalty[1]})"
        opt = ", ".join(f"{k}={v!r}" for k, v in self.optimizer.params)
        loss = ", ".join(f"{k}={v!r}" for k, v in self.loss[1])
        return f"loss={self.loss[0]}({loss}), optimizer={self.optimizer.name}({opt}), {pen}"


@dataclass(frozen=True)
class Artifact:
    """A read artifact: its description, the author's model (without the step graphs) and the step models."""

    info: ArtifactInfo
    model: ModelProto
    steps: Mapping[str, ModelProto]


# -- writing (the graphs are built by :mod:`streamfit._engine.compile`) ----------------------------------------------------------------------------------------

def tensor_spec(name: str, dtype: Any, shape: Sequence[Any]) -> TensorSpec:
    return TensorSpec(name, np.dtype(dtype).name, tuple(d if isinstance(d, (int, str)) or d is None else int(d)
                                                         for d in shape))


def save_artifact(artifact: ModelProto, path: "str | os.PathLike[str]") -> None:
    """Write ``artifact`` to ``path`` atomically (a temporary file, then a rename)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(artifact.SerializeToString())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- JSON form ------------------------------------------------------------------------------------------

def dumps(info: ArtifactInfo) -> str:
    return json.dumps(asdict(info), sort_keys=True, separators=(",", ":"))


def _pairs(value: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((str(k), v) for k, v in value)


def _tensors(value: Any) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(str(t["name"]), str(np.dtype(t["dtype"]).name), tuple(t["shape"])) for t in value)


def _loads(text: str) -> ArtifactInfo:
    """The typed description from its JSON; a missing or mistyped field is a ModelError naming it."""
    try:
        d = json.loads(text)
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelError(f"training artifact format version {version!r}; this streamfit reads version "
                             f"{FORMAT_VERSION} (recompile the model with this streamfit)")
        o = d["optimizer"]
        graphs = tuple(StepGraphSpec(str(g["batch_class"]), int(g["ir_version"]), tuple((str(a), int(b)) for a, b in g["opsets"]),
                                     tuple((str(a), str(b)) for a, b in g["metadata"]), tuple(map(str, g["inputs"])),
                                     tuple(map(str, g["outputs"])),
                                     CheckPlan(tuple(g["check_plan"]["bounded"]), float(g["check_plan"]["alpha"]),
                                               tuple(g["check_plan"]["host"])))
                       for g in d["graphs"])
        pen = d["penalty"]
        return ArtifactInfo(
            int(version), str(np.dtype(d["dtype"]).name), str(d["input_name"]), str(d["output_name"]), int(d["y_rank"]),
            _tensors(d["weights"]), _tensors(d["inputs"]), (str(d["loss"][0]), _pairs(d["loss"][1])),
            OptimizerSpec(str(o["name"]), _pairs(o["params"]), tuple(map(str, o["slots"])), tuple(map(str, o["scalar_names"]))),
            None if pen is None else (float(pen[0]), float(pen[1])), _tensors(d["state"]), graphs,
            int(d["large_batch_rows"]), str(d["device_kind"]), bool(d["freeze_batchnorm"]), int(d["seed"]),
            str(d["compiled_with"]), str(d["checksum"]))
    except ModelError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"the training artifact's description ({KEY!r}) is malformed: {type(exc).__name__}: {exc}") from exc


def _digest(info: ArtifactInfo, model: ModelProto) -> str:
    """sha256 over the description (checksum field empty), the model without its description, and the graphs."""
    h = hashlib.sha256(dumps(ArtifactInfo(**{**_fields(info), "checksum": ""})).encode())
    bare = ModelProto()
    bare.CopyFrom(model)
    entries = list(bare.training_info)
    del bare.training_info[:]
    kept = [p for p in bare.metadata_props if p.key != KEY]
    del bare.metadata_props[:]
    bare.metadata_props.extend(kept)
    h.update(bare.SerializeToString(deterministic=True))
    for entry in entries:
        h.update(entry.algorithm.SerializeToString(deterministic=True))
    return h.hexdigest()


def _fields(info: ArtifactInfo) -> dict[str, Any]:
    return {f: getattr(info, f) for f in info.__dataclass_fields__}


def with_checksum(info: ArtifactInfo, model: ModelProto) -> ArtifactInfo:
    return ArtifactInfo(**{**_fields(info), "checksum": _digest(info, model)})


# -- reading ---------------------------------------------------------------------------------------------

def is_artifact(model: ModelProto) -> bool:
    return any(p.key == KEY for p in model.metadata_props)


def read_artifact(model: ModelProto) -> Artifact:
    """The artifact in ``model`` (checked: format version, checksum, graphs against their description)."""
    text = next((p.value for p in model.metadata_props if p.key == KEY), None)
    if text is None:
        raise ModelError(f"not a training artifact (no {KEY!r} metadata); make one with `streamfit compile`")
    info = _loads(text)
    if _digest(info, model) != info.checksum:
        raise ModelError("the training artifact's checksum does not match its content (a damaged or edited file); "
                         "compile it again")
    if len(model.training_info) != len(info.graphs):
        raise ModelError(f"the training artifact describes {len(info.graphs)} step graphs but holds "
                         f"{len(model.training_info)}")
    steps: dict[str, ModelProto] = {}
    for spec, entry in zip(info.graphs, model.training_info):
        graph = entry.algorithm
        if spec.batch_class not in BATCH_CLASSES or spec.batch_class in steps:
            raise ModelError(f"the training artifact has an unknown or repeated batch class {spec.batch_class!r}")
        if tuple(i.name for i in graph.input) != spec.inputs or tuple(o.name for o in graph.output) != spec.outputs:
            raise ModelError(f"the training artifact's {spec.batch_class}-batch graph does not have the inputs and "
                             "outputs its description lists")
        step = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in spec.opsets])
        step.ir_version = spec.ir_version
        step.graph.name = f"streamfit_step_{spec.batch_class}"
        step.metadata_props.extend(onnx.StringStringEntryProto(key=k, value=v) for k, v in spec.metadata)
        steps[spec.batch_class] = step
    bare = ModelProto()
    bare.CopyFrom(model)
    del bare.training_info[:]
    kept = [p for p in bare.metadata_props if p.key != KEY]
    del bare.metadata_props[:]
    bare.metadata_props.extend(kept)
    return Artifact(info, bare, steps)


def unavailable_kernels_hint(exc: BaseException) -> str:
    """What to do when onnxruntime refuses a step graph's op (empty for other failures): the graph holds a
    kernel this onnxruntime lacks, typically one of onnxruntime-training's gradient kernels on an inference
    build."""
    import re

    found = re.search(r"([\w.]+:\w+)\(-?\d+\) is not a registered function/op", str(exc))
    if found is None:
        return ""
    return (f"; {found.group(1)} is a kernel this onnxruntime does not have (onnxruntime-training's gradient kernels "
            "exist in training builds only, Python <= 3.12): compile the model again with step graphs of standard "
            "ops (`streamfit compile --gradient streamfit` where its ops allow it), or train it where "
            "onnxruntime-training is installed")


def check_compiled(info: ArtifactInfo, loss: Any, optimizer: Any, penalty: Any, step: str, device_kind: str,
                   weights: Any, input_name: Any, output_name: Any) -> tuple[Any, Any, Any]:
    """The artifact's loss, optimizer and penalty objects; what a trainer was given must agree with them
    (None: take the artifact's), since the graphs hold them."""
    from streamfit.losses import get_loss
    from streamfit.optim import get_optimizer
    from streamfit.penalties import Penalty

    compiled_loss = get_loss(info.loss[0], **dict(info.loss[1]))
    compiled_opt = get_optimizer(info.optimizer.name, **dict(info.optimizer.params))
    if tuple(compiled_opt.slots) != info.optimizer.slots or tuple(compiled_opt.scalar_names) != info.optimizer.scalar_names:
        raise ModelError(f"the artifact's optimizer {info.optimizer.name!r} had state {info.optimizer.slots} and scalars "
                         f"{info.optimizer.scalar_names}; this streamfit's has {compiled_opt.slots} and "
                         f"{compiled_opt.scalar_names}: compile the model again")
    compiled_pen = None if info.penalty is None else Penalty(*info.penalty)
    given = []
    if loss is not None and get_loss(loss) != compiled_loss:
        given.append(f"loss={get_loss(loss)!r}")
    if optimizer is not None:
        opt = get_optimizer(optimizer)
        if type(opt) is not type(compiled_opt) or opt.get_params() != compiled_opt.get_params():
            given.append(f"optimizer={opt!r}")
    if penalty is not None and (float(penalty.alpha), float(penalty.l1_ratio)) != info.penalty:
        given.append(f"penalty={penalty!r}")
    if given:
        raise ModelError(f"this training artifact was compiled with {info.describe_training()}, but the trainer "
                         f"was given {', '.join(given)}; pass those (or None), or compile again with the new ones")
    if step != "fused":
        raise ModelError(f"a training artifact holds fused step graphs only; step={step!r} needs the gradient graph "
                         "(the original model and onnxruntime-training)")
    if device_kind != info.device_kind:
        raise ModelError(f"this training artifact was compiled for device {info.device_kind!r}, not {device_kind!r}; "
                         f"compile it with --device {device_kind}")
    for what, value, compiled in (("weights", weights, info.weight_names), ("input_name", input_name, info.input_name),
                                  ("output_name", output_name, info.output_name)):
        if value is not None and (list(value) if what == "weights" else value) != compiled:
            raise ModelError(f"this training artifact was compiled with {what}={compiled!r}, not {value!r}")
    return compiled_loss, compiled_opt, compiled_pen
