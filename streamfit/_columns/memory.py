"""The column plan in memory: Arrow tables (or dicts of columns) -> ``{model input name: array}`` for the
estimators' and :class:`~streamfit.Trainer`'s ``inputs=``."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
from onnx import ModelProto

from streamfit._columns.export import raw_column_model
from streamfit._columns.mapping import assemble
from streamfit._columns.plan import ColumnPlan, SchemaPlan
from streamfit._columns.schema import ColumnProblem
from streamfit.features._encoders import EncoderState

__all__ = ["ColumnInputs", "ModelInputs", "holds_inputs", "as_record_batch"]


def as_record_batch(X: Any) -> pa.RecordBatch:
    """An Arrow Table (its chunks combined), RecordBatch or dict of columns as one record batch."""
    if isinstance(X, pa.RecordBatch):
        return X
    if isinstance(X, pa.Table):
        batches = X.combine_chunks().to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in X.schema], schema=X.schema)
    if isinstance(X, Mapping):
        try:
            return pa.RecordBatch.from_pydict({k: v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v)
                                               for k, v in X.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            from streamfit.exceptions import BadInputError

            raise BadInputError(f"a dict of columns must hold equally long 1-D columns: {exc}",
                                reason="wrong_type") from None
    raise TypeError(f"expected an Arrow Table/RecordBatch or a dict of columns, got {type(X).__name__}")


class ModelInputs(dict):  # type: ignore[type-arg]
    """``{model input name: array}`` a column plan filled (the stream's training batches of named inputs):
    model inputs, never read as columns again, whatever their names."""

    __slots__ = ()


def holds_inputs(X: Any, names: "frozenset[str] | set[str] | Any") -> bool:
    """Whether the mapping ``X`` holds model inputs rather than columns: what a plan filled
    (:class:`ModelInputs`), or arrays a caller keyed by exactly the model's input ``names``; any other
    mapping is columns, to be read through the plan."""
    if type(X) is ModelInputs:
        return True
    return X.keys() == (names.keys() if isinstance(names, Mapping) else
                        names if isinstance(names, (set, frozenset)) else set(names))


class ColumnInputs:
    """The column plan in memory: Arrow tables (or dicts of columns) -> ``{model input name: array}``.

    What :class:`~streamfit.Trainer` and the estimators with ``inputs=`` use for in-memory batches (a
    stream's rebatcher uses the :class:`~streamfit._columns.plan.ColumnPlan` itself).  A schema is checked
    once; a bad value raises :class:`~streamfit.exceptions.BadInputError` naming the column, the row and
    the reason.
    """

    def __init__(self, model_inputs: Sequence[Any], inputs: Mapping[str, Any], *,
                 states: Mapping[str, EncoderState] | None = None) -> None:
        # in memory nothing is cast: the caller converts its columns (the error says how), as with numpy inputs
        self.plan = ColumnPlan.in_memory(model_inputs, inputs, states=states)
        self.inputs = inputs
        self.model_inputs = tuple(model_inputs)
        self.names = frozenset(m.name for m in model_inputs)
        self._compiled: dict[pa.Schema, SchemaPlan] = {}

    @property
    def encodes(self) -> bool:
        """Whether an encoder feeds some model input (then an exported model takes the raw columns)."""
        return any(s.encoder is not None for s in self.plan.sources)

    def export(self, model: ModelProto) -> ModelProto:
        """``model`` taking the raw columns when an encoder feeds it (:mod:`streamfit._columns.export`), else
        ``model`` itself."""
        if not self.encodes:
            return model
        plan = self.plan
        return raw_column_model(model, self.inputs, self.model_inputs, plan.states, plan.column_info,
                                plan.row_shapes)

    def takes(self, X: Any) -> bool:
        """Whether ``X`` is columns: an Arrow table, or a mapping that does not hold the model's inputs
        (:func:`holds_inputs`)."""
        if isinstance(X, (pa.Table, pa.RecordBatch)):
            return True
        return isinstance(X, Mapping) and not holds_inputs(X, self.names)

    def arrays(self, X: Any, *, learn: bool = True) -> dict[str, np.ndarray]:
        """The model inputs of the rows of ``X``; ``learn=False`` encodes without teaching a vocabulary."""
        from streamfit.exceptions import BadInputError

        batch = as_record_batch(X)
        plan = self.plan
        try:
            compiled = self._compiled.get(batch.schema)
            if compiled is None:
                compiled = self._compiled.setdefault(batch.schema, plan.build(batch.schema))
            values = plan.extract(batch, compiled)
            if values.checks:
                reason, column, mask, shown = values.checks[0]
                row = int(np.argmax(mask))
                raise BadInputError(f"column '{column}' has a bad value at row {row} ({reason}: {shown[row]!r})",
                                    reason=reason, column=column)
            n = batch.num_rows
            arrays = {c.name: assemble(n, c, values.inputs[c.name]) for c in compiled.inputs if c.encoder is None}
            arrays.update(plan.encode(batch, compiled, None, learn=learn))
        except ColumnProblem as p:
            raise BadInputError(p.message, reason=p.reason, column=p.column) from None
        return arrays
