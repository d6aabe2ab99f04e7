"""What the training loop reports: per-batch events, metric events and the final summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from streamfit.sources._base import Position

__all__ = ["BatchEvent", "IdleEvent", "MetricsEvent", "StreamSummary"]

Metrics = Mapping[str, Any]


@dataclass(frozen=True)
class BatchEvent:
    """Sent to ``on_batch`` after a batch is trained: a safe point to checkpoint.

    ``position`` is the source position right after the batch's last row: everything before it is
    trained (or was deliberately skipped), so a restart from it loses and repeats nothing.
    ``loss`` is the estimator's own training loss (``loss_`` after ``partial_fit``) when it exposes one,
    else the batch's progressive loss (computed before training), else ``None``.

    Attributes
    ----------
    batch, rows
        Trained batches (1 for the first) and rows so far, this batch included.
    n_rows
        Rows in this batch.
    position
        The source position right after the batch's last row (a safe restart point).
    loss
        The training loss, as above.
    progressive_loss
        The batch's loss predicted before training on it (None when the loop does not evaluate).
    elapsed
        Seconds since the loop started.
    skipped
        :class:`~streamfit.Skipped` input settled with this batch (before ``position``, after the previous
        batch's).
    spans
        :class:`~streamfit.Span` records: the source rows this batch was made of.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from sklearn.linear_model import SGDRegressor
    >>> from streamfit import train_stream_sync
    >>> table = pa.table({"x": [0.0, 1.0, 2.0, 3.0] * 50, "y": [0.0, 2.0, 4.0, 6.0] * 50})
    >>> events = []
    >>> _ = train_stream_sync(SGDRegressor(), table, batch_size=50, on_batch=events.append)
    >>> [(e.batch, e.rows, e.n_rows) for e in events]
    [(1, 50, 50), (2, 100, 50), (3, 150, 50), (4, 200, 50)]
    >>> events[-1].position  # everything before it is trained: where a checkpoint resumes
    {'batch': 0, 'row': 200}
    """

    batch: int          # trained batches so far (1 for the first)
    rows: int           # trained rows so far
    n_rows: int         # rows in this batch
    position: Position
    loss: float | None
    progressive_loss: float | None
    elapsed: float      # seconds since the loop started
    skipped: tuple = ()  # Skipped input settled with this batch (before its position, after the previous)
    spans: tuple = ()    # Span: the source rows of this batch


@dataclass(frozen=True)
class IdleEvent:
    """Sent to ``on_idle`` every ``idle_every`` seconds while the trainer waits for rows: no step runs until the
    hook returns, so it may snapshot the estimator (checkpoint, publish, commit) as ``on_batch`` does.

    ``since`` (Unix time) is when the trainer last found nothing to train (after ``batch``, or at the start);
    ``pending_rows`` rows are read and wait for a full batch (trained after ``max_batch_wait`` seconds
    without new rows, or at the end of the stream).

    Attributes
    ----------
    batch, rows
        Trained batches and rows so far.
    position
        The source position after the last trained batch (None: nothing trained yet).
    since, idle_seconds
        When the trainer last found nothing to train (Unix time), and for how long since.
    pending_rows
        Rows read that wait for a full batch.
    """

    batch: int          # trained batches so far
    rows: int           # trained rows so far
    position: Position | None  # after the last trained batch (None: nothing trained yet)
    since: float
    idle_seconds: float
    pending_rows: int = 0


@dataclass(frozen=True)
class MetricsEvent:
    """Progressive-validation metrics after an evaluated batch (sent to ``on_metrics`` and the stream).

    Attributes
    ----------
    batch, rows, position
        Trained batches and rows so far, and the source position after this batch.
    batch_metrics
        The metrics of this batch (predicted before training on it).
    stream, window
        The metrics over every evaluated row so far, and over the last ``window`` evaluated rows.
    skipped_rows, skipped_messages
        Rows and whole messages skipped before ``position``, counted by reason.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from sklearn.linear_model import SGDRegressor
    >>> from streamfit import train_stream_sync
    >>> table = pa.table({"x": [0.0, 1.0, 2.0, 3.0] * 50, "y": [0.0, 2.0, 4.0, 6.0] * 50})
    >>> metrics = []
    >>> _ = train_stream_sync(SGDRegressor(), table, batch_size=50, on_metrics=metrics.append)
    >>> [m.batch for m in metrics]  # the first batch meets an untrained model: not evaluated
    [2, 3, 4]
    >>> sorted(metrics[-1].batch_metrics)
    ['loss', 'mae', 'rmse', 'rows']
    """

    batch: int
    rows: int
    position: Position
    batch_metrics: Metrics
    stream: Metrics     # over every evaluated row so far
    window: Metrics     # over the last ``window`` evaluated rows
    skipped_rows: Mapping[str, int] = None  # type: ignore[assignment]  # skipped before ``position``, by reason
    skipped_messages: Mapping[str, int] = None  # type: ignore[assignment]  # whole messages (undecodable, ...)

    def __post_init__(self) -> None:
        for name in ("skipped_rows", "skipped_messages"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, {})


@dataclass(frozen=True)
class StreamSummary:
    """Result of :func:`train_stream`.

    ``skipped_rows`` counts dropped rows by reason (``null``, ``non_finite``, ``non_integer_label``,
    ``negative_weight``, and the rows of whole record batches dropped for ``missing_column`` or
    ``wrong_type``); ``skipped_messages`` counts whole record batches / messages dropped by reason
    (``undecodable``, ``empty_batch``, ``missing_column``, ``wrong_type``, ``poison``).  Both cover the input
    before ``position`` exactly (input read ahead of it is not counted).
    ``position`` is where to resume: after the last trained row, or after trailing skipped input when the
    source was exhausted (``None`` if nothing was consumed).  ``ended_by`` is ``"end"`` (source
    exhausted), ``"max_rows"`` or ``"stop"``.

    Parameters
    ----------
    rows, batches
        Rows and batches trained.
    skipped_rows, skipped_messages
        Rows, and whole record batches or messages, dropped before ``position``, by reason (above).
    stream_metrics, window_metrics
        Progressive-validation metrics over every evaluated row, and over the last ``window`` of them.
    rows_per_s, elapsed
        Trained rows per second of the run, and its seconds.
    position
        Where to resume (above); None if nothing was consumed.
    ended_by
        ``"end"``, ``"max_rows"`` or ``"stop"``.
    dropped_metric_events
        :class:`~streamfit.MetricsEvent` s not delivered to a :meth:`~streamfit.StreamLoop.metric_events`
        reader that fell behind (its buffer was full).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from sklearn.linear_model import SGDRegressor
    >>> from streamfit import train_stream_sync
    >>> table = pa.table({"x": [0.0, 1.0, None, 3.0] * 50, "y": [0.0, 2.0, 4.0, 6.0] * 50})
    >>> summary = train_stream_sync(SGDRegressor(), table, batch_size=50)
    >>> summary.rows, summary.skipped_rows, summary.ended_by, summary.position
    (150, {'null': 50}, 'end', {'batch': 0, 'row': 200})
    """

    rows: int
    batches: int
    skipped_rows: dict[str, int]
    skipped_messages: dict[str, int]
    stream_metrics: dict[str, Any]
    window_metrics: dict[str, Any]
    rows_per_s: float
    elapsed: float
    position: Position | None
    ended_by: str
    dropped_metric_events: int = 0

    @property
    def n_skipped_rows(self) -> int:
        return sum(self.skipped_rows.values())
