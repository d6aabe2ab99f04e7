"""Rebatching: :class:`SourceBatch` record batches of any size in, fixed-size training batches out.

Pure (no I/O, no event loop).  Bad input is handled here by policy (``on_bad="raise"|"skip"``), see
:mod:`streamfit._stream.columns` for the type policy.

Buffer reuse
------------
Separate float columns are written into preallocated ``(batch_size, d)`` buffers in one pass (column
by column, no intermediate stacking), so once the ring is warm no training batch allocates.  A buffer
handed out in a :class:`TrainingBatch` is not written again until ``ring_size`` further training
batches have been produced.  The loop uses ``ring_size = queue_size + IN_FLIGHT_EXTRA``: at most
``queue_size`` batches wait in the queue, one is being trained and one is being filled (or waits to be
sent), so the buffer being refilled is always one the trainer has finished with.  This relies on two
rules the loop keeps: the generators :meth:`Rebatcher.push` / :meth:`Rebatcher.flush` are advanced only
after the previous batch was handed off, and the estimator keeps no reference to ``X``/``y`` after
``partial_fit`` returns.  ``ring_size=None`` allocates fresh arrays for every batch (safe for any use).

A single vector feature column (``FixedSizeList<float, d>`` / ``fixed_shape_tensor``) whose values
have the training dtype is handed out zero-copy (a read-only view of Arrow memory) whenever a whole
training batch lies inside one record batch; otherwise it is copied into the ring like any column.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from streamfit.exceptions import BadInputError
from streamfit.sources._base import Position, SourceBatch, Unit
from streamfit._stream.columns import ColumnLayout, ColumnProblem, LabelPlan, plan_label, schema_names, _scalar_float
from streamfit._stream.inputs import (ColumnPlan, CompiledInputs, InputPlan, _Part, column_values, finite_checks,
                                      make_plan)
from streamfit._stream.skips import SkipLedger, Skipped

__all__ = ["TrainingBatch", "Rebatcher", "Span", "Quarantine", "IN_FLIGHT_EXTRA", "ROW_REASONS",
           "MESSAGE_REASONS"]

logger = logging.getLogger("streamfit.stream")

#: buffers in use beyond the queue: one being trained, one being filled / waiting to be sent.
IN_FLIGHT_EXTRA = 2

#: reasons a single row is dropped, in priority order (a row is counted once, under its first reason).
ROW_REASONS = ("null", "non_finite", "out_of_range", "non_integer_label", "unknown_class", "negative_weight")
#: reasons a whole record batch / message is dropped.
MESSAGE_REASONS = ("undecodable", "empty_batch", "missing_column", "wrong_type", "invalid_name", "duplicate_column",
                   "feature_count", "wrong_shape", "poison")

_BLOCK = 4096  # rows per copy block: keeps the destination rows in cache for wide buffers


class Span(NamedTuple):
    """Rows ``start:stop`` of a source batch that went into a training batch (source row numbers).

    A named tuple: one is made per copy into a training batch, on the hot path."""

    sb: SourceBatch
    start: int
    stop: int

    def units(self) -> list[Unit]:
        """The messages of the source batch these rows come from."""
        return [u for u in self.sb.units() if u.start < self.stop and self.start < u.stop
                or (u.start == u.stop == self.start)]


@dataclass
class Quarantine:
    """Messages (unit keys) the rebatcher treats apart: ``isolate``d ones are trained in batches of their
    own (so that a diverging batch names one message), ``skip``ped ones are dropped as ``poison``."""

    isolate: set[str] = field(default_factory=set)
    skip: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.isolate or self.skip)


@dataclass(frozen=True)
class TrainingBatch:
    """``n_rows`` rows ready for ``partial_fit``; ``position`` = source position right after the last row.

    ``X`` is an array, or ``{model input name: array}`` when the rebatcher fills named inputs; it may be
    a view into a reused buffer or into Arrow memory (read-only): do not keep it.  ``rows_end`` counts the
    stream's good rows up to this batch's last (what :meth:`Rebatcher.commit` takes once it is trained).
    ``skipped``: input dropped by policy between the previous training batch and ``position`` (settle it
    when this batch is trained); ``spans``: where its rows come from.
    """

    X: "np.ndarray | dict[str, np.ndarray]"
    y: np.ndarray
    sample_weight: np.ndarray | None
    n_rows: int
    position: Position
    rows_end: int = 0
    skipped: tuple[Skipped, ...] = ()
    spans: tuple[Span, ...] = ()


@dataclass
class _Segment:
    """The good rows of one record batch, as numpy arrays (views of Arrow memory where possible)."""

    sb: SourceBatch
    plan: "ColumnPlan | _InputsPlan"
    feats: "list[np.ndarray] | dict[str, np.ndarray]"
    y: np.ndarray
    w: np.ndarray | None
    rows: np.ndarray | None  # indices of the good rows, None = all rows
    n: int
    seq: int  # the record batch's number in the stream

    def src_end(self, i: int) -> int:
        """Source row index just after good row ``i - 1``."""
        return i if self.rows is None else int(self.rows[i - 1]) + 1

    def src_start(self, i: int) -> int:
        """Source row index of good row ``i``."""
        return i if self.rows is None else int(self.rows[i])


@dataclass(frozen=True)
class _InputsPlan:
    """One schema's plan when the rebatcher fills named model inputs."""

    inputs: CompiledInputs
    label: LabelPlan
    weight_index: int | None
    weight_cast: bool
    zero_copy: bool = True  # a training batch inside one record batch is handed out as views


def _fmt_pos(position: Any) -> str:
    return repr(dict(position)) if hasattr(position, "keys") else repr(position)


class Rebatcher:
    """Turn :class:`SourceBatch` objects into :class:`TrainingBatch` objects of ``batch_size`` rows.

    Parameters
    ----------
    batch_size : rows per training batch; the last one may be smaller (unless ``drop_last``).
    features : feature column names (scalar float columns and/or vector columns), or one name, or
        ``None`` = every column but the label and weight, fixed by the first valid record batch (which
        must then give ``expected_width`` values per row, when that is known).
    layout : a saved :class:`~streamfit._stream.columns.ColumnLayout` (from a checkpoint): the features,
        their widths, label, weight and dtype are that layout's; the other arguments must agree.
    expected_width : the model's feature values per row, if known: a record batch whose features give
        another number is bad input (``feature_count``), so an extra column never changes the features.
    inputs, model_inputs : fill named model inputs instead of one ``X``: ``inputs`` maps model input names
        to a column, a list of columns or a :mod:`streamfit.features` encoder (unmapped inputs read the
        column of their name); ``model_inputs`` are the model's declared inputs (``name``, ``dtype``,
        ``shape``); ``X`` is then ``{input name: array}`` (see :mod:`streamfit._stream.inputs`).
    encoder_states : the encoders' learned state by input name (the live copy: read-ahead updates it;
        :meth:`commit` advances a committed copy once rows are trained).
    label, weight : label column (or several / one vector column: multi-output regression); optional
        sample-weight column (finite, >= 0).
    task : ``"regression"`` (``y`` has ``dtype``) or ``"classification"`` (``y`` holds class labels:
        int64, or the classes' dtype for string/bool labels).
    classes : the class labels; ``None`` learns them from the first valid batch (as ``partial_fit``'s
        ``classes=`` takes them); a label not among them is a bad row (``unknown_class``).
    dtype : dtype of ``X`` (float32 or float64); weights use it too.
    on_bad : ``"raise"`` (:class:`BadInputError` naming column, position and expectation) or ``"skip"``
        (drop the bad rows, or the whole record batch for schema problems; count and log them).
    cast : allow explicit conversion of integer/bool/decimal columns (see :mod:`.columns`).
    max_rows : stop after this many training rows (the last batch is cut short, ``done`` becomes True).
    ring_size : number of reused buffers (see the module docstring); ``None`` = fresh arrays per batch.
    quarantine : a :class:`Quarantine` (shared, may change between record batches): messages to train
        apart or to drop as poison.

    Skipped input is counted twice: ``skipped_rows``/``skipped_messages`` as soon as it is read, and in
    the ``skipped`` of the training batch (or ``end_skipped`` after :meth:`flush`) whose position first
    passes it, which is what a consumer that checkpoints positions must count.

    ``push`` and ``flush`` are generators: advance them only after handing off the previous batch.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from streamfit.sources._base import SourceBatch
    >>> rb = pa.record_batch({"x": pa.array([1., 2., 3.], pa.float32()), "y": [0.5, 1., 1.5]})
    >>> sb = SourceBatch(rb, lambda r: {"row": r})
    >>> rebatcher = Rebatcher(2)
    >>> [(b.n_rows, b.position) for b in rebatcher.push(sb)] + [(b.n_rows, b.position) for b in rebatcher.flush()]
    [(2, {'row': 2}), (1, {'row': 3})]
    """

    def __init__(
        self,
        batch_size: int,
        *,
        features: Sequence[str] | str | None = None,
        label: "str | Sequence[str]" = "y",
        weight: str | None = None,
        task: str = "regression",
        dtype: Any = np.float32,
        on_bad: str = "raise",
        cast: bool = False,
        drop_last: bool = False,
        max_rows: int | None = None,
        ring_size: int | None = None,
        layout: ColumnLayout | None = None,
        expected_width: int | None = None,
        inputs: "Mapping[str, Any] | None" = None,
        model_inputs: "Sequence[Any] | None" = None,
        encoder_states: "Mapping[str, Any] | None" = None,
        classes: Any = None,
        quarantine: Quarantine | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Invalid batch_size: {batch_size!r}, expected an int >= 1")
        if on_bad not in ("raise", "skip"):
            raise ValueError(f"Invalid on_bad: {on_bad!r}, expected 'raise' or 'skip'")
        if task not in ("regression", "classification"):
            raise ValueError(f"Invalid task: {task!r}, expected 'regression' or 'classification'")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"Invalid dtype: {dtype!r}, expected float32 or float64")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0):
            raise ValueError(f"Invalid max_rows: {max_rows!r}, expected None or an int >= 0")
        if ring_size is not None and (not isinstance(ring_size, int) or ring_size < 1):
            raise ValueError(f"Invalid ring_size: {ring_size!r}, expected None or an int >= 1")
        if isinstance(features, str):
            features = [features]
        labels = [label] if isinstance(label, str) else list(label)
        if not labels or not all(isinstance(v, str) for v in labels):
            raise ValueError(f"Invalid label: {label!r}, expected a column name or a list of column names")
        if features is not None:
            features = list(features)
            for name in labels + [weight]:
                if name is not None and name in features:
                    raise ValueError(f"column {name!r} is both a feature and the label/weight")
        self._inputs: InputPlan | None = None
        if inputs is not None:
            if features is not None:
                raise ValueError("give features= (one X) or inputs= (named model inputs), not both")
            if model_inputs is None:
                raise ValueError("inputs= needs the model's declared inputs (model_inputs=)")
            self._inputs = InputPlan(model_inputs, inputs, cast=cast, states=encoder_states)
            for name in labels + [weight]:
                if name is not None and name in self._inputs.columns:
                    raise ValueError(f"column {name!r} is both a model input's column and the label/weight")
        self.batch_size = batch_size
        self.label = label if isinstance(label, str) else tuple(labels)
        self._labels = tuple(labels)
        self.weight = weight
        self.task = task
        self.on_bad = on_bad
        self.cast = bool(cast)
        self.drop_last = bool(drop_last)
        self.max_rows = max_rows
        self.ring_size = ring_size
        if layout is not None:
            described = None if self._inputs is None else self._inputs.matching()
            layout.check_matches(features=None if self._inputs is not None else features, label=label, weight=weight,
                                 dtype=self.dtype.name, task=task, inputs=described)
            if expected_width is not None and layout.n_features != expected_width:
                raise ValueError(f"the saved column plan gives {layout.n_features} feature values per row "
                                 f"({list(layout.features)}), the model takes {expected_width}")
            features = list(layout.features)
        self.expected_width = expected_width
        self._feature_names: list[str] | None = features
        self._widths: list[int] | None = None if layout is None else list(layout.widths)
        self._layout = layout
        self._plan_schema: pa.Schema | None = None
        self._plan: "ColumnPlan | _InputsPlan | None" = None
        self.n_features: int | None = None if layout is None else layout.n_features
        self._y_dtype = np.dtype(np.int64) if task == "classification" else self.dtype
        self.y_width = 1  # values per row of y (> 1: multi-output regression), fixed by the first batch
        self._y_fixed = False
        #: the class labels (sorted), given or learned from the first valid batch
        self.classes: np.ndarray | None = None
        if classes is not None:
            from streamfit._arrow import as_labels

            self.classes = np.unique(as_labels(classes))
        self._good_rows = 0  # good rows taken so far (the encoders' journal counts in these)
        self._emitted_rows = 0  # good rows handed out in training batches

        self._X: list[np.ndarray | None] = [None] * (ring_size or 1)
        self._Y: list[np.ndarray | None] = [None] * (ring_size or 1)
        self._W: list[np.ndarray | None] = [None] * (ring_size or 1)
        self._slot = 0
        self._fill = 0
        self._fill_end: tuple[SourceBatch, int] | None = None  # (batch, source row) after the buffer's last row
        self._consumed: Position | None = None
        self._last_emitted: Position | None = None
        self._seq = 0  # record batches pushed
        self._fill_seq = 0  # the record batch of the buffer's last row
        self._fill_spans: list[Span] = []
        self._ledger = SkipLedger()
        self.quarantine = quarantine
        #: after :meth:`flush`: the skips between the last training batch and ``end_position``.
        self.end_skipped: tuple[Skipped, ...] = ()

        #: rows dropped, by reason (rows of whole record batches dropped for schema reasons included).
        self.skipped_rows: Counter[str] = Counter()
        #: whole record batches / undecodable messages dropped, by reason.
        self.skipped_messages: Counter[str] = Counter()
        self.rows_in = 0
        self.rows_out = 0
        self.batches_out = 0
        #: True once ``max_rows`` rows were emitted; further input is ignored.
        self.done = max_rows == 0
        #: after :meth:`flush`: where to resume (everything before is emitted or deliberately skipped).
        self.end_position: Position | None = None

    # ------------------------------------------------------------------ public
    @property
    def features(self) -> list[str] | None:
        """The feature column names (resolved from the first valid batch when not given)."""
        return None if self._feature_names is None else list(self._feature_names)

    @property
    def input_plan(self) -> InputPlan | None:
        """The plan of the named model inputs (``inputs=``), else None."""
        return self._inputs

    @property
    def layout(self) -> ColumnLayout | None:
        """The column plan of the run (state for checkpoints), once fixed."""
        return self._layout

    def extract_ahead(self, sb: SourceBatch) -> tuple[Any, ...] | None:
        """The column extraction and checks :meth:`push` does for ``sb``, without changing any state, so
        that another thread can do this (the bulk of the per-record-batch work) while the event loop
        goes on; pass the result to ``push(sb, ahead)``.  ``None`` when ``push`` must do it itself (no
        plan yet, a new schema, a column problem)."""
        plan, batch = self._plan, sb.batch
        if self.done or plan is None or batch is None or sb.error is not None or batch.num_rows == 0:
            return None
        if self.task == "classification" and self.classes is None:  # push learns them
            return None
        if not (batch.schema is self._plan_schema or batch.schema.equals(self._plan_schema)):
            return None
        try:
            return (plan, *self._extract(batch, plan))
        except ColumnProblem:
            return None

    def push(self, sb: SourceBatch, ahead: tuple[Any, ...] | None = None) -> Iterator[TrainingBatch]:
        """Consume one source batch; yield every training batch it completes.

        ``ahead``: the result of :meth:`extract_ahead` for ``sb`` (if it was called)."""
        if self.done:
            return
        q = self.quarantine
        units = sb.units() if q and sb.batch is not None and sb.num_rows else ()
        if any(u.key in q.skip or u.key in q.isolate for u in units):  # type: ignore[union-attr]
            for unit in units:
                yield from self._push_unit(sb.sub(unit), unit)
                if self.done:
                    return
        else:
            self._seq += 1
            seg = self._segment(sb, ahead)
            if seg is not None:
                yield from self._take(seg)
                if self.done:
                    return
        self._consumed = sb.position_at(0) if sb.batch is None else sb.position_at(sb.num_rows)

    def _push_unit(self, sb: SourceBatch, unit: Unit) -> Iterator[TrainingBatch]:
        """One message of a record batch that holds a quarantined one: dropped, trained apart, or as usual."""
        q = self.quarantine
        assert q is not None
        self._seq += 1
        if unit.key in q.skip:
            n = sb.num_rows
            self._bad(sb, "poison", None, f"poison message {unit.key!r} ({n} rows) quarantined: training on it "
                      "diverged repeatedly", row=None, rows=n)
            self.rows_in += n
            self.skipped_messages["poison"] += 1
            self.skipped_rows["poison"] += n
            self._ledger.add_message(self._seq, sb, "poison", None, f"poison message {unit.key}")
            return
        isolate = unit.key in q.isolate
        if isolate and self._fill:
            yield self._emit()  # the rows before it, in a batch without it
        seg = self._segment(sb, None)
        if seg is not None:
            yield from self._take(seg)
        if isolate and self._fill and not self.done:
            yield self._emit()

    @property
    def pending_rows(self) -> int:
        """Good rows read and waiting for a full batch."""
        return self._fill

    def take_partial(self) -> TrainingBatch | None:
        """The rows waiting for a full batch, as a training batch now, while the stream goes on (a quiet live
        stream: ``max_batch_wait``); its position is right after its last row.  ``None`` if no row waits."""
        if not self._fill or self.done:
            return None
        return self._emit()

    def flush(self) -> Iterator[TrainingBatch]:
        """End of stream: yield the last partial batch (unless ``drop_last``); set ``end_position``."""
        if self._fill and not self.drop_last:
            yield self._emit()
        if self._fill:  # drop_last: the rows in the buffer are not trained, resume before them
            self._fill = 0
            self._fill_spans = []
            self.end_position = self._last_emitted
            self._ledger.clear()
        elif self.done:
            self.end_position = self._last_emitted
            self._ledger.clear()  # read past the end: read again by whoever resumes there
        else:
            self.end_position = self._consumed
            self.end_skipped = self._ledger.take_all()

    # ------------------------------------------------------------------ bad input
    def _bad(self, sb: SourceBatch, reason: str, column: str | None, message: str, *,
             row: int | None, rows: int, cause: BaseException | None = None) -> None:
        """Raise (policy "raise") or count and log (policy "skip") one problem."""
        where = sb.where or "record batch"
        if row is None:
            position = sb.position_at(0)
            text = f"{message} (at {where}; position {_fmt_pos(position)})"
        else:
            position = sb.position_at(row)
            text = f"{message} (at {where}, row {row} of the record batch; position {_fmt_pos(position)})"
        if self.on_bad == "raise":
            raise BadInputError(text, reason=reason, column=column, position=position) from cause
        logger.warning("skipped %s: %s", f"{rows} row(s)" if rows or row is not None else "message", text,
                       extra={"event": "skipped_input",  # structured fields for the daemon's JSON log lines
                              "fields": {"reason": reason, "column": column, "rows": rows, "position": position}})

    def _segment(self, sb: SourceBatch, ahead: tuple[Any, ...] | None = None) -> _Segment | None:
        seq = self._seq
        if sb.error is not None or sb.batch is None:
            column = getattr(sb.error, "column", None)
            self._bad(sb, "undecodable", column, f"undecodable message: {sb.error}", row=None, rows=0,
                      cause=sb.error)
            self.skipped_messages["undecodable"] += 1
            self._ledger.add_message(seq, sb, "undecodable", column, str(sb.error))
            return None
        n = sb.batch.num_rows
        self.rows_in += n
        if n == 0:
            text = "empty record batch (0 rows), expected at least one row"
            self._bad(sb, "empty_batch", None, text, row=None, rows=0)
            self.skipped_messages["empty_batch"] += 1
            self._ledger.add_message(seq, sb, "empty_batch", None, text)
            return None
        try:
            plan = self._plan_for(sb.batch.schema)
            if ahead is not None and ahead[0] is plan:
                feats, y, w, checks = ahead[1:]
            else:
                feats, y, w, checks = self._extract(sb.batch, plan)
        except ColumnProblem as p:
            self._bad(sb, p.reason, p.column, p.message, row=None, rows=n)
            self.skipped_messages[p.reason] += 1
            self.skipped_rows[p.reason] += n
            self._ledger.add_message(seq, sb, p.reason, p.column, p.message)
            return None
        rows = None
        if checks:
            rows = self._bad_rows(sb, checks, n)
            if len(rows) == 0:
                return None
        good = n if rows is None else len(rows)
        if isinstance(plan, _InputsPlan) and plan.inputs.stateful:
            assert self._inputs is not None
            try:  # encoders learn from the good rows, in stream order (never in a worker thread)
                feats = {**feats, **self._inputs.encode(sb.batch, plan.inputs, rows, journal_at=self._good_rows)}
            except ColumnProblem as p:
                self._bad(sb, p.reason, p.column, p.message, row=None, rows=n)
                self.skipped_messages[p.reason] += 1
                self.skipped_rows[p.reason] += n
                self._ledger.add_message(seq, sb, p.reason, p.column, p.message)
                return None
        self._good_rows += good
        return _Segment(sb, plan, feats, y, w, rows, good, seq)

    def _bad_rows(self, sb: SourceBatch, checks: list[tuple[str, str, np.ndarray, np.ndarray]],
                  n: int) -> np.ndarray:
        """Rows to keep; raise on the first bad row under "raise"."""
        if self.on_bad == "raise":
            first = min(int(np.argmax(mask)) for _, _, mask, _ in checks)
            for reason in ROW_REASONS:
                for r, col, mask, values in checks:
                    if r == reason and mask[first]:
                        self._bad(sb, reason, col, self._row_message(reason, col, values[first]),
                                  row=first, rows=1)
        code = np.zeros(n, dtype=np.int8)
        for k, reason in enumerate(ROW_REASONS, start=1):
            for r, col, mask, values in checks:
                if r != reason:
                    continue
                new = mask & (code == 0)
                count = int(new.sum())
                if count:
                    code[new] = k
                    self.skipped_rows[reason] += count
                    first = int(np.argmax(new))
                    text = self._row_message(reason, col, values[first])
                    self._bad(sb, reason, col, text + (f"; {count} such rows in this record batch"
                                                        if count > 1 else ""), row=first, rows=count)
                    self._ledger.add_rows(self._seq, sb, reason, col, text, np.flatnonzero(new))
        return np.flatnonzero(code == 0)

    def _row_message(self, reason: str, column: str, value: Any) -> str:
        role = "label " if column in self._labels else "weight " if column == self.weight else ""
        label_cls = role == "label " and self.task == "classification"
        expected = "a class label" if label_cls else f"a finite {self.dtype.name}"
        if reason == "unknown_class":
            shown = [] if self.classes is None else self.classes.tolist()
            more = ", ..." if len(shown) > 20 else ""
            value = value.item() if isinstance(value, np.generic) else value
            return (f"label column '{column}' has {value!r}, expected one of the classes "
                    f"{str(shown[:20])[:-1]}{more}]")
        if reason == "out_of_range":
            return f"column '{column}' has {value}, outside the range of its model input's integer type"
        if reason == "null":
            return f"{role}column '{column}' has a null, expected {expected}"
        if reason == "non_finite":
            return f"{role}column '{column}' has {value}, expected {expected}"
        if reason == "non_integer_label":
            return f"{role}column '{column}' has {value}, expected a whole-number class label"
        return f"{role}column '{column}' has {value}, expected a weight >= 0"

    # ------------------------------------------------------------------ columns
    def _plan_for(self, schema: pa.Schema) -> "ColumnPlan | _InputsPlan":
        if self._plan is not None and (schema is self._plan_schema or schema.equals(self._plan_schema)):
            return self._plan
        if self._inputs is not None:
            compiled = self._inputs.compile(schema)
            lp = plan_label(schema, self.label, task=self.task, dtype=self.dtype, cast=self.cast)
            wi, wc = (None, False)
            if self.weight is not None:
                wi, wc = _scalar_float(schema, self.weight, "weight ", self.dtype.name, self.cast)
            self._fix_label_width(lp)
            plan: "ColumnPlan | _InputsPlan" = _InputsPlan(compiled, lp, wi, wc)
            if self._layout is None:
                self._layout = ColumnLayout(tuple(self._inputs.columns), (1,) * len(self._inputs.columns),
                                            self.label, self.weight, self.dtype.name, self.task,
                                            self._inputs.described())
            self.n_features = sum(math.prod(c.row_shape) for c in compiled.inputs)
            self._plan, self._plan_schema = plan, schema
            return plan
        names = self._feature_names
        inferred = names is None
        if names is None:
            names = [n for n in schema_names(schema) if n not in (self.label, self.weight)]
        plan = make_plan(schema, features=names, widths=self._widths, label=self.label, weight=self.weight,
                         task=self.task, dtype=self.dtype, cast=self.cast)
        self._fix_label_width(plan.label)
        if self._widths is None:
            expected = self.expected_width
            if expected is not None and plan.n_features != expected:
                which = "the record batch's columns but the label/weight" if inferred else "the feature columns"
                raise ColumnProblem("feature_count", None,
                                    f"{which} {names} give {plan.n_features} values per row, the model takes "
                                    f"{expected}" + (": name the feature columns (features=[...], --features)"
                                                     if inferred else ""))
            self._feature_names = names
            self._widths = [c.width for c in plan.features]
            self.n_features = plan.n_features
            self._layout = ColumnLayout(tuple(names), tuple(self._widths), self.label, self.weight,
                                        self.dtype.name, self.task)
            if inferred:
                logger.info("features taken from the first record batch: %s (%d values per row)", names,
                            plan.n_features, extra={"event": "columns",
                                                    "fields": {"features": names, "widths": self._widths}})
        self._plan, self._plan_schema = plan, schema
        return plan

    def _fix_label_width(self, lp: LabelPlan) -> None:
        if not self._y_fixed:
            self.y_width, self._y_fixed = lp.width, True
        elif lp.width != self.y_width:
            raise ColumnProblem("wrong_shape", lp.columns[0], f"label column(s) {list(lp.columns)} give {lp.width} "
                                                              f"values per row, the stream's first gave {self.y_width}")

    def _extract(self, batch: pa.RecordBatch, plan: "ColumnPlan | _InputsPlan"):
        """Numpy arrays of the plan's columns, and the row checks that failed (usually none)."""
        checks: list[tuple[str, str, np.ndarray, np.ndarray]] = []
        feats: Any
        if isinstance(plan, _InputsPlan):
            assert self._inputs is not None
            feats, checks = self._inputs.extract(batch, plan.inputs)
        else:
            feats = []
            for col in plan.features:
                values, null = column_values(batch.column(col.index), col.part)
                feats.append(values)
                finite_checks(checks, col.name, values, null)
        y = self._labels_of(batch, plan.label, checks)
        w = None
        if plan.weight_index is not None:
            weight = str(self.weight)  # set: the plan has its column
            w, null = _float_values(batch.column(plan.weight_index), weight, plan.weight_cast, 0)
            finite_checks(checks, weight, w, null)
            with np.errstate(invalid="ignore"):
                neg = w < 0  # NaN (nulls included) compares False
            if neg.any():
                checks.append(("negative_weight", weight, neg, w))
        return feats, y, w, checks

    def _labels_of(self, batch: pa.RecordBatch, lp: LabelPlan, checks: list) -> np.ndarray:
        if lp.kind in ("int", "cast", "class"):
            return self._class_labels(batch.column(lp.indices[0]), lp, checks)
        if lp.kind == "vector":
            y, null = _float_values(batch.column(lp.indices[0]), lp.columns[0], lp.cast, lp.width)
            finite_checks(checks, lp.columns[0], y, null)
            return y
        if len(lp.indices) == 1:
            y, null = _float_values(batch.column(lp.indices[0]), lp.columns[0], lp.cast, 0)
            finite_checks(checks, lp.columns[0], y, null)
            return y
        y = np.empty((batch.num_rows, len(lp.indices)), dtype=self.dtype)
        for j, (i, name) in enumerate(zip(lp.indices, lp.columns)):
            values, null = _float_values(batch.column(i), name, lp.cast, 0)
            finite_checks(checks, name, values, null)
            y[:, j] = values
        return y

    def _class_labels(self, arr: pa.Array, lp: LabelPlan, checks: list) -> np.ndarray:
        name = lp.columns[0]
        null = _null_mask(arr)
        if null is not None:
            checks.append(("null", name, null, np.zeros(len(arr))))
        if lp.kind == "class":  # strings, dictionaries, bool: the values themselves, as classes_ holds them
            from streamfit.features._values import categorical

            cat = categorical(arr)
            uniques = cat.uniques.astype(str) if cat.kind == "string" else (
                cat.uniques.astype(bool) if cat.kind == "bool" else cat.uniques)
            present = uniques[np.unique(cat.index[cat.index >= 0])] if len(uniques) else uniques
            self._learn_classes(present)
            values = uniques[np.maximum(cat.index, 0)] if len(uniques) else np.zeros(len(arr), dtype=uniques.dtype)
            self._unknown_checks(checks, name, values, null)
            return values
        if lp.kind == "int":
            if null is not None:
                arr = arr.fill_null(0)
            values = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            self._learn_classes(values if null is None else values[~null])
            self._unknown_checks(checks, name, values, null)
            return values
        v = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
        finite = np.isfinite(v)
        if not finite.all():
            nf = ~finite if null is None else ~finite & ~null
            if nf.any():
                checks.append(("non_finite", name, nf, v))
        with np.errstate(invalid="ignore"):
            frac = finite & (v != np.floor(v))
        if frac.any():
            checks.append(("non_integer_label", name, frac, v))
        values = np.where(finite & ~frac, v, 0).astype(np.int64)
        ok = finite & ~frac if null is None else finite & ~frac & ~null
        self._learn_classes(values[ok])
        self._unknown_checks(checks, name, values, None if ok.all() else ~ok)
        return values

    def _learn_classes(self, present: np.ndarray) -> None:
        if self.classes is None and len(present):
            self.classes = np.unique(present)
            logger.info("classes taken from the first record batch: %s", self.classes.tolist(),
                        extra={"event": "classes", "fields": {"classes": self.classes.tolist()}})

    def _unknown_checks(self, checks: list, name: str, values: np.ndarray, skip: np.ndarray | None) -> None:
        classes = self.classes
        if classes is None or not len(values):
            return
        try:
            idx = np.clip(np.searchsorted(classes, values), 0, len(classes) - 1)
            unknown = classes[idx] != values
        except TypeError:  # labels of another kind than the classes (strings vs ints)
            unknown = np.ones(len(values), dtype=bool)
        if skip is not None:
            unknown &= ~skip
        if unknown.any():
            checks.append(("unknown_class", name, unknown, values))

    def commit(self, rows: int, committed: "Mapping[str, Any]") -> None:
        """The first ``rows`` good rows were trained: advance the ``committed`` encoder states to them."""
        if self._inputs is not None:
            self._inputs.commit(committed, rows)

    # ------------------------------------------------------------------ buffers
    def _buffers(self, slot: int, seg: _Segment | None = None) -> tuple[Any, np.ndarray, np.ndarray | None]:
        X: Any = self._X[slot]
        if X is None:
            bs = self.batch_size
            if self._inputs is not None:
                assert seg is not None and isinstance(seg.feats, dict)
                X = {name: np.empty((bs, *a.shape[1:]), dtype=a.dtype) for name, a in seg.feats.items()}
            else:
                assert self.n_features is not None
                X = np.empty((bs, self.n_features), dtype=self.dtype)
            self._X[slot] = X
            y_dtype = self.classes.dtype if self.task == "classification" and self.classes is not None \
                else self._y_dtype
            self._Y[slot] = np.empty((bs,) if self.y_width == 1 else (bs, self.y_width), dtype=y_dtype)
            if self.weight is not None:
                self._W[slot] = np.empty(bs, dtype=self.dtype)
        return X, self._Y[slot], self._W[slot]  # type: ignore[return-value]

    def _take(self, seg: _Segment) -> Iterator[TrainingBatch]:
        bs = self.batch_size
        i = 0
        while i < seg.n:
            room = bs if self.max_rows is None else self.max_rows - self.rows_out - self._fill
            if (self._fill == 0 and seg.plan.zero_copy and seg.rows is None and seg.n - i >= bs and room >= bs):
                yield self._emit_view(seg, i)
                i += bs
                if self.done:  # max_rows reached exactly on the zero-copy path
                    return
                continue
            k = min(seg.n - i, bs - self._fill, room)
            self._copy(seg, i, k)
            self._fill_spans.append(Span(seg.sb, seg.src_start(i), seg.src_end(i + k)))
            i += k
            self._fill_end = (seg.sb, seg.src_end(i))
            self._fill_seq = seg.seq
            if self._fill == bs or k == room:
                yield self._emit()
            if self.done:
                return

    def _copy(self, seg: _Segment, i: int, k: int) -> None:
        X, Y, W = self._buffers(self._slot, seg)
        f = self._fill
        for b in range(0, k, _BLOCK):
            kb = min(_BLOCK, k - b)
            src = slice(i + b, i + b + kb) if seg.rows is None else seg.rows[i + b:i + b + kb]
            dst = slice(f + b, f + b + kb)
            if isinstance(seg.feats, dict):
                for name, values in seg.feats.items():
                    X[name][dst] = values[src]
                Y[dst] = seg.y[src]
                if W is not None:
                    W[dst] = seg.w[src]  # type: ignore[index]
                continue
            for col, values in zip(seg.plan.features, seg.feats):  # type: ignore[union-attr]
                if col.vector:
                    X[dst, col.offset:col.offset + col.width] = values[src]
                else:
                    X[dst, col.offset] = values[src]
            Y[dst] = seg.y[src]
            if W is not None:
                W[dst] = seg.w[src]  # type: ignore[index]
        self._fill += k

    def _finish(self, n: int, position: Position, fresh: bool = False) -> None:
        self.rows_out += n
        self._emitted_rows += n
        self.batches_out += 1
        self._last_emitted = position
        if fresh:  # no ring buffer was used
            pass
        elif self.ring_size is not None:
            self._slot = (self._slot + 1) % self.ring_size
        else:  # hand the arrays over: the next batch allocates new ones
            self._X[0] = self._Y[0] = self._W[0] = None
        if self.max_rows is not None and self.rows_out >= self.max_rows:
            self.done = True
            self._consumed = position

    def _emit(self) -> TrainingBatch:
        X, Y, W = self._buffers(self._slot)
        n = self._fill
        assert self._fill_end is not None
        sb, end = self._fill_end
        position = sb.position_at(end)
        if n < self.batch_size:
            X = {k: v[:n] for k, v in X.items()} if isinstance(X, dict) else X[:n]
            Y, W = Y[:n], None if W is None else W[:n]
        self._fill = 0
        self._fill_end = None
        spans, self._fill_spans = tuple(self._fill_spans), []
        skipped = self._ledger.take_until(self._fill_seq, end) if self._ledger.pending else ()
        self._finish(n, position)
        return TrainingBatch(X, Y, W, n, position, self._emitted_rows, skipped, spans)

    def _emit_view(self, seg: _Segment, i: int) -> TrainingBatch:
        bs = self.batch_size
        position = seg.sb.position_at(i + bs)
        skipped = self._ledger.take_until(seg.seq, i + bs) if self._ledger.pending else ()
        if isinstance(seg.feats, dict):  # every input, label and weight as views of this segment's arrays
            X: Any = {name: values[i:i + bs] for name, values in seg.feats.items()}
            Y, W = seg.y[i:i + bs], None if seg.w is None else seg.w[i:i + bs]
            self._finish(bs, position, fresh=True)
            return TrainingBatch(X, Y, W, bs, position, self._emitted_rows, skipped, (Span(seg.sb, i, i + bs),))
        _, Y, W = self._buffers(self._slot)
        Y[:] = seg.y[i:i + bs]
        if W is not None:
            W[:] = seg.w[i:i + bs]  # type: ignore[index]
        self._finish(bs, position)
        return TrainingBatch(seg.feats[0][i:i + bs], Y, W, bs, position, self._emitted_rows, skipped,
                             (Span(seg.sb, i, i + bs),))


def _null_mask(arr: pa.Array) -> np.ndarray | None:
    if not arr.null_count:
        return None
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _float_values(arr: pa.Array, name: str, cast: bool, width: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Values of a float label/weight column (1-D) or vector label column (2-D, ``width`` > 0), and its
    null-row mask (the column plan's conversion)."""
    return column_values(arr, _Part(name, -1, "vector" if width else "scalar", width or 1, cast))
