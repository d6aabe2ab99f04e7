"""Which initializers are weights: the rule that keeps exporter-made constants out of training, and what the
exporter did to the others, in words (``streamfit check`` prints both).

**The rule.**  A float initializer is a *constant*, frozen by default, when it is a scalar (rank 0) or has one
element and is read only as a ``Where``'s fill value.  PyTorch's dynamo exporter stores its constants so
(attention scales, GELU's 0.5 / 0.044715 / sqrt(2/pi), a mask's 0 and -3.4e38 fill values, LayerNorm's
epsilon); a model's own parameters are tensors (a one-output head's bias has shape [1] and trains).
``weights=[...]`` trains exactly the names given (a scalar too); ``freeze=[...]`` keeps more out.

**What the exporter did** (:func:`describe_weights`): a trained initializer without a parameter's name
(``onnx::MatMul_12``, ``val_70``, ``embedding_2``) is a tensor the exporter computed from parameters at export
(a transposed Linear weight trains the same; a folded slice of an embedding table or a merged copy trains apart
from its source); one equal to (the transpose of) another trained initializer is an untied copy of a tied
weight (GPT-2's input and output embeddings), trained separately.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from onnx import ModelProto, StringStringEntryProto, TensorProto, numpy_helper

__all__ = ["RULE", "constant_reason", "exporter_made", "describe_weights", "WeightNote", "WEIGHTS_KEY",
           "TrainedSet", "stamp_trained_set", "trained_set_of"]

#: the ``metadata_props`` key of an exported model (``to_onnx()``, checkpoints) saying what trained
WEIGHTS_KEY = "streamfit.weights"

RULE = ("a float initializer is a constant (frozen) when it is a scalar (rank 0) or has one element and is read "
        "only as a Where's fill value; weights= trains exactly the names given, freeze= keeps more out")

# names exporters give tensors they make (not a module's parameter path)
_EXPORTER_NAME = re.compile(r"^(onnx::|val_\d+$|_val_\d+|embedding(_\d+)?$|scalar_tensor|zeros(_\d+)?$|"
                            r"ones(_\d+)?$|/|const(ant)?_|Constant_|_v_\d+$)")


def exporter_made(name: str) -> bool:
    """``name`` looks made by an exporter (``onnx::Add_5``, ``val_12``, ``/layer/Constant_output_0``), not a
    parameter's path (``encoder.layer.0.attention.self.query.weight``)."""
    return bool(_EXPORTER_NAME.match(name))


def constant_reason(init: TensorProto, uses: Iterable[tuple[str, int]]) -> str | None:
    """Why the float initializer ``init`` is a constant under the rule (None: it is a weight)."""
    size = int(np.prod(init.dims)) if init.dims else 1
    if not init.dims:
        return "a scalar (rank 0)"
    uses = set(uses)
    if size == 1 and uses and all(op == "Where" and i in (1, 2) for op, i in uses):
        return "one element, read only as a Where's fill value"
    return None


@dataclass(frozen=True)
class WeightNote:
    """One initializer and what it is: ``trained``, or ``constant`` and why."""

    name: str
    shape: tuple[int, ...]
    trained: bool
    why: str

    @property
    def frozen(self) -> bool:
        """Kept out by the user (``freeze=``), not by the rule."""
        return not self.trained and self.why == "freeze="

    def line(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        if self.frozen:
            return f"frozen   {self.name} [{shape}]: kept out by freeze="
        return f"{'trained ' if self.trained else 'constant'} {self.name} [{shape}]: {self.why}"


def _untied_source(name: str, value: np.ndarray, others: dict[str, np.ndarray]) -> str | None:
    """The other initializer ``value`` equals (or the transpose of which it is), if any."""
    for other, v in others.items():
        if other == name or v.size != value.size or v.ndim != value.ndim:
            continue
        if v.shape == value.shape and np.array_equal(v, value):
            return other
        if v.ndim == 2 and v.shape == value.shape[::-1] and np.array_equal(v.T, value):
            return f"{other} (transposed)"
    return None


def describe_weights(initializers: Sequence[TensorProto], weights: Sequence[str],
                     reasons: dict[str, str]) -> list[WeightNote]:
    """What each float initializer of a prepared model is: the trained ones (with what the exporter did to
    them), the constants with ``reasons`` (name -> why)."""
    floats = {i.name: i for i in initializers if i.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE)}
    trained = set(weights)
    matrices = {n: numpy_helper.to_array(i) for n, i in floats.items()
                if n in trained and len(i.dims) >= 2 and int(np.prod(i.dims)) <= 1 << 22 and i.raw_data}
    notes = []
    for name, init in floats.items():
        shape = tuple(int(d) for d in init.dims)
        if name in trained:
            why = "a parameter"
            if exporter_made(name):
                source = _untied_source(name, matrices[name], matrices) if name in matrices else None
                why = (f"an untied copy of {source}: the exporter untied a tied weight, each trains on its own"
                       if source else "made by the exporter from parameters (a transposed or folded tensor, "
                       "trained as its own weight)")
            notes.append(WeightNote(name, shape, True, why))
        elif name in reasons:
            notes.append(WeightNote(name, shape, False, reasons[name]))
    return notes


def weight_report(initializers: Sequence[TensorProto], weights: Sequence[str], reasons: dict[str, str]) -> list[str]:
    """Lines for ``streamfit check``: how many initializers train, each constant and why, each trained tensor the
    exporter made (and what it is)."""
    notes = describe_weights(initializers, weights, reasons)
    made = [n for n in notes if n.trained and n.why != "a parameter"]
    frozen = [n for n in notes if n.frozen]
    constants = [n for n in notes if not n.trained and not n.frozen]
    by_user = f", {len(frozen)} frozen by freeze=" if frozen else ""
    lines = [f"weights: {len(weights)} initializers train ({len(made)} made by the exporter), "
             f"{len(constants)} constants{by_user}; the rule: {RULE}"]
    lines += [f"  {n.line()}" for n in frozen + constants + made]
    return lines


@dataclass(frozen=True)
class TrainedSet:
    """Which initializers a run trained and which it kept constant, and why: what ``to_onnx()`` stamps into the
    model it exports (``metadata_props[WEIGHTS_KEY]``), so ``streamfit inspect`` of a checkpoint can say it."""

    weights: tuple[str, ...]
    constants: dict[str, str]

    def to_json(self) -> str:
        return json.dumps({"weights": list(self.weights), "constants": self.constants, "rule": RULE})


def stamp_trained_set(model: ModelProto, weights: Sequence[str], constants: dict[str, str]) -> None:
    """Write ``weights`` and ``constants`` into ``model``'s metadata (replacing an earlier stamp)."""
    kept = [p for p in model.metadata_props if p.key != WEIGHTS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.append(StringStringEntryProto(key=WEIGHTS_KEY,
                                                       value=TrainedSet(tuple(weights), dict(constants)).to_json()))


def trained_set_of(model: ModelProto) -> TrainedSet | None:
    """The stamp :func:`stamp_trained_set` wrote (None: a model exported before it, or not by streamfit)."""
    text = next((p.value for p in model.metadata_props if p.key == WEIGHTS_KEY), None)
    if text is None:
        return None
    try:
        data = json.loads(text)
        return TrainedSet(tuple(str(w) for w in data["weights"]),
                          {str(k): str(v) for k, v in dict(data["constants"]).items()})
    except (ValueError, KeyError, TypeError):
        return None
