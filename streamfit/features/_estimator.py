"""How an estimator with ``inputs=`` meets the column plan: its declared inputs, its encoders' committed
state (saved by ``state_dict``), Arrow tables turned into ``{model input name: array}``, and what a stream
reads ahead with and hands back once rows are trained (:class:`StreamInputs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from streamfit.features._encoders import Encoder, EncoderState

__all__ = ["model_inputs_of", "encoder_states", "arrow_inputs", "encoder_state_dict", "load_encoder_state",
           "note_plan", "export_model", "StreamInputs", "stream_inputs"]


def model_inputs_of(estimator: Any) -> tuple[Any, ...] | None:
    """The estimator's declared model inputs (``ModelInput``), before or after it is fitted; None when
    they are not known before fitting (models built from the data that do not declare them)."""
    trainer = getattr(estimator, "trainer_", None)
    if trainer is not None:
        return tuple(trainer.model_inputs)
    declared = getattr(estimator, "_declared_inputs", None)
    if declared is not None:
        return declared()
    model = getattr(estimator, "model", None)
    if model is None:
        return None
    import onnx

    from streamfit._engine.prepare.model import _model_input, load_model

    try:
        proto = onnx.load(model, load_external_data=False) if isinstance(model, str) else load_model(model)
    except Exception:
        return None  # the estimator reports an unreadable model when it is built
    inits = {i.name for i in proto.graph.initializer}
    return tuple(_model_input(vi) for vi in proto.graph.input if vi.name not in inits)


def encoder_states(estimator: Any) -> dict[str, EncoderState]:
    """The committed encoder states of ``estimator`` by input name (created, empty, on first use)."""
    inputs = getattr(estimator, "inputs", None) or {}
    states = estimator.__dict__.get("encoder_states_")
    if states is None:
        states = {}
        estimator.encoder_states_ = states
    for name, spec in inputs.items():
        if isinstance(spec, Encoder) and name not in states:
            states[name] = spec.new_state()
    return states


def note_plan(estimator: Any, plan: Any) -> None:
    """Record on the estimator the columns and per-row shapes ``plan`` (a ColumnMapping) resolved: what the
    exported model's raw inputs take."""
    columns = estimator.__dict__.setdefault("input_columns_", {})
    for c, info in plan.column_info.items():
        columns.setdefault(c, info)
    shapes = estimator.__dict__.setdefault("input_shapes_", {})
    for name, shape in plan.row_shapes.items():
        shapes.setdefault(name, list(shape))


@dataclass
class StreamInputs:
    """A stream's side of an estimator with ``inputs=``: the model inputs it declares, the encoders' states the
    stream reads ahead with (a copy), and :meth:`trained`, which brings the estimator's committed states to
    the trained rows: the stream layer writes no estimator state itself."""

    estimator: Any
    model_inputs: tuple[Any, ...]
    #: the encoders' states the stream's plan learns into as it reads ahead (a copy of the committed ones)
    read_ahead: dict[str, EncoderState]
    _committed: dict[str, EncoderState] = field(repr=False, default_factory=dict)
    _noted: bool = False

    def trained(self, rows: int, plan: Any) -> None:
        """The stream's first ``rows`` good rows were trained under ``plan`` (a
        :class:`~streamfit._columns.plan.ColumnPlan`): the committed encoder states (what ``state_dict`` and
        checkpoints save) advance to them; the first time, the columns and per-row shapes the plan resolved
        are recorded (what the exported model takes)."""
        plan.commit(rows, self._committed)
        if not self._noted:
            note_plan(self.estimator, plan.mapping)
            self._noted = True


def stream_inputs(estimator: Any) -> StreamInputs:
    """The :class:`StreamInputs` of ``estimator`` (what ``OnnxEstimator._stream_inputs`` gives); ValueError
    when it does not declare its model inputs."""
    model_inputs = model_inputs_of(estimator)
    if model_inputs is None:
        raise ValueError(f"inputs= needs an estimator that declares its model inputs "
                         f"({type(estimator).__name__} does not before it is fitted)")
    committed = encoder_states(estimator)  # the estimator's states are the committed ones (checkpoints save them)
    return StreamInputs(estimator, model_inputs, {k: v.copy() for k, v in committed.items()}, committed)


def _columns(estimator: Any) -> Any:
    """The estimator's in-memory column plan (:class:`~streamfit._columns.memory.ColumnInputs`), rebuilt when
    ``inputs`` or the fitted state changes."""
    from streamfit._columns.memory import ColumnInputs

    cached = estimator.__dict__.get("_input_plan")
    key = (id(estimator.inputs), getattr(estimator, "trainer_", None) is not None)
    if cached is None or cached[0] != key:
        model_inputs = model_inputs_of(estimator)
        if model_inputs is None:
            raise ValueError(f"{type(estimator).__name__} does not declare its model inputs before it is fitted: "
                             "inputs= needs an ONNX model")
        cached = (key, ColumnInputs(model_inputs, estimator.inputs, states=encoder_states(estimator)))
        estimator.__dict__["_input_plan"] = cached
    return cached[1]


def arrow_inputs(estimator: Any, table: Any, *, learn: bool = True) -> dict[str, np.ndarray]:
    """``{model input name: array}`` of an Arrow table (or a dict of columns) as the estimator's ``inputs=``
    says (in memory: a bad value raises :class:`~streamfit.exceptions.BadInputError` naming the column and
    the row; the encoders learn from the table at once unless ``learn=False``)."""
    columns = _columns(estimator)
    arrays = columns.arrays(table, learn=learn)
    note_plan(estimator, columns.plan.mapping)
    return arrays


def encoder_state_dict(estimator: Any) -> dict[str, Any]:
    states = estimator.__dict__.get("encoder_states_") or {}
    return {"states": {name: st.to_dict() for name, st in states.items()},
            "columns": {c: dict(v) for c, v in estimator.__dict__.get("input_columns_", {}).items()},
            "shapes": {k: list(v) for k, v in estimator.__dict__.get("input_shapes_", {}).items()}}


def load_encoder_state(estimator: Any, state: Mapping[str, Any]) -> None:
    states = encoder_states(estimator)
    for name, saved in state.get("states", {}).items():
        if name not in states:
            raise ValueError(f"the saved state has an encoder for input {name!r}, which inputs= does not encode")
        states[name].load_dict(saved)
    estimator.input_columns_ = {str(c): {"dtype": str(v["dtype"]), "dims": [int(d) for d in v["dims"]]}
                                for c, v in state.get("columns", {}).items()}
    estimator.input_shapes_ = {str(k): [int(d) for d in v] for k, v in state.get("shapes", {}).items()}
    estimator.__dict__.pop("_input_plan", None)


def export_model(estimator: Any, model: Any) -> Any:
    """``model`` (the trained graph) taking raw columns when ``inputs=`` has encoders, else unchanged."""
    inputs = getattr(estimator, "inputs", None)
    if not inputs or not any(isinstance(v, Encoder) for v in inputs.values()):
        return model
    from streamfit._columns.export import raw_column_model

    return raw_column_model(model, inputs, model_inputs_of(estimator) or (), encoder_states(estimator),
                            estimator.__dict__.get("input_columns_", {}),
                            {k: tuple(v) for k, v in estimator.__dict__.get("input_shapes_", {}).items()})
