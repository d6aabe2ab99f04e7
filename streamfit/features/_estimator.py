"""How an estimator with ``inputs=`` meets the column plan: its declared inputs, its encoders' committed
state (saved by ``state_dict``), and Arrow tables turned into ``{model input name: array}``."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from streamfit.features._encoders import Encoder, EncoderState

__all__ = ["model_inputs_of", "encoder_states", "arrow_inputs", "encoder_state_dict", "load_encoder_state",
           "column_types"]


def model_inputs_of(estimator: Any) -> tuple[Any, ...] | None:
    """The estimator's declared model inputs (``ModelInput``), before or after it is fitted; None when
    they are not known before fitting (models built from the data)."""
    trainer = getattr(estimator, "trainer_", None)
    if trainer is not None:
        return tuple(trainer.model_inputs)
    model = getattr(estimator, "model", None)
    if model is None:
        return None
    import onnx

    from streamfit._engine.model import _model_input, load_model

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


def column_types(estimator: Any) -> dict[str, str]:
    """The Arrow column -> numpy dtype name (``"str"`` for strings) the estimator was trained from (what the
    exported model's raw inputs take)."""
    return estimator.__dict__.setdefault("input_columns_", {})


def note_column_types(estimator: Any, schema: pa.Schema, columns: list[str]) -> None:
    from streamfit.features._values import kind_of

    seen = column_types(estimator)
    for c in columns:
        if c in seen:
            continue
        t = schema.field(schema.get_field_index(c)).type
        if isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            t = t.value_type
        if kind_of(t) == "string":
            seen[c] = "str"
        else:
            try:
                seen[c] = np.dtype(t.to_pandas_dtype()).name
            except (NotImplementedError, TypeError):
                seen[c] = "float64"


def _plan(estimator: Any) -> Any:
    from streamfit._stream.inputs import InputPlan

    plan = estimator.__dict__.get("_input_plan")
    key = (id(estimator.inputs), getattr(estimator, "trainer_", None) is not None)
    if plan is None or plan[0] != key:
        model_inputs = model_inputs_of(estimator)
        if model_inputs is None:
            raise ValueError(f"{type(estimator).__name__} does not declare its model inputs before it is fitted: "
                             "inputs= needs an ONNX model")
        plan = (key, InputPlan(model_inputs, estimator.inputs, states=encoder_states(estimator)), {})
        estimator.__dict__["_input_plan"] = plan
    return plan


def arrow_inputs(estimator: Any, table: "pa.Table | pa.RecordBatch") -> dict[str, np.ndarray]:
    """``{model input name: array}`` of an Arrow table as the estimator's ``inputs=`` says (in memory: a
    bad value raises :class:`~streamfit.exceptions.BadInputError` naming the column and the row; the
    encoders learn from the table at once)."""
    from streamfit._stream.columns import ColumnProblem
    from streamfit.exceptions import BadInputError

    if isinstance(table, pa.Table):
        table = table.combine_chunks()
        batches = table.to_batches()
        batch = batches[0] if len(batches) == 1 else pa.RecordBatch.from_arrays(
            [pa.array([], type=f.type) for f in table.schema], schema=table.schema)
    else:
        batch = table
    _, plan, compiled_by_schema = _plan(estimator)
    try:
        compiled = compiled_by_schema.get(batch.schema)
        if compiled is None:
            compiled = compiled_by_schema.setdefault(batch.schema, plan.compile(batch.schema))
            note_column_types(estimator, batch.schema, plan.columns)
        arrays, checks = plan.extract(batch, compiled)
        if checks:
            reason, column, mask, values = checks[0]
            row = int(np.argmax(mask))
            raise BadInputError(f"column '{column}' has a bad value at row {row} ({reason}: {values[row]!r})",
                                reason=reason, column=column)
        arrays.update(plan.encode(batch, compiled, None))
    except ColumnProblem as p:
        raise BadInputError(p.message, reason=p.reason, column=p.column) from None
    return arrays


def encoder_state_dict(estimator: Any) -> dict[str, Any]:
    states = estimator.__dict__.get("encoder_states_") or {}
    return {"states": {name: st.to_dict() for name, st in states.items()}, "columns": dict(column_types(estimator))}


def load_encoder_state(estimator: Any, state: Mapping[str, Any]) -> None:
    states = encoder_states(estimator)
    for name, saved in state.get("states", {}).items():
        if name not in states:
            raise ValueError(f"the saved state has an encoder for input {name!r}, which inputs= does not encode")
        states[name].load_dict(saved)
    estimator.input_columns_ = {str(k): str(v) for k, v in state.get("columns", {}).items()}
    estimator.__dict__.pop("_input_plan", None)
