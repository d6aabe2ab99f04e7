"""Rebatching: :class:`SourceBatch` record batches of any size in, fixed-size training batches out.

Pure (no I/O, no event loop).  Bad input is handled here by policy (``on_bad="raise"|"skip"``), see
:mod:`streamfit._columns` for the type policy.
What the columns hold is the column plan's (:class:`~streamfit._columns.plan.ColumnPlan`); the rebatcher keeps
the ring of buffers and the bad-input policy (raise, or skip and account for the skips).

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
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from streamfit.exceptions import BadInputError
from streamfit.sources._base import Position, SourceBatch, Unit
from streamfit._columns.layout import ColumnLayout
from streamfit._columns.mapping import ColumnMapping, Pieces
from streamfit._columns.memory import ModelInputs
from streamfit._columns.plan import ColumnPlan, Extracted, SchemaPlan
from streamfit._columns.schema import ColumnProblem
from streamfit._columns.values import BLOCK, Check
from streamfit._stream.row_quarantine import MessageCuts, pieces
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


class Span(NamedTuple):
    """Rows ``start:stop`` of a source batch that went into a training batch (source row numbers).

    A named tuple: one is made per copy into a training batch, on the hot path.

    Attributes
    ----------
    sb
        The :class:`~streamfit.sources.SourceBatch` the rows come from.
    start, stop
        The rows of it, ``start:stop``.
    """

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
    own (so that a diverging batch names one message), ``skip``ped ones are dropped as ``poison``; those in
    ``rows`` (isolated too) are cut into pieces trained apart, their poison rows dropped
    (:mod:`streamfit._stream.row_quarantine`)."""

    isolate: set[str] = field(default_factory=set)
    skip: set[str] = field(default_factory=set)
    rows: dict[str, MessageCuts] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.isolate or self.skip)


@dataclass(frozen=True)
class TrainingBatch:
    """``n_rows`` rows ready for ``partial_fit``; ``position`` = source position right after the last row.

    ``X`` is an array, or ``{model input name: array}`` (:class:`~streamfit._columns.memory.ModelInputs`: the
    estimator reads it as model inputs, never as columns) when the rebatcher fills named inputs; it may be
    a view into a reused buffer or into Arrow memory (read-only): do not keep it.  ``rows_end`` counts the
    stream's good rows up to this batch's last (what :meth:`~streamfit._columns.plan.ColumnPlan.commit` takes once
    it is trained).
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
    plan: SchemaPlan
    inputs: "dict[str, np.ndarray | Pieces]"  # by model input name: the array, or its columns' pieces
    y: np.ndarray
    w: np.ndarray | None
    rows: np.ndarray | None  # indices of the good rows, None = all rows
    n: int
    seq: int  # the record batch's number in the stream
    whole: bool  # every input is one array: a training batch inside the record batch can be views of them

    def src_end(self, i: int) -> int:
        """Source row index just after good row ``i - 1``."""
        return i if self.rows is None else int(self.rows[i - 1]) + 1

    def src_start(self, i: int) -> int:
        """Source row index of good row ``i``."""
        return i if self.rows is None else int(self.rows[i])


@dataclass
class _Buffers:
    """One ring slot: each model input's rows flattened (``flat``, what copies write) and as the batch hands
    them out (``X``: the feature matrix's array, or ``{input name: [batch_size, *row_shape]}``), ``y``, the
    weights."""

    flat: dict[str, np.ndarray]
    X: "np.ndarray | dict[str, np.ndarray]"
    y: np.ndarray
    w: np.ndarray | None


def _fmt_pos(position: Any) -> str:
    return repr(dict(position)) if hasattr(position, "keys") else repr(position)


def _check_args(batch_size: Any, on_bad: Any, max_rows: Any, ring_size: Any) -> None:
    """ValueError naming the first invalid argument of a :class:`Rebatcher`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"Invalid batch_size: {batch_size!r}, expected an int >= 1")
    if on_bad not in ("raise", "skip"):
        raise ValueError(f"Invalid on_bad: {on_bad!r}, expected 'raise' or 'skip'")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0):
        raise ValueError(f"Invalid max_rows: {max_rows!r}, expected None or an int >= 0")
    if ring_size is not None and (not isinstance(ring_size, int) or ring_size < 1):
        raise ValueError(f"Invalid ring_size: {ring_size!r}, expected None or an int >= 1")


class Rebatcher:
    """Turn :class:`SourceBatch` objects into :class:`TrainingBatch` objects of ``batch_size`` rows.

    Parameters
    ----------
    batch_size : rows per training batch; the last one may be smaller (unless ``drop_last``).
    plan : the :class:`~streamfit._columns.plan.ColumnPlan` to read with (built by the caller: the features
        or named inputs, label, weight, task, dtype, ``cast``, a saved layout, the classes; see there).
    on_bad : ``"raise"`` (:class:`BadInputError` naming column, position and expectation) or ``"skip"``
        (drop the bad rows, or the whole record batch for schema problems; count and log them).
    max_rows : stop after this many training rows (the last batch is cut short, ``done`` becomes True).
    ring_size : number of reused buffers (see the module docstring); ``None`` = fresh arrays per batch.
    quarantine : a :class:`Quarantine` (shared, may change between record batches): messages to train
        apart or to drop as poison.
    ledger : the :class:`~streamfit._stream.skips.SkipLedger` to note and count skips in (default: a new one).

    Skipped input is counted once, in the :class:`~streamfit._stream.skips.SkipLedger` (``ledger``: given, to
    count into a daemon's too): as read (``skipped_rows``/``skipped_messages``), and handed out in the
    ``skipped`` of the training batch (or ``end_skipped`` after :meth:`flush`) whose position first passes
    it, which the consumer counts as passed (``ledger.passed``) once that batch is trained.

    ``push`` and ``flush`` are generators: advance them only after handing off the previous batch.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from streamfit._columns.plan import ColumnPlan
    >>> from streamfit.sources._base import SourceBatch
    >>> rb = pa.record_batch({"x": pa.array([1., 2., 3.], pa.float32()), "y": [0.5, 1., 1.5]})
    >>> sb = SourceBatch(rb, lambda r: {"row": r})
    >>> rebatcher = Rebatcher(2, ColumnPlan())
    >>> [(b.n_rows, b.position) for b in rebatcher.push(sb)] + [(b.n_rows, b.position) for b in rebatcher.flush()]
    [(2, {'row': 2}), (1, {'row': 3})]
    """

    def __init__(self, batch_size: int, plan: ColumnPlan, *, on_bad: str = "raise", drop_last: bool = False,
                 max_rows: int | None = None, ring_size: int | None = None, quarantine: Quarantine | None = None,
                 ledger: SkipLedger | None = None) -> None:
        _check_args(batch_size, on_bad, max_rows, ring_size)
        #: what the columns hold (the column plan); the rebatcher keeps the buffers and the bad-input policy
        self.plan = plan
        self.batch_size = batch_size
        self.on_bad = on_bad
        self.drop_last = bool(drop_last)
        self.max_rows = max_rows
        self.ring_size = ring_size
        self.quarantine = quarantine
        self._ring: list[_Buffers | None] = [None] * (ring_size or 1)
        self._slot = 0
        self._fill = 0
        self._fill_end: tuple[SourceBatch, int] | None = None  # (batch, source row) after the buffer's last row
        self._fill_seq = 0  # the record batch of the buffer's last row
        self._fill_spans: list[Span] = []
        self._consumed: Position | None = None
        self._last_emitted: Position | None = None
        self._seq = 0  # record batches pushed
        self._good_rows = 0  # good rows taken so far (the encoders' journal counts in these)
        self._emitted_rows = 0  # good rows handed out in training batches
        #: the skips waiting for a trained batch to pass them, and the counts of skipped input
        self.ledger = SkipLedger() if ledger is None else ledger
        self._ledger = self.ledger
        #: after :meth:`flush`: the skips between the last training batch and ``end_position``.
        self.end_skipped: tuple[Skipped, ...] = ()
        self.rows_in = 0
        self.rows_out = 0
        self.batches_out = 0
        #: True once ``max_rows`` rows were emitted; further input is ignored.
        self.done = max_rows == 0
        #: after :meth:`flush`: where to resume (everything before is emitted or deliberately skipped).
        self.end_position: Position | None = None

    # ------------------------------------------------------------------ public
    @property
    def skipped_rows(self) -> Counter[str]:
        """Rows dropped as read, by reason (rows of whole record batches dropped for schema reasons included)."""
        return self._ledger.read_rows

    @property
    def skipped_messages(self) -> Counter[str]:
        """Whole record batches / undecodable messages dropped as read, by reason."""
        return self._ledger.read_messages

    @property
    def features(self) -> list[str] | None:
        """The feature column names (resolved from the first valid batch when not given)."""
        return self.plan.features

    @property
    def input_plan(self) -> ColumnMapping | None:
        """The mapping of the named model inputs (``inputs=``), else None."""
        return self.plan.mapping if self.plan.named else None

    @property
    def layout(self) -> ColumnLayout | None:
        """The column plan of the run (state for checkpoints), once fixed."""
        return self.plan.layout

    @property
    def classes(self) -> np.ndarray | None:
        """The class labels (sorted), given or learned from the first valid batch."""
        return self.plan.classes

    @property
    def n_features(self) -> int | None:
        """Values per row over the model inputs, once fixed."""
        return self.plan.n_features

    @property
    def y_width(self) -> int:
        """Values per row of ``y`` (> 1: multi-output regression), fixed by the first batch."""
        return 1 if self.plan.labels is None else self.plan.labels.width

    def extract_ahead(self, sb: SourceBatch) -> Extracted | None:
        """The column extraction and checks :meth:`push` does for ``sb``, without changing any state, so
        that another thread can do this (the bulk of the per-record-batch work) while the event loop
        goes on; pass the result to ``push(sb, ahead)``.  ``None`` when ``push`` must do it itself (no
        plan yet, a new schema, a column problem)."""
        plan, batch = self.plan, sb.batch
        if self.done or batch is None or sb.error is not None or batch.num_rows == 0:
            return None
        if plan.task == "classification" and plan.classes is None:  # push learns them
            return None
        schema_plan = plan.current(batch.schema)
        if schema_plan is None:
            return None
        try:
            return plan.extract(batch, schema_plan)
        except ColumnProblem:
            return None

    def push(self, sb: SourceBatch, ahead: Extracted | None = None) -> Iterator[TrainingBatch]:
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
            self.rows_in += n
            self._drop_message(sb, self._seq, "poison", None, f"poison message {unit.key!r} ({n} rows) quarantined: "
                               "training on it diverged repeatedly", rows=n, noted=f"poison message {unit.key}")
            return
        isolate = unit.key in q.isolate
        if isolate and self._fill:
            yield self._emit()  # the rows before it, in a batch without it
        cuts = q.rows.get(unit.key)
        if cuts is not None:
            yield from self._push_pieces(sb, unit, cuts)
            return
        seg = self._segment(sb, None)
        if seg is not None:
            yield from self._take(seg)
        if isolate and self._fill and not self.done:
            yield self._emit()

    def _push_pieces(self, sb: SourceBatch, unit: Unit, cuts: MessageCuts) -> Iterator[TrainingBatch]:
        """A poison message under bisection: each piece trained in batches of its own, its poison rows dropped."""
        for i, piece in enumerate(pieces(sb, unit, cuts)):
            if i:
                self._seq += 1
            if piece.dropped:
                self.rows_in += 1
                text = f"poison row of message {unit.key!r} quarantined: training on it diverged repeatedly"
                self._bad(sb, "poison", None, text, row=piece.start, rows=1)
                self._ledger.read("poison", 1, message=False)
                self._ledger.add_rows(self._seq, sb, "poison", None, text, np.array([piece.start], dtype=np.int64))
                continue
            seg = self._segment(piece.sb, None)
            if seg is not None:
                yield from self._take(seg)
            if self.done:
                return
            if self._fill:
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
        """Raise (policy "raise") or log (policy "skip") one problem."""
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

    def _drop_message(self, sb: SourceBatch, seq: int, reason: str, column: str | None, message: str, *,
                      rows: int | None, noted: str | None = None, cause: BaseException | None = None) -> None:
        """A whole record batch / message is bad: raise, or skip it (counted, logged, in the ledger).
        ``rows``: its rows, counted as skipped rows (None: not counted, undecodable and empty ones)."""
        self._bad(sb, reason, column, message, row=None, rows=rows or 0, cause=cause)
        self._ledger.read(reason, rows, message=True)
        self._ledger.add_message(seq, sb, reason, column, message if noted is None else noted)

    def _segment(self, sb: SourceBatch, ahead: Extracted | None = None) -> _Segment | None:
        seq = self._seq
        if sb.error is not None or sb.batch is None:
            self._drop_message(sb, seq, "undecodable", getattr(sb.error, "column", None),
                               f"undecodable message: {sb.error}", rows=None, noted=str(sb.error), cause=sb.error)
            return None
        n = sb.batch.num_rows
        self.rows_in += n
        if n == 0:
            self._drop_message(sb, seq, "empty_batch", None, "empty record batch (0 rows), expected at least one row",
                               rows=None)
            return None
        try:
            plan = self.plan.for_schema(sb.batch.schema)
            values = ahead if ahead is not None and ahead.plan is plan else self.plan.extract(sb.batch, plan)
        except ColumnProblem as p:
            self._drop_message(sb, seq, p.reason, p.column, p.message, rows=n)
            return None
        rows = None
        if values.checks:
            rows = self._bad_rows(sb, values.checks, n)
            if len(rows) == 0:
                return None
        good = n if rows is None else len(rows)
        inputs = values.inputs
        if plan.stateful:
            try:  # encoders learn from the good rows, in stream order (never in a worker thread)
                inputs = {**inputs, **self.plan.encode(sb.batch, plan, rows, journal_at=self._good_rows)}
            except ColumnProblem as p:
                self._drop_message(sb, seq, p.reason, p.column, p.message, rows=n)
                return None
        self._good_rows += good
        assert values.y is not None  # a stream's plan has a label
        whole = all(isinstance(v, np.ndarray) for v in inputs.values())
        return _Segment(sb, plan, inputs, values.y, values.w, rows, good, seq, whole)

    def _bad_rows(self, sb: SourceBatch, checks: list[Check], n: int) -> np.ndarray:
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
                    self._ledger.read(reason, count, message=False)
                    first = int(np.argmax(new))
                    text = self._row_message(reason, col, values[first])
                    self._bad(sb, reason, col, text + (f"; {count} such rows in this record batch"
                                                        if count > 1 else ""), row=first, rows=count)
                    self._ledger.add_rows(self._seq, sb, reason, col, text, np.flatnonzero(new))
        return np.flatnonzero(code == 0)

    def _row_message(self, reason: str, column: str, value: Any) -> str:
        role = self.plan.role(column)
        label_cls = role == "label " and self.plan.task == "classification"
        expected = "a class label" if label_cls else f"a finite {self.plan.dtype.name}"
        if reason == "unknown_class":
            classes = self.plan.classes
            shown = [] if classes is None else classes.tolist()
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

    # ------------------------------------------------------------------ buffers
    def _buffers(self, slot: int, plan: SchemaPlan) -> _Buffers:
        buffers = self._ring[slot]
        if buffers is None:
            bs = self.batch_size
            flat = {c.name: np.empty((bs, c.width), dtype=c.dtype) for c in plan.inputs}
            X: Any = flat[plan.inputs[0].name] if self.plan.single else \
                ModelInputs({c.name: flat[c.name].reshape((bs, *c.row_shape)) for c in plan.inputs})
            labels = self.plan.labels
            assert labels is not None
            y = np.empty((bs,) if labels.width == 1 else (bs, labels.width), dtype=labels.y_dtype)
            w = None if self.plan.weight is None else np.empty(bs, dtype=self.plan.dtype)
            buffers = self._ring[slot] = _Buffers(flat, X, y, w)
        return buffers

    def _take(self, seg: _Segment) -> Iterator[TrainingBatch]:
        bs = self.batch_size
        i = 0
        while i < seg.n:
            room = bs if self.max_rows is None else self.max_rows - self.rows_out - self._fill
            if self._fill == 0 and seg.whole and seg.rows is None and seg.n - i >= bs and room >= bs:
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
        buffers = self._buffers(self._slot, seg.plan)
        flat, Y, W = buffers.flat, buffers.y, buffers.w
        f = self._fill
        for b in range(0, k, BLOCK):
            kb = min(BLOCK, k - b)
            src = slice(i + b, i + b + kb) if seg.rows is None else seg.rows[i + b:i + b + kb]
            dst = slice(f + b, f + b + kb)
            for name, values in seg.inputs.items():
                X = flat[name]
                if isinstance(values, np.ndarray):
                    X[dst] = values[src].reshape(kb, -1)
                    continue
                for offset, width, part in values:
                    if part.ndim == 1:
                        X[dst, offset] = part[src]
                    else:
                        X[dst, offset:offset + width] = part[src]
            Y[dst] = seg.y[src]
            if W is not None:
                W[dst] = seg.w[src]  # type: ignore[index]
        self._fill += k

    def _finish(self, n: int, position: Position) -> None:
        self.rows_out += n
        self._emitted_rows += n
        self.batches_out += 1
        self._last_emitted = position
        if self.ring_size is not None:
            self._slot = (self._slot + 1) % self.ring_size
        else:  # hand the arrays over: the next batch allocates new ones
            self._ring[0] = None
        if self.max_rows is not None and self.rows_out >= self.max_rows:
            self.done = True
            self._consumed = position

    def _emit(self) -> TrainingBatch:
        buffers = self._ring[self._slot]
        assert buffers is not None and self._fill_end is not None
        X, Y, W = buffers.X, buffers.y, buffers.w
        n = self._fill
        sb, end = self._fill_end
        position = sb.position_at(end)
        if n < self.batch_size:
            X = ModelInputs({k: v[:n] for k, v in X.items()}) if isinstance(X, dict) else X[:n]
            Y, W = Y[:n], None if W is None else W[:n]
        self._fill = 0
        self._fill_end = None
        spans, self._fill_spans = tuple(self._fill_spans), []
        skipped = self._ledger.take_until(self._fill_seq, end) if self._ledger.pending else ()
        self._finish(n, position)
        return TrainingBatch(X, Y, W, n, position, self._emitted_rows, skipped, spans)

    def _emit_view(self, seg: _Segment, i: int) -> TrainingBatch:
        """A training batch of views of the segment's arrays (Arrow memory, or the encoders' ids); ``y`` and
        the weights copied into the ring."""
        bs = self.batch_size
        position = seg.sb.position_at(i + bs)
        skipped = self._ledger.take_until(seg.seq, i + bs) if self._ledger.pending else ()
        views = ModelInputs({name: values[i:i + bs] for name, values in seg.inputs.items()})  # whole: arrays
        X: Any = next(iter(views.values())) if self.plan.single else views
        buffers = self._buffers(self._slot, seg.plan)
        Y, W = buffers.y, buffers.w
        Y[:] = seg.y[i:i + bs]
        if W is not None:
            W[:] = seg.w[i:i + bs]  # type: ignore[index]
        self._finish(bs, position)
        return TrainingBatch(X, Y, W, bs, position, self._emitted_rows, skipped, (Span(seg.sb, i, i + bs),))
