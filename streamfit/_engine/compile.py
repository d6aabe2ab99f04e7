"""Compiling a training artifact (``streamfit compile``): the fused step graphs of a model, built once and saved
with it (the format is :mod:`streamfit._engine.artifact`)."""

from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime
from onnx import ModelProto

from streamfit import __version__
from streamfit._engine.artifact import (BATCH_CLASSES, FORMAT_VERSION, KEY, ArtifactInfo, OptimizerSpec, StepGraphSpec,
                                        dumps, is_artifact, tensor_spec, with_checksum)
from streamfit._engine.common.names import Names
from streamfit._engine.gradient.portable import needs_training_build
from streamfit._engine.prepare.model import load_model
from streamfit._engine.steps.check_plan import CheckPlan
from streamfit._engine.steps.fused import FusedStep
from streamfit._engine.steps.step_graphs import build_fused
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError
from streamfit.losses import get_loss
from streamfit.optim import get_optimizer

__all__ = ["compile_artifact"]


def _graph_spec(batch_class: str, model: ModelProto) -> StepGraphSpec:
    return StepGraphSpec(batch_class, int(model.ir_version), tuple((o.domain, int(o.version)) for o in model.opset_import),
                         tuple((p.key, p.value) for p in model.metadata_props),
                         tuple(i.name for i in model.graph.input), tuple(o.name for o in model.graph.output),
                         CheckPlan.of(model))


def _probe_rank(trainer: Any) -> int:
    """The rank of the trained output, from one prediction on a batch of one row of zeros."""
    arrays = {}
    for spec in trainer.model_inputs:
        shape = tuple(1 if i == 0 or not isinstance(d, int) else d for i, d in enumerate(spec.shape))
        arrays[spec.name] = np.zeros(shape, spec.dtype)
    X = arrays[trainer.model_inputs[0].name] if len(arrays) == 1 else arrays
    return int(np.ndim(trainer.predict(X)))


def compile_artifact(model: "str | os.PathLike[str] | bytes | ModelProto", *, loss: Any = "squared_error",
                     optimizer: Any = "sgd", penalty: Any = None, batch_classes: Sequence[str] = BATCH_CLASSES,
                     weights: Sequence[str] | None = None, input_name: str | None = None,
                     output_name: str | None = None, device: str = "cpu", freeze_batchnorm: bool = False,
                     seed: int = 0, gradient: str = "auto") -> ModelProto:
    """Build the fused step graphs of ``model`` for ``loss``/``optimizer``/``penalty`` and return the artifact.

    Needs a gradient builder for the model (``gradient``, as :class:`~streamfit.Trainer` takes it:
    onnxruntime-training's, or streamfit's own for the ops of the ready-made models).  The learning rate and
    its schedule stay free: they are inputs of the graphs.  Row-sparse tables are compiled as dense weights.
    """
    classes = tuple(dict.fromkeys(batch_classes))
    if not classes or any(c not in BATCH_CLASSES for c in classes):
        raise ValueError(f"batch_classes must be a non-empty subset of {BATCH_CLASSES}, got {tuple(batch_classes)!r}")
    source = load_model(model)
    if is_artifact(source):
        raise ModelError("this model is already a training artifact; compile the original model")
    trainer = Trainer(source, weights=weights, input_name=input_name, output_name=output_name, loss=loss,
                      optimizer=optimizer, penalty=penalty, device=device, step="fused", sparse=False,
                      freeze_batchnorm=freeze_batchnorm, seed=seed, gradient=gradient,  # type: ignore[arg-type]
                      portable=True)  # training-only kernels rewritten: the artifact runs on inference builds
    _check_rebuildable(trainer)
    pm, opt, pen = trainer.prepared, trainer.optimizer, trainer.penalty
    y_rank = _probe_rank(trainer)
    host_checks = trainer.device.kind == "cpu"
    assert trainer.graphs is not None  # a trainer of a model (not of an artifact) has its gradient graphs
    steps = {c: build_fused(pm, trainer.graphs, trainer.loss, opt, pen, y_rank, large_batch=c == "large",
                            host_checks=host_checks) for c in classes}
    for c, report in needs_training_build(steps).items():
        warnings.warn(f"the {c}-batch step graph of this artifact {report}: it trains only where "
                      f"onnxruntime-training is installed", stacklevel=2)
    info = _artifact_info(trainer, y_rank, steps, bool(freeze_batchnorm), int(seed))
    out = _with_step_graphs(source, steps)
    info = with_checksum(info, out)
    out.metadata_props.append(onnx.StringStringEntryProto(key=KEY, value=dumps(info)))
    return out


def _check_rebuildable(trainer: Trainer) -> None:
    """The trainer's loss and optimizer must be ones streamfit rebuilds from a name and parameters."""
    for kind, obj, rebuild in (("loss", trainer.loss, get_loss), ("optimizer", trainer.optimizer, get_optimizer)):
        try:
            same = rebuild(obj.name, **obj.get_params())
        except Exception as exc:
            raise ModelError(f"the {kind} {obj!r} is not one streamfit can rebuild by name: an artifact holds "
                             f"names and parameters, not code") from exc
        if type(same) is not type(obj) or same.get_params() != obj.get_params():
            raise ModelError(f"the {kind} {obj!r} is not one streamfit can rebuild by name "
                             f"(a subclass?): an artifact holds names and parameters, not code")


def _artifact_info(trainer: Trainer, y_rank: int, steps: dict[str, ModelProto], freeze_batchnorm: bool,
                   seed: int) -> ArtifactInfo:
    """The description of the artifact (checksum not yet set)."""
    pm, opt, pen = trainer.prepared, trainer.optimizer, trainer.penalty
    state = [tensor_spec(Names.slot(w, slot), arr.dtype, arr.shape)
             for w in pm.weights for slot, arr in opt.init_state(pm.initial[w]).items()]
    return ArtifactInfo(
        FORMAT_VERSION, pm.dtype.name, pm.input_name, pm.output_name, y_rank,
        tuple(tensor_spec(w, pm.initial[w].dtype, pm.initial[w].shape) for w in pm.weights),
        tuple(tensor_spec(i.name, i.dtype, i.shape) for i in pm.inputs),
        (trainer.loss.name, tuple(sorted(trainer.loss.get_params().items()))),
        OptimizerSpec(opt.name, tuple(sorted(opt.get_params().items())), tuple(opt.slots), tuple(opt.scalar_names)),
        None if pen is None else (float(pen.alpha), float(pen.l1_ratio)), tuple(state),
        tuple(_graph_spec(c, m) for c, m in steps.items()), FusedStep.large_batch_rows, trainer.device.kind,
        freeze_batchnorm, seed, f"streamfit {__version__}, onnxruntime {onnxruntime.__version__}")


def _with_step_graphs(source: ModelProto, steps: dict[str, ModelProto]) -> ModelProto:
    """A copy of ``source`` holding the step graphs as its ``training_info`` entries."""
    out = ModelProto()
    out.CopyFrom(source)
    del out.training_info[:]
    for c, m in steps.items():
        entry = onnx.TrainingInfoProto()
        entry.algorithm.CopyFrom(m.graph)
        entry.algorithm.name = f"streamfit_step_{c}"
        out.training_info.append(entry)
    out.ir_version = max(out.ir_version, 7)  # training_info needs IR >= 7
    return out
