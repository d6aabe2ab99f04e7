"""A checkpointed training run: resume exactly, checkpoint off the training path, roll back on divergence.

Every checkpoint holds the estimator's full state *and* the source position right after the last
batch it includes, written atomically; on resume both are restored together, so each row of the
stream takes effect exactly once however the process died.  Kafka offsets are committed only once
the checkpoint that covers them is durable, and noted first in the run's commit ledger: a resume from an
older checkpoint than the newest committed one (that one lost) trains the rows after it again.  They are
committed as soon as it is durable (a duty beside the loop), and before a rebalance takes a partition away
(a handover: its rows trained, checkpointed and committed, so its next owner starts after them).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import anyio
import numpy as np

from streamfit._stream import StreamLoop
from streamfit._columns.layout import ColumnLayout
from streamfit._stream.batching import Quarantine
from streamfit._stream.skips import SkipLedger
from streamfit._stream.deadletter import open_dead_letter
from streamfit._stream.options import StreamOptions
from streamfit._stream.events import BatchEvent, IdleEvent
from streamfit.checkpoint import AsyncCheckpointWriter, BackgroundPublisher, CheckpointStore, TableArrays
from streamfit.checkpoint._format import dir_name
from streamfit.checkpoint._fs import pause_point
from streamfit.daemon.commit_ledger import RunCommitLedger
from streamfit.daemon.guard import DivergenceGuard, guard_of
from streamfit.daemon.health import HealthFile, Metrics, log_event
from streamfit.daemon.poison import PoisonTracker
from streamfit.daemon.state import estimator_tables, restore_estimator, snapshot_estimator, snapshot_tables
from streamfit.exceptions import CheckpointError, DivergenceError, ResumeError, SourceError
from streamfit.history import HistoryOptions, HistorySink, Progress, RunHistory
from streamfit.sources import Position, Source, SourceBatch, open_source
from streamfit.sources._commits import Handover
from streamfit.sources._wakeup import loop_caller

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["Runner", "RunSummary"]


@dataclass
class RunSummary:
    """What a run did, counted across restarts (``rows``/``batches`` include resumed checkpoints).

    Attributes
    ----------
    rows, batches
        Rows and batches trained in all, resumed checkpoints included.
    position, ended_by
        Where the run stopped (the source position after the last trained row) and why (``"end"``,
        ``"max_rows"``, ``"stop"``).
    checkpoints, last_checkpoint, resumed_from
        Checkpoints written by this run, the last one's path, and the checkpoint it resumed from (None: fresh).
    rollbacks
        Divergence-guard rollbacks of this run.
    skipped_rows, skipped_messages
        Rows, and whole messages, skipped before ``position`` by reason (over resumes).
    metrics, rows_per_s
        The stream's progressive metrics, and this run's trained rows per second.
    rows_this_run, skipped_this_run
        Rows trained and skipped (by reason) by this run alone.
    quarantined, quarantined_rows
        Poison messages quarantined whole, and the poison rows quarantined (message, position, rows from its end).
    skipped_read, messages_skipped_read
        Rows, and whole messages, this run skipped as it read them, read-ahead included.
    """

    rows: int
    batches: int
    position: Position | None
    checkpoints: int
    last_checkpoint: str | None
    rollbacks: int
    resumed_from: str | None
    ended_by: str
    skipped_rows: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    rows_per_s: float = 0.0
    #: rows trained and rows skipped (by reason) by this run alone, not counting the resumed checkpoint's
    rows_this_run: int = 0
    skipped_this_run: dict[str, int] = field(default_factory=dict)
    skipped_messages: dict[str, int] = field(default_factory=dict)
    quarantined: list[str] = field(default_factory=list)
    #: the poison rows quarantined, by message and row (``{"message", "row": its position, "from_end"}``)
    quarantined_rows: list[dict[str, Any]] = field(default_factory=list)
    #: rows this run skipped as it read them, input read ahead of the final position included (``skipped_rows``
    #: counts only the input before it: a resume reads the rest again)
    skipped_read: dict[str, int] = field(default_factory=dict)
    #: whole messages (files) this run skipped as it read them, by reason (undecodable, empty_batch, poison)
    messages_skipped_read: dict[str, int] = field(default_factory=dict)


@dataclass
class _Snapshot:
    """A consistent point: estimator state + position + counters (host copies)."""

    step: int
    rows: int
    position: Position | None
    model: bytes
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]
    skipped_rows: dict[str, int] = field(default_factory=dict)
    skipped_messages: dict[str, int] = field(default_factory=dict)
    dead_letter: int = 0  # the dead-letter sink's mark
    #: a chain checkpoint's large tables (a full, or the rows touched since the previous checkpoint)
    tables: TableArrays | None = None
    #: the tables equal those of chain checkpoint ``tables_at`` (on disk): restored from there
    tables_at: int | None = None
    #: per table array: the rows touched since the previous checkpoint (lets a publisher patch after a full)
    changed: dict[str, np.ndarray] | None = None


class _KeepOpen(Source):
    """Lets the loop iterate a source without closing it: the runner commits offsets after the loop ends."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner

    async def __anext__(self) -> SourceBatch:
        return await self.inner.__anext__()

    async def commit(self, position: Position) -> None:
        await self.inner.commit(position)

    async def aclose(self) -> None:
        self._closed = True


#: without a time schedule (``every_seconds``), a stream quiet this long (s) is checkpointed (if anything is new)
QUIET_CHECKPOINT_AFTER = 1.0
#: the loop's idle events come at most this often and at least this often (s), within the schedules' periods
_IDLE_EVERY = (0.05, 1.0)
#: how often the run looks for a checkpoint write that became durable, to commit its offsets at once
_DURABLE_POLL = 0.005  # s
#: of a handover's time, what is left to checkpoint and commit once the rows are trained (waited for before)
_HANDOVER_COMMIT_SHARE = 0.4

#: the loop reads no daemon option: it gets them at their defaults (the Runner applies them)
#: nor the history's (the Runner keeps the run's history, its loops none)
_DAEMON_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(StreamOptions)
                                    if f.metadata["scope"] in ("daemon", "history")}


def _check_schedule(*, every_batches: int | None, every_seconds: float | None, resume: bool,
                    checkpoint_dir: Any, full_every: Any, publish_every: float | None, publish_path: Any) -> None:
    """ValueError naming the first inconsistent checkpoint or publishing option of a :class:`Runner`."""
    if every_batches is not None and every_batches < 1:
        raise ValueError(f"every_batches must be >= 1, got {every_batches!r}")
    if every_seconds is not None and not every_seconds > 0:
        raise ValueError(f"every_seconds must be > 0, got {every_seconds!r}")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir")
    if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
        raise ValueError(f"full_every must be an int >= 1 (1: every checkpoint full), got {full_every!r}")
    if publish_every is not None and not publish_every >= 0:
        raise ValueError(f"publish_every must be >= 0 seconds, got {publish_every!r}")
    if publish_every is not None and publish_path is None:
        raise ValueError("publish_every needs a publish_path")


class Runner:
    """Train ``estimator`` from ``source`` with checkpoints, exact resume and a divergence guard.

    ``source`` is a URI/path (re-opened at a position on resume or rollback) or a callable returning a
    fresh :class:`~streamfit.sources.Source`.  ``options`` (a :class:`~streamfit.StreamOptions`, or its
    fields as keyword arguments) go to the streaming loop and describe the divergence guard (``guard``,
    ``guard_factor``, ``poison_after``, ...: on by default, as in ``streamfit serve``; ``guard=`` may also be a
    :class:`~streamfit.daemon.guard.DivergenceGuard`), except that ``max_rows`` counts the rows to
    train in all, over resumes (a resumed run trains what the checkpoint's row counter leaves).  ``dead_letter`` (a sink,
    a JSON-lines path or ``kafka://HOST:PORT/topic``) keeps skipped input and quarantined poison messages;
    it is synced before every checkpoint that moves past them.

    A model with row-sparse tables (embeddings, hashed models, factorization machines) is checkpointed as a
    chain: a full checkpoint every ``full_every`` checkpoints, and in between deltas of the table rows
    touched since the previous one (dense weights in full each time).  A full is a copy-on-write snapshot
    (:mod:`streamfit._engine.steps.row_snapshot`): nothing is copied when it is taken; the writer streams the tables by row
    blocks while training goes on, each step saving aside the old values of the rows it overwrites that the
    writer has not passed yet.  ``publish_path`` gets the model of
    a durable checkpoint, written by a background thread at most every ``publish_every`` seconds, with a
    delta file of the rows changed beside it (:class:`~streamfit.checkpoint.BackgroundPublisher`).

    While no batch arrives the schedules go on (the loop's ``on_idle``, between steps): durable checkpoints are
    published and their offsets committed, what was trained since the last checkpoint is checkpointed when
    ``every_seconds`` says (with ``every_batches`` alone: once the stream was quiet
    :data:`QUIET_CHECKPOINT_AFTER` s), and the health file says the stream is idle and since when.  With
    ``max_batch_wait`` (``streamfit serve``: 1 s) the rows short of a full batch are trained too.

    With a ``checkpoint_dir`` the run keeps its metrics history in ``checkpoint_dir/history``, or in the
    ``history_dir`` option's directory (:mod:`streamfit.history`; cut as the ``history_every_rows`` /
    ``history_every_seconds`` options say, or as ``history``, a :class:`~streamfit.history.HistoryOptions`;
    ``history=False``: none).  ``trackers`` (:class:`~streamfit.history.HistorySink`, e.g.
    :class:`~streamfit.report.trackers.MlflowTracker`) see each record of it as it is written.

    Parameters
    ----------
    estimator
        The model to train (an estimator of :mod:`streamfit.estimators` or :mod:`streamfit.models`).
    source
        A source URI/path (opened with ``source_options``) or a callable returning a fresh source.
    checkpoint_dir
        Where checkpoints (and by default the history) go; None: no checkpoints.
    every_batches, every_seconds
        Checkpoint after this many batches, and/or this many seconds after the previous checkpoint.
    keep
        Checkpoints kept in ``checkpoint_dir`` (the newest, and those their chains depend on).
    resume
        Continue from the newest readable checkpoint in ``checkpoint_dir`` (weights, optimizer state, source
        position; none there: a fresh start).  Without it, a ``checkpoint_dir`` that holds checkpoints raises.
    publish_path, publish_every
        Where the model of a durable checkpoint is published, and at most how often (seconds).
    health_path, health_interval
        A JSON health file, rewritten at most every ``health_interval`` seconds.
    metrics
        A :class:`~streamfit.daemon.health.Metrics` (Prometheus) the run updates, or None.
    full_every
        For models with row-sparse tables: a full checkpoint every this many checkpoints, deltas between.
    source_options
        Keyword arguments of :func:`~streamfit.open_source` for a ``source`` given as a URI/path.
    options, **loop_options
        A :class:`~streamfit.StreamOptions` (or a mapping of its fields), or its fields as keywords.
    history
        A :class:`~streamfit.history.HistoryOptions`, True (from the options) or False (no history).
    trackers
        :class:`~streamfit.history.HistorySink` objects fed each history record as it is written.

    Examples
    --------
    A run, then a resume after a new file arrived: the second run trains only the new rows.

    >>> import os, tempfile, anyio, pyarrow as pa, pyarrow.parquet as pq
    >>> from streamfit import LinearRegressor
    >>> folder = tempfile.mkdtemp()
    >>> table = pa.table({"x": [0.0, 1.0, 2.0, 3.0] * 100, "y": [0.0, 2.0, 4.0, 6.0] * 100})
    >>> pq.write_table(table, os.path.join(folder, "part-0.parquet"))
    >>> ckpt = os.path.join(folder, "ckpt")
    >>> run = anyio.run(Runner(LinearRegressor(), f"parquet:{folder}", checkpoint_dir=ckpt, every_batches=2,
    ...                        batch_size=100, label="y").run)
    >>> run.rows, run.checkpoints, run.position
    (400, 2, {'file': 'part-0.parquet', 'row': 400})
    >>> pq.write_table(table.slice(0, 100), os.path.join(folder, "part-1.parquet"))
    >>> again = anyio.run(Runner(LinearRegressor(), f"parquet:{folder}", checkpoint_dir=ckpt, resume=True,
    ...                          batch_size=100, label="y").run)
    >>> again.rows, again.rows_this_run, again.position
    (500, 100, {'file': 'part-1.parquet', 'row': 100})
    """

    def __init__(self, estimator: Any, source: "str | Callable[[], Source]", *,
                 checkpoint_dir: "str | Path | None" = None, every_batches: int | None = None,
                 every_seconds: float | None = None, keep: int = 3, resume: bool = False,
                 publish_path: "str | Path | None" = None,
                 health_path: "str | Path | None" = None, health_interval: float = 1.0,
                 metrics: Metrics | None = None, full_every: int = 10, publish_every: float | None = None,
                 source_options: Mapping[str, Any] | None = None,
                 options: "StreamOptions | Mapping[str, Any] | None" = None,
                 history: "HistoryOptions | bool" = True, trackers: Sequence[HistorySink] = (),
                 **loop_options: Any) -> None:
        # guard=: the option (True/False: the guard the options' parameters describe), or a DivergenceGuard
        guard_given = loop_options.pop("guard", None) if isinstance(loop_options.get("guard"), DivergenceGuard) \
            else None
        self.options = StreamOptions.build(options, **loop_options)
        self.options.check_scope("loop", "history", "daemon", where="Runner (scale-out is streamfit.distributed's)")
        guard = guard_given if guard_given is not None else guard_of(self.options)
        _check_schedule(every_batches=every_batches, every_seconds=every_seconds, resume=resume,
                        checkpoint_dir=checkpoint_dir, full_every=full_every, publish_every=publish_every,
                        publish_path=publish_path)
        self.estimator = estimator
        self.source_spec = source
        self.source_options = dict(source_options or {})
        self.every_batches = every_batches
        self.every_seconds = every_seconds
        self.resume = resume
        self.full_every = full_every
        self.publish_every = publish_every
        self._init_stores(checkpoint_dir, keep, history, publish_path, trackers)
        self.guard = guard
        self.health = HealthFile(health_path, health_interval) if health_path is not None else None
        self.metrics = metrics
        #: rows to train in all, counted over resumes and rollbacks (the checkpoint's row counter)
        self.max_rows = self.options.max_rows
        dead_letter = self.options.dead_letter
        self.dead_letter = open_dead_letter(dead_letter) if isinstance(dead_letter, str) else dead_letter
        if self.dead_letter is not None and (self.store is not None or guard is not None):
            self.dead_letter.hold = True  # records wait for the checkpoint (or rollback point) that covers them
        self._init_run_state()

    def _init_stores(self, checkpoint_dir: "str | Path | None", keep: int, history: "HistoryOptions | bool",
                     publish_path: "str | Path | None", trackers: Sequence[HistorySink]) -> None:
        """Where the run writes: the checkpoint store, its commit ledger, the history, the published model."""
        self.store = CheckpointStore(checkpoint_dir, keep=keep) if checkpoint_dir is not None else None
        #: this run's own group commits (Kafka): tells them from another member's on resume
        self._commits = RunCommitLedger(checkpoint_dir) if checkpoint_dir is not None else None
        #: the metrics history beside the checkpoints (fed at interval ends, checkpoints and rollbacks)
        where = self.options.history_dir
        #: what logs the history as it is written (the CLI's --mlflow, --tensorboard)
        self.trackers = list(trackers)
        self.history = RunHistory(checkpoint_dir, history if isinstance(history, HistoryOptions) else
                                  self.options.history_options(), directory=where, sinks=trackers) \
            if (checkpoint_dir is not None or where is not None) and history is not False else None
        if trackers and self.history is None:
            raise ValueError("trackers log the run's metrics history: give a checkpoint_dir or the history_dir option "
                             "(and not history=False)")
        self.publish_path = Path(publish_path) if publish_path is not None else None
        if self.publish_path is not None:
            self.publish_path.parent.mkdir(parents=True, exist_ok=True)
        self._publisher: BackgroundPublisher | None = None
        self._chain_parent: int | None = None  # the last chain checkpoint submitted: the next delta's parent
        self._chain_depth = 0

    def _init_run_state(self) -> None:
        """The counters across restarts, the checkpoints in flight, the rollback and poison bookkeeping."""
        self.rows = 0
        self.batches = 0
        self.position: Position | None = None
        self.checkpoints = 0
        self.last_checkpoint: str | None = None
        self.rollbacks = 0
        self._resumed_from: str | None = None
        self._good: _Snapshot | None = None
        self._pending: dict[int, _Snapshot] = {}  # submitted, not yet known durable
        self._committed_step = -1
        self._durable_step = -1  # the last checkpoint known written (its commit may have been refused)
        self._checkpoint_requested = False
        self._last_checkpoint_time = time.monotonic()
        self._loop: StreamLoop | None = None
        self._source: Source | None = None
        self._rollback_reason: str | None = None
        self._writer: AsyncCheckpointWriter | None = None
        #: the one count of skipped input: passed (the resumed checkpoint's, then every loop's, which counts
        #: into it) and as read by this process (read-ahead included)
        self._skips = SkipLedger()
        self._quarantine = Quarantine()
        # poison input: rollbacks per message (unit key), never reset by checkpoints; poison messages' rows
        self._poison = PoisonTracker(self.guard.max_rollbacks if self.guard is not None else 3, self._quarantine.rows,
                                     self.guard.poison_rows if self.guard is not None else 64)
        self._rollback_units: list[str] = []
        self._good_run = 0  # good batches since the last rollback or lr recovery
        self._dead_letter_state: dict[str, Any] | None = None
        # messages of a diverged batch not yet trained alone since: no new rollback point until they are (or
        # are quarantined), so that a quarantine returns to the state before their first rollback
        self._suspects: set[str] = set()
        self._suspect_until = 0
        self._diverged_at = 0
        self._loop_running = False
        self._loss: float | None = None  # the last trained batch's, for the health file
        self._last_batch_at: float | None = None  # Unix time
        self._checkpoint_rows: int | None = None  # rows of the newest durable checkpoint
        self._t0 = 0.0
        self._rows_at_start = 0
        self._guard_every = self.every_batches or 100
        self._submitted_step = 0
        self._commit_lock: anyio.Lock | None = None  # _publish_and_commit from a batch, a handover, a durable write
        self._handovers: Callable[[Handover], None] | None = None  # queues a handover on the event loop
        #: the run's column plan: from the checkpoint on resume, else fixed by the first loop's first batch;
        #: every later loop (after a rollback, after a restart) reads the stream into the same layout.
        self._layout: ColumnLayout | None = None

    @property
    def loop_options(self) -> dict[str, Any]:
        """The stream options by name (read-only view of :attr:`options`)."""
        return self.options.as_dict()

    # -- control -----------------------------------------------------------------------------------
    def request_checkpoint(self) -> None:
        """Write a checkpoint after the batch being trained (from the event loop thread)."""
        self._checkpoint_requested = True

    # -- source ------------------------------------------------------------------------------------
    def _open(self, position: Position | None) -> Source:
        spec = self.source_spec
        source = spec() if callable(spec) else open_source(spec, **self.source_options)
        if self._commits is not None:  # the source notes its commits; those of checkpoints since this one are own
            self._commits.since = self._commits.step = self.batches  # a source's own rewind commits this point
            source.attach_commit_ledger(self._commits)
        if self.store is not None:  # a rebalance lets a partition go once its rows are checkpointed and committed
            source.attach_handover_settler(self._hand_over)
        if position is not None:
            try:
                source.seek(position)
            except NotImplementedError as exc:
                raise SourceError(f"{type(source).__name__} cannot restart at a saved position ({exc}); resuming "
                                  "or rolling back needs a replayable source: Parquet, an IPC file or Kafka") from exc
        return source

    # -- state ---------------------------------------------------------------------------------------
    def _snapshot(self, checkpoint: bool = False) -> _Snapshot:
        """The state now.  With row-sparse tables and a store: for a checkpoint, a full or a delta link of the
        chain; for a rollback point, a reference to the chain's newest checkpoint if no row changed since
        (nothing copied), else the tables copied whole."""
        mark = self.dead_letter.mark() if self.dead_letter is not None else 0
        tables = estimator_tables(self.estimator) if self.store is not None else None
        counters = (self.batches, self.rows, self.position)
        if tables is None:
            model, arrays, state = snapshot_estimator(self.estimator)
            return _Snapshot(*counters, model, arrays, state, self._skipped_rows(), self._skipped_messages(), mark)
        tables_at = None
        if checkpoint:  # a full (a copy-on-write snapshot the writer streams) every full_every, else a delta
            full_due = self._chain_parent is None or self._chain_depth + 1 >= self.full_every
            ts = snapshot_tables(self.estimator, None if full_due else self._chain_parent)
        elif self._chain_parent is not None and tables.touched().count == 0:
            ts = snapshot_tables(self.estimator, self._chain_parent)  # zero rows: nothing copied
            tables_at = self._chain_parent
        else:
            ts = snapshot_tables(self.estimator, None, copy=True)  # an in-memory rollback point
        return _Snapshot(*counters, ts.model, ts.arrays, ts.state, self._skipped_rows(), self._skipped_messages(),
                         mark, tables=None if tables_at is not None else ts.tables, tables_at=tables_at,
                         changed=ts.changed if checkpoint and self._chain_parent is not None else None)

    def _meta(self, snap: _Snapshot, summary: Any | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"rows": snap.rows, "batches": snap.step, "position": snap.position,
                                "estimator": snap.state, "rollbacks": self.rollbacks,
                                "source": self.source_spec if isinstance(self.source_spec, str) else None,
                                "skipped_rows": snap.skipped_rows, "skipped_messages": snap.skipped_messages,
                                "poison": self._poison_state()}
        layout = self._current_layout()
        if layout is not None:
            meta["columns"] = layout.to_json()
        if self._dead_letter_state is not None:
            meta["dead_letter"] = self._dead_letter_state
        if summary is not None:
            meta["metrics"] = {"stream": summary.stream_metrics, "window": summary.window_metrics}
        return meta

    def _current_layout(self) -> ColumnLayout | None:
        if self._layout is None and self._loop is not None:
            self._layout = self._loop.rebatcher.layout
        return self._layout

    def _restore_layout(self, saved: Any) -> None:
        """Take the checkpoint's column plan; refuse a configuration that contradicts it."""
        opts = self.options
        if saved is None:  # a checkpoint written before column plans were saved
            log_event("resume", "the checkpoint holds no column plan: the features are taken as configured")
            return
        try:
            layout = ColumnLayout.from_json(saved)
            layout.check_matches(features=None if opts.features is None else list(opts.features),
                                 label=opts.label, weight=opts.weight, dtype=opts.dtype, task=opts.resolved_task,
                                 what="the checkpoint's column plan")
        except ValueError as exc:
            raise ResumeError(str(exc)) from None
        classes, saved_classes = opts.classes, getattr(self.estimator, "classes_", None)
        if classes is not None and saved_classes is not None and list(np.asarray(saved_classes).tolist()) != list(
                np.asarray(classes).tolist()):
            raise ResumeError(f"the checkpoint's classes are {np.asarray(saved_classes).tolist()}, the run is "
                                  f"configured with {list(classes)}: a run keeps its classes")
        self._layout = layout

    def _poison_state(self) -> dict[str, Any]:
        """Rollbacks per message, the poison messages' bisection, the quarantined rows and messages (the newest
        1024 of each)."""
        return self._poison.state(self._quarantine.skip)

    def _load_poison(self, state: Mapping[str, Any]) -> None:
        self._quarantine.skip = self._poison.load(state)
        self._quarantine.isolate = set(self._poison.strikes) - self._quarantine.skip

    def _restore(self, snap: _Snapshot) -> None:
        arrays = snap.arrays
        if snap.tables_at is not None:  # the tables of a chain checkpoint: read back from disk (rare: rollbacks)
            assert self.store is not None
            if self._writer is not None:
                self._writer.flush()
            arrays = {**self.store.load(dir_name(snap.tables_at)).arrays, **snap.arrays}
        elif snap.tables is not None:
            if snap.tables.is_delta:
                raise CheckpointError(f"internal: cannot restore the delta snapshot of batch {snap.step} alone")
            arrays = {**snap.arrays, **{k: v for k, v in snap.tables.arrays.items() if isinstance(v, np.ndarray)}}
        restore_estimator(self.estimator, snap.state, arrays)
        tables = estimator_tables(self.estimator)
        if tables is not None and snap.tables_at is not None and snap.tables_at == self._chain_parent:
            tables.clear_touched()  # the tables equal the chain's newest checkpoint again
        self.rows, self.batches, self.position = snap.rows, snap.step, snap.position
        self._skips.restore(snap.skipped_rows, snap.skipped_messages)

    def _load_checkpoint(self) -> None:
        assert self.store is not None
        ckpt = self.store.recover()  # corrupt newer checkpoints set aside: later saves go on
        if ckpt is None:
            log_event("resume", "no checkpoint to resume from: starting fresh", root=str(self.store.root))
            return
        meta = ckpt.meta
        snap = _Snapshot(int(meta["batches"]), int(meta["rows"]), meta.get("position"), ckpt.model_bytes,
                         dict(ckpt.arrays), meta["estimator"],
                         {k: int(v) for k, v in meta.get("skipped_rows", {}).items()},
                         {k: int(v) for k, v in meta.get("skipped_messages", {}).items()})
        self._restore(snap)
        if ckpt.link is not None:  # continue its chain; the rollback point refers to it on disk
            self._chain_parent, self._chain_depth = ckpt.step, ckpt.link.depth
            tables = estimator_tables(self.estimator)
            if tables is not None:
                tables.clear_touched()
            if self._publisher is not None and tables is not None:  # it starts from this state, on disk
                full, chain = self.store.chain_of(ckpt.path)
                self._publisher.prime_chain(ckpt.skeleton, ckpt.link.model_fill, full, chain)
            snap = replace(snap, arrays={k: v for k, v in snap.arrays.items() if k not in ckpt.link.tables},
                           tables_at=ckpt.step)
        self._restore_layout(meta.get("columns"))
        self.rollbacks = int(meta.get("rollbacks", 0))
        self._load_poison(meta.get("poison") or {})
        if self.dead_letter is not None:
            self.dead_letter.restore(meta.get("dead_letter"))
            self._dead_letter_state = meta.get("dead_letter")
            snap.dead_letter = self.dead_letter.mark()
        self._good = snap
        self._committed_step = snap.step
        self._durable_step = snap.step
        self._submitted_step = snap.step
        self._resumed_from = str(ckpt.path)
        self.last_checkpoint = str(ckpt.path)
        self._checkpoint_rows = snap.rows
        log_event("resume", f"resumed from {ckpt.path.name}: {snap.rows} rows, {snap.step} batches",
                  checkpoint=str(ckpt.path), rows=snap.rows, batches=snap.step, position=snap.position)

    def _dead_letter_start(self) -> None:
        """Before the first checkpoint of a run, the dead-letter sink's state is kept beside the checkpoints
        (``dead-letter-start.json``): a run that dies before its first checkpoint and is resumed then starts
        the sink from there, so the dead letters it had written are not written twice."""
        if self.dead_letter is None or self.store is None or self._resumed_from is not None:
            return
        path = Path(self.store.root) / "dead-letter-start.json"
        if self.resume and path.is_file():
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"cannot read {path}: {exc}") from exc
            self.dead_letter.restore(state)
            log_event("resume", "dead-letter sink restored to the start of the run that wrote no checkpoint",
                      dead_letter=state)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.dead_letter.state(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # -- checkpoints ---------------------------------------------------------------------------------
    def _due(self) -> bool:
        if self.store is None or self._suspects:
            return False  # while a diverged message is replayed, the rollback point stays before it
        if self._checkpoint_requested:
            return True
        if self.every_batches is not None and self.batches - self._submitted_step >= self.every_batches:
            return True  # a checkpoint skipped while a write was in flight is retried at the next batch
        return self.every_seconds is not None and time.monotonic() - self._last_checkpoint_time >= self.every_seconds

    def _submit(self, wait: bool) -> bool:
        assert self._writer is not None
        if not wait and self._writer.busy:
            return False  # a write is in flight: try again after the next batch
        if self.dead_letter is not None:  # durable before any checkpoint moves past them
            self._dead_letter_state = self.dead_letter.sync()
        snap = self._snapshot(checkpoint=True)
        if self.history is not None:  # the interval ending here is on disk before the checkpoint past it
            self.history.boundary(sync=True)
        summary = self._loop.summary() if self._loop is not None else None
        if not self._writer.submit(snap.step, snap.model, snap.arrays, self._meta(snap, summary), wait=wait,
                                   tables=snap.tables):
            return False  # (a streamed snapshot not queued is released by the writer)
        self._pending[snap.step] = snap
        self._submitted_step = snap.step
        good = snap
        if snap.tables is not None:  # a link of the chain: the next delta counts the rows touched from now
            self._chain_depth = self._chain_depth + 1 if snap.tables.is_delta and not snap.tables.compact else 0
            self._chain_parent = snap.step
            tables = estimator_tables(self.estimator)
            assert tables is not None
            tables.clear_touched()
            good = replace(snap, tables=None, tables_at=snap.step)  # a rollback reads its tables back from disk
        self._good = good  # a consistent state: the rollback target, durable or not
        self._checkpoint_requested = False
        self._last_checkpoint_time = time.monotonic()
        return True

    async def _publish_and_commit(self) -> SourceError | None:
        """Handle writes that became durable: log, publish the model, commit the source's offsets; return the
        source's refusal of that commit, if it refused it."""
        if self._commit_lock is None:
            self._commit_lock = anyio.Lock()
        async with self._commit_lock:  # one at a time: commits go out in checkpoint order
            return await self._settle_durable()

    async def _settle_durable(self) -> SourceError | None:
        assert self._writer is not None
        result = self._writer.last_result
        if result is None or result.step not in self._pending:
            return None
        done = sorted(step for step in self._pending if step <= result.step)
        snap = self._pending[result.step]
        durable = [self._pending.pop(step) for step in done]  # written in order: the earlier ones too
        self._durable_step = max(self._durable_step, snap.step)
        self.checkpoints += 1
        self.last_checkpoint = str(result.path)
        self._checkpoint_rows = snap.rows
        log_event("checkpoint", f"checkpoint {result.path.name} written in {result.seconds * 1e3:.1f} ms",
                  path=str(result.path), step=snap.step, rows=snap.rows, seconds=result.seconds,
                  position=snap.position)
        if self.metrics is not None:
            self.metrics.ckpt_seconds.set(result.seconds)
        if self.history is not None:
            self.history.checkpoint(snap.step, snap.rows, result.seconds, result.path)
        if self._publisher is not None:  # written by its own thread, at most every publish_every seconds
            assert self.store is not None
            for done_snap in durable:  # every link, in order: the publisher follows the chain
                self._publisher.offer(done_snap.step, done_snap.model, done_snap.tables, done_snap.changed,
                                      checkpoint=self.store.root / dir_name(done_snap.step))
        if snap.position is not None and self._source is not None and snap.step > self._committed_step:
            if self._commits is not None:
                self._commits.step = snap.step
            try:
                await self._source.commit(snap.position)
            except SourceError as exc:  # a rebalance ahead of it: normal in a group, not a reason to stop
                log_event("commit", f"commit of checkpoint {snap.step} refused ({exc}): the next checkpoint's "
                          "commit carries its offsets (a position names every partition trained; a partition "
                          "revoked meanwhile starts its next owner at the group's last commit)",
                          level=logging.WARNING, step=snap.step, position=snap.position,
                          committed=self._committed_step, error=str(exc))
                return exc
            self._committed_step = snap.step
        return None

    # -- per batch -----------------------------------------------------------------------------------
    async def _on_batch(self, event: BatchEvent) -> None:
        assert self._loop is not None
        self.rows = self._base_rows + event.rows
        self.batches = self._base_batches + event.batch
        self.position = event.position
        if self.guard is not None:
            trainer = getattr(self.estimator, "trainer_", None)
            refused = 0 if trainer is None else trainer.n_skipped - self._refused_base
            reason = self.guard.check(event.loss, refused)
            if reason is not None:
                self._rollback_reason = reason
                self._rollback_units = self._poison.diverged(event.spans)
                self._diverged_at = self.batches
                self._loop.stop()
                return
            self._after_good_batch(event)
        if self._writer is not None:
            await self._publish_and_commit()
            if self._due():
                self._submit(wait=False)
        elif self.guard is not None and not self._suspects and (
                self._good is None or self.batches - self._good.step >= self._guard_every):
            self._new_rollback_point()  # no checkpoints: in-memory rollback points only
        if self.guard is not None and self._good is None:  # the first trained batch is the first rollback point
            if self._writer is not None and estimator_tables(self.estimator) is not None:
                self._submit(wait=True)  # big tables: a checkpoint on disk (streamed), not a copy in memory
            else:
                self._new_rollback_point()
        self._loss = event.loss
        self._observe()

    # -- while the stream is quiet -----------------------------------------------------------------------
    def _idle_duties(self) -> bool:
        """Anything to do while no batch arrives: checkpoints (and their publishing and commits), health, metrics."""
        return self._writer is not None or self.health is not None or self.metrics is not None

    def _idle_every(self) -> float:
        """How often the loop's idle events come: within the shortest period of the schedules."""
        periods = [p for p in (self.every_seconds, self.publish_every if self.publish_every else None,
                               self.health.interval if self.health is not None else None) if p is not None]
        low, high = _IDLE_EVERY
        return min(high, max(low, min(periods, default=high)))

    async def _on_idle(self, event: IdleEvent) -> None:
        """The stream is quiet (no step runs while this does): the schedules go on.  Durable checkpoints are
        settled (logged, published, their offsets committed); what was trained since the last checkpoint is
        checkpointed when the time schedule says (a checkpoint of nothing new is skipped); the health file
        says the stream is idle and since when."""
        if self._rollback_reason is not None:
            return
        if self._writer is not None:
            await self._publish_and_commit()
            if self.batches > self._submitted_step and self._quiet_due(event):
                self._submit(wait=False)
        self._observe(idle_since=event.since)

    def _quiet_due(self, event: IdleEvent) -> bool:
        """A checkpoint due on a quiet stream: by the time schedule, else once it was quiet
        :data:`QUIET_CHECKPOINT_AFTER` seconds (a schedule in batches alone would never come)."""
        if self._due():
            return True
        return (self.store is not None and not self._suspects and self.every_seconds is None
                and event.idle_seconds >= QUIET_CHECKPOINT_AFTER)

    def _new_rollback_point(self) -> None:
        if self.dead_letter is not None:
            self._dead_letter_state = self.dead_letter.sync()
        self._good = self._snapshot()
        if self.history is not None:  # a rollback comes back here: an interval ends here
            self.history.boundary()

    def _after_good_batch(self, event: BatchEvent) -> None:
        """A batch passed the guard: its messages are cleared of suspicion, quarantines are no longer "in a
        row"; the lr scale recovers."""
        assert self.guard is not None
        if self._suspects:
            # cleared once trained to its end (a quarantine then returns before the whole message)
            self._suspects.difference_update(u.key for span in event.spans for u in span.units()
                                             if span.stop >= u.stop)
            if self.batches > self._suspect_until:  # the replay went past where they were: they are not coming
                self._suspects.clear()
        self._poison.in_a_row = 0
        self._good_run += 1
        trainer = getattr(self.estimator, "trainer_", None)
        if trainer is None or self._good_run < self.guard.recover_after or not trainer.lr_scale < 1:
            return
        self._good_run = 0
        trainer.lr_scale = min(1.0, trainer.lr_scale * self.guard.recover_factor)
        log_event("lr_recovered", f"{self.guard.recover_after} good batches: learning-rate scale back up to "
                  f"x{trainer.lr_scale:g}", lr_scale=trainer.lr_scale, batches=self.batches)

    def _skipped_rows(self) -> dict[str, int]:
        """Skipped rows by reason, up to the position of the last trained batch: finished (and resumed)
        runs plus the loop running now."""
        return dict(self._skips.rows)

    def _skipped_messages(self) -> dict[str, int]:
        """Skipped whole messages by reason (undecodable, empty_batch, poison, ...), likewise."""
        return dict(self._skips.messages)

    def _observe(self, idle_since: float | None = None) -> None:
        """Health file and metrics: after a trained batch, or while the stream is quiet (``idle_since``)."""
        if self.history is not None:  # an interval due by time ends on a quiet stream too
            self.history.batch(self.rows)
        elapsed = time.perf_counter() - self._t0
        rate = (self.rows - self._rows_at_start) / elapsed if elapsed > 0 else 0.0
        if idle_since is None:
            self._last_batch_at = time.time()
        if self.health is not None:
            self.health.update(last_batch_at=self._last_batch_at, rows=self.rows, batches=self.batches,
                               position=self.position, loss=self._loss, rows_per_s=rate,
                               last_checkpoint=self.last_checkpoint, checkpoint_rows=self._checkpoint_rows,
                               idle=idle_since is not None, idle_since=idle_since,
                               skipped_rows=self._skipped_rows(), skipped_messages=self._skipped_messages())
        if self.metrics is not None:
            m = self.metrics
            m.rows.set(self.rows)
            m.batches.set(self.batches)
            m.rows_per_s.set(rate)
            if self._last_batch_at is not None:
                m.last_batch.set(self._last_batch_at)
            m.rollbacks.set(self.rollbacks)
            m.ckpt_age.set(time.monotonic() - self._last_checkpoint_time)
            assert self._loop is not None
            window_loss = self._loop.summary().window_metrics.get("loss")
            if window_loss is not None:
                m.loss.set(window_loss)
            for reason, count in self._skipped_rows().items():
                m.skipped.labels(reason).set(count)
            for reason, count in self._skipped_messages().items():
                m.skipped_messages.labels(reason).set(count)
            trainer = getattr(self.estimator, "trainer_", None)
            if trainer is not None:
                m.lr_scale.set(trainer.lr_scale)
            for part, value in _position_parts(self.position):
                m.position.labels(part).set(value)

    # -- the run -------------------------------------------------------------------------------------
    async def run(self, stop_event: anyio.Event | None = None) -> RunSummary:
        """Train until the source ends or ``stop_event`` is set; write a final checkpoint; return a summary.

        Parameters
        ----------
        stop_event
            An :class:`anyio.Event`; setting it stops the run after the current batch (None: run to the end).
        """
        self._start()
        skipped_at_start = self._skipped_rows()
        summary = None
        ended_by = "end"
        try:
            while True:
                summary = await self._run_once(stop_event)
                ended_by = summary.ended_by
                if self._rollback_reason is None:
                    break
                await self._roll_back()
            await self._final_checkpoint()
        finally:
            await self._close()
        elapsed = time.perf_counter() - self._t0
        result = RunSummary(self.rows, self.batches, self.position, self.checkpoints, self.last_checkpoint,
                            self.rollbacks, self._resumed_from, ended_by, self._skipped_rows(),
                            {} if summary is None else {"stream": summary.stream_metrics,
                                                        "window": summary.window_metrics},
                            (self.rows - self._rows_at_start) / elapsed if elapsed > 0 else 0.0,
                            self.rows - self._rows_at_start,
                            {k: n - skipped_at_start.get(k, 0) for k, n in self._skips.rows.items()
                             if n > skipped_at_start.get(k, 0)},
                            self._skipped_messages(), sorted(self._quarantine.skip),
                            self._poison.message_rows(), dict(self._skips.read_rows),
                            dict(self._skips.read_messages))
        log_event("shutdown", f"stopped ({ended_by}): {self.rows} rows, {self.batches} batches, "
                  f"{self.checkpoints} checkpoint(s)", rows=self.rows, batches=self.batches, ended_by=ended_by,
                  last_checkpoint=self.last_checkpoint)
        return result

    def _start(self) -> None:
        """Before the first loop: the publisher, the resumed checkpoint (or a check that there is none), the
        dead letters, the history, the checkpoint writer."""
        if self.publish_path is not None:
            self._publisher = BackgroundPublisher(self.publish_path, self.publish_every or 0.0)
        if self.resume:
            self._load_checkpoint()
        elif self.store is not None and self.store.list():
            raise ResumeError(f"{self.store.root} already holds checkpoints: resume from them (--resume) or "
                              "use an empty checkpoint directory")
        if self._commits is not None and self._resumed_from is None:
            self._commits.reset()  # a fresh run: an earlier run's commits in this directory are not its own
        self._dead_letter_start()
        if self.history is not None:
            self.history.start(self._history_progress, resumed_from=self._resumed_from,
                               source=self.source_spec if isinstance(self.source_spec, str) else None,
                               config=self._history_config())
        self._t0 = time.perf_counter()
        self._rows_at_start = self.rows
        if self.store is not None:
            self._writer = AsyncCheckpointWriter(self.store)
        log_event("start", f"training from {self.source_spec if isinstance(self.source_spec, str) else 'source'}",
                  rows=self.rows, batches=self.batches, position=self.position)

    async def _final_checkpoint(self) -> None:
        """After the last loop: what was trained since the last durable checkpoint is checkpointed, published
        and committed."""
        if self._writer is not None and self.batches and (self._committed_step < self.batches):
            # wait in a worker thread: the event loop stays free to see a second signal
            await anyio.to_thread.run_sync(self._writer.flush)
            await self._publish_and_commit()
            if self._committed_step < self.batches:
                # not written again when it is on disk and only its commit was refused (a rebalance ahead of it:
                # the partitions' next owner starts at the group's last commit)
                if self.batches not in self._pending and self._durable_step < self.batches:
                    self._submit(wait=True)  # the writer is idle: returns at once
                await anyio.to_thread.run_sync(self._writer.flush)
                await self._publish_and_commit()

    async def _close(self) -> None:
        """The history, the writer, the publisher (its last model out first), the dead letters, the source."""
        if self.history is not None:
            self.history.close()
        if self._writer is not None:
            self._writer.close()
        if self._publisher is not None:  # the last durable checkpoint's model, published before exit
            await anyio.to_thread.run_sync(self._publisher.close)
        if self.dead_letter is not None:
            self.dead_letter.close()
        if self._source is not None:
            await self._source.aclose()
            self._source = None

    async def _run_once(self, stop_event: anyio.Event | None) -> Any:
        if self._source is not None:
            await self._source.aclose()
        self._source = self._open(self.position)
        self._base_rows, self._base_batches = self.rows, self.batches
        trainer = getattr(self.estimator, "trainer_", None)
        self._refused_base = 0 if trainer is None else trainer.n_skipped
        self._rollback_reason = None
        self._current_layout()  # the previous loop's (before a rollback)
        self._loop = StreamLoop(self.estimator, _KeepOpen(self._source),
                                replace(self.options, max_rows=self._rows_left(), dead_letter=self.dead_letter,
                                        **_DAEMON_DEFAULTS),
                                on_batch=self._on_batch, on_idle=self._on_idle if self._idle_duties() else None,
                                idle_every=self._idle_every(), stop_event=stop_event, layout=self._layout,
                                quarantine=self._quarantine if self.guard is not None else None,
                                skips=SkipLedger(parent=self._skips))
        self._loop_running = True
        send, receive = anyio.create_memory_object_stream[Handover](16)
        call = loop_caller()

        def hand_over(handover: Handover) -> None:  # on the event loop
            try:
                send.send_nowait(handover)
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                handover.done.set()

        self._handovers = lambda handover: call(lambda: hand_over(handover))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._duties, receive)
                summary = await self._loop.run()
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the loop's or a duty's error, raised as itself
            raise group.exceptions[0] if len(group.exceptions) == 1 else group
        finally:
            self._handovers = None
            send.close()
            receive.close()
            self._loop_running = False
        if self._rollback_reason is None and summary.position is not None:
            self.position = summary.position  # may move past trailing skipped input
        return summary

    def _history_progress(self) -> Progress:
        """The counters the history records at an interval's end."""
        trainer = getattr(self.estimator, "trainer_", None)
        lag = getattr(self._source, "lag", None)
        return Progress(self.batches, self.rows, self._skipped_rows(), self._skipped_messages(),
                        self._loop.summary().stream_metrics if self._loop is not None else {},
                        None if trainer is None else float(trainer.lr_scale),
                        lag(self.position) if callable(lag) and self.position is not None else {})

    def _history_config(self) -> dict[str, Any]:
        """The run's configuration as the history keeps it (the report shows it)."""
        est = self.estimator
        params = est.get_params(deep=False) if hasattr(est, "get_params") else {}
        return {"estimator": type(est).__name__, "params": params, "options": self.options.as_dict(),
                "checkpoints": {"every_batches": self.every_batches, "every_seconds": self.every_seconds,
                                "keep": self.store.keep if self.store is not None else None,
                                "full_every": self.full_every},
                "publish": None if self.publish_path is None else str(self.publish_path)}

    # -- beside the loop: handovers (Kafka rebalances), commits as soon as a checkpoint is durable --------
    def _hand_over(self, handover: Handover) -> None:
        """The source's settler (called in its consumer thread, inside a revoke): settled on the event loop."""
        queue = self._handovers
        if queue is None:
            handover.done.set()
        else:
            queue(handover)

    async def _duties(self, handovers: Any) -> None:
        """Settle each handover; commit a checkpoint's offsets as soon as it is durable (the window in which a
        member killed after its checkpoint leaves the group's offset behind), not at the next batch."""
        while True:
            handover = None
            with anyio.move_on_after(_DURABLE_POLL):
                handover = await handovers.receive()
            if handover is not None:
                try:
                    await self._settle_handover(handover)
                finally:
                    handover.done.set()
            elif self._pending and self._writer is not None and not self._writer.busy:
                await self._publish_and_commit()

    async def _settle_handover(self, handover: Handover) -> None:
        """Train the rows the source returned of the revoked partitions (the queued batches, and the rows waiting
        for a full batch at once: waiting ``max_batch_wait`` for them outlasted the group's patience, tansu's ~1 s,
        and the commit was refused), checkpoint and commit them, before ``handover.deadline``; what is not done by
        then is left to the next owner."""
        if self._writer is None:
            return
        left = handover.deadline - time.monotonic()
        with anyio.move_on_after(max(0.0, left * (1 - _HANDOVER_COMMIT_SHARE))):
            while not self._trained_up_to(handover) and self._loop_running and self._rollback_reason is None:
                if self._loop is not None:  # the rows short of a full batch: now, not after max_batch_wait (1 s)
                    self._loop.train_pending()
                await anyio.sleep(0.002)
        step = self.batches
        refused = None
        with anyio.move_on_after(max(0.0, handover.deadline - time.monotonic())):
            while self._committed_step < step and self._rollback_reason is None and not self._suspects:
                if self._submitted_step < step and not self._writer.busy:
                    self._submit(wait=False)
                await anyio.to_thread.run_sync(self._writer.flush)
                refused = await self._publish_and_commit()
                if refused is not None:  # the group refused the commit (a rebalance ahead of it): let go
                    break
        if self._committed_step >= step:
            handover.committed.set()
        else:
            log_event("handover", f"partitions {sorted(handover.returned)} of {handover.topic} revoked before "
                      f"batch {step} was checkpointed and committed{f': {refused}' if refused else ''}; their next "
                      "owner starts at the group's last commit", step=step, committed=self._committed_step)

    def _trained_up_to(self, handover: Handover) -> bool:
        """The trained position has every row the source returned of the handover's partitions."""
        parts = self.position.get("partitions") if isinstance(self.position, Mapping) else None
        if not isinstance(parts, Mapping):
            return not handover.returned
        for p, returned in handover.returned.items():
            at = parts.get(str(p))
            if not isinstance(at, Mapping) or (at.get("offset", -1), at.get("row", -1)) < returned:
                return False
        return True

    def _rows_left(self) -> int | None:
        """What ``max_rows`` leaves to train from the current row counter (restored on resume or rollback)."""
        return None if self.max_rows is None else max(self.max_rows - self.rows, 0)

    async def _roll_back(self) -> None:
        reason = self._rollback_reason
        guard = self.guard
        assert guard is not None
        self.rollbacks += 1
        good = self._good
        if good is None:
            raise DivergenceError(f"training diverged ({reason}) before any good state was saved")
        trainer = self.estimator.trainer_
        decision = self._poison.rollback(guard, self._quarantine, self._rollback_units, trainer.lr_scale,
                                         self.options.on_bad, str(reason), self.rollbacks)
        verdict, scale, poison = decision.verdict, decision.scale, decision.names
        self._suspects.update(k for k in self._rollback_units if k not in self._quarantine.skip)
        self._suspect_until = self._diverged_at + 8 + 2 * len(self._suspects)
        self._pending.clear()
        at_rows = self.rows
        self._restore(good)
        if self.dead_letter is not None:
            self.dead_letter.rewind(good.dead_letter)  # replayed skips are written again
        trainer = self.estimator.trainer_
        trainer.lr_scale = scale
        trainer.n_skipped = 0
        # the running mean of the good batches' loss is kept: reset, its warmup would let a replay train through
        # a divergence it can only see by the factor (a finite loss far above the mean), as the first pass did not
        self._good_run = 0
        if self.history is not None:
            self.history.rollback(at_rows=at_rows, to_step=good.step, to_rows=good.rows, reason=str(reason),
                                  lr_scale=scale, quarantined=tuple(poison))
        if poison:
            log_event("quarantine", f"poison {', '.join(poison)}: training on it diverged ({reason}); quarantined "
                      f"(skipped as 'poison'), rolled back to batch {good.step} (row {good.rows}), learning-rate "
                      f"scale x{scale:g}", reason=reason, messages=poison, step=good.step, rows=good.rows,
                      lr_scale=scale, rollbacks=self.rollbacks,
                      rows_quarantined=[r.to_json() for r in verdict.rows])
        elif verdict.bisected:
            log_event("bisect", f"poison message {', '.join(verdict.bisected)}: its rows in the batch that diverged "
                      f"({reason}) are cut in two, trained apart from batch {good.step} (row {good.rows}) on",
                      reason=reason, messages=verdict.bisected, step=good.step, rows=good.rows,
                      rollbacks=self.rollbacks)
            pause_point(f"bisect{self.rollbacks}")  # a test kills the process here (during a bisection)
        else:
            log_event("rollback", f"divergence: {reason}; rolled back to batch {good.step} "
                      f"(row {good.rows}) and lowered the learning rate to x{scale:g}",
                      reason=reason, step=good.step, rows=good.rows, lr_scale=scale, rollbacks=self.rollbacks,
                      messages=self._rollback_units)
        self._good = self._snapshot()  # same weights, new rate
        self._good.dead_letter = good.dead_letter


def _position_parts(position: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Numeric leaves of a position, as (dotted name, value), for metrics."""
    out: list[tuple[str, float]] = []
    if isinstance(position, Mapping):
        for k, v in position.items():
            out += _position_parts(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(position, (int, float)) and not isinstance(position, bool) and math.isfinite(position):
        out.append((prefix, float(position)))
    return out
