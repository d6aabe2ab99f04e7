"""The async training loop: read, rebatch, evaluate-then-train, with backpressure, under asyncio or trio.

Three stages overlap::

    reader task (event loop)                         trainer (host task, work in a worker thread)
    source.__anext__ -> Rebatcher.push --[bounded queue of TrainingBatch]--> predict, partial_fit -> hooks

* The reader pulls record batches from the source (decoding happens in the source) and rebatches them
  on the event loop (a copy of ``batch_size`` rows, no allocation once the buffer ring is warm).
* The queue (an anyio memory object stream of ``queue_size``) gives backpressure: a fast source blocks
  in ``send``; at most ``queue_size + IN_FLIGHT_EXTRA`` training batches exist at once (``queue_size``
  queued, one being trained, one being filled or waiting to be queued), which is also the number of
  reused buffers (see :mod:`streamfit._stream.batching`).
* The trainer runs the progressive prediction and ``partial_fit`` in one call in its own long-lived
  worker thread (:mod:`streamfit._stream.step_thread`), so the event loop keeps reading while the model
  trains; the next queued batch is handed over without yielding to the reader in between.  Steps of
  streamfit's own estimators that take less than ``_INLINE_BELOW`` (0.3 ms, e.g. a linear model) run on
  the event loop thread instead, once ``_INLINE_AFTER`` full batches in a row were that fast: the thread
  round trip cost more than the step.  ``partial_fit`` is never interrupted: cancelling the loop waits
  for the running step to finish, so the model is never half-updated.
* A quiet stream: while the queue is empty the trainer's task does the duties of a quiet stream, between
  steps: after ``max_batch_wait`` seconds without new rows it takes the rows waiting for a full batch
  (only while the reader awaits the source, so nothing is half-pushed; the queue is empty, so the order of
  rows is kept) and trains them; every ``idle_every`` seconds it calls ``on_idle`` (checkpoints, commits
  and health of a quiet stream).  Neither runs while a step does.

Errors raised while reading or rebatching travel through the queue: every batch completed before the
bad input is trained first, then the error is raised (deterministic model state).  The source is closed
on exit in every case.
"""

from __future__ import annotations

import enum
import inspect
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any, Awaitable, Callable, Mapping, Union

import anyio
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from streamfit.sources._base import Position, Source
from streamfit._stream.batching import IN_FLIGHT_EXTRA, Quarantine, Rebatcher, TrainingBatch
from streamfit._columns.layout import ColumnLayout
from streamfit._columns.plan import ColumnPlan
from streamfit._stream.deadletter import open_dead_letter
from streamfit._stream.skips import Skipped, SkipLedger
from streamfit._stream.events import BatchEvent, IdleEvent, MetricsEvent, StreamSummary
from streamfit._stream.metrics import ProgressiveMetrics, evaluate_batch, is_fitted, rows_from_predictions
from streamfit._stream.options import StreamOptions
from streamfit._stream.progress import Progress
from streamfit._stream.step_thread import StepThread
from streamfit.history import Progress as HistoryProgress, RunHistory

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["LoopState", "StreamLoop", "train_stream", "train_stream_sync"]

Hook = Callable[[Any], Union[None, Awaitable[None]]]

#: record batches with at least this many feature values are checked and extracted in a worker thread.
_AHEAD_VALUES = 1 << 20
#: steps of streamfit's estimators run on the event loop once this many in a row took less than this.
_INLINE_AFTER = 8
_INLINE_BELOW = 0.0003  # s


#: keyword arguments of train_stream that are not options: objects of this run (hooks, an event, a resumed plan)
_LOOP_ARGS = frozenset({"on_batch", "on_metrics", "on_idle", "idle_every", "stop_event", "layout", "quarantine",
                        "skips"})


class LoopState(enum.Enum):
    """``created`` -> ``running`` -> ``draining`` (stop requested or source exhausted) -> ``stopped``."""

    CREATED = "created"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True)
class _End:
    position: Position | None
    ended_by: str
    skipped: tuple[Skipped, ...] = ()


@dataclass(frozen=True)
class _Failure:
    error: BaseException


async def _call(hook: Hook | None, event: Any) -> None:
    if hook is not None:
        result = hook(event)
        if inspect.isawaitable(result):
            await result


def _single_error(group: BaseExceptionGroup) -> BaseException | None:
    """The one real error in a task-group error (cancellations are its consequences), else None."""
    cancelled = anyio.get_cancelled_exc_class()
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for e in exc.exceptions:
                walk(e)
        elif not isinstance(exc, cancelled):
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else None


def declared_width(estimator: Any) -> int | None:
    """Feature values per row the estimator takes, when it says so: a fitted ``n_features_in_``, else the
    fixed width of the (single) input of its ONNX ``model``; ``None`` when unknown (built from the data)."""
    n = getattr(estimator, "n_features_in_", None)
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool):
        return int(n)
    model = getattr(estimator, "model", None)
    if model is None or not type(estimator).__module__.startswith("streamfit."):
        return None
    try:
        import onnx

        if isinstance(model, (bytes, bytearray)):
            proto = onnx.load_from_string(bytes(model))
        elif isinstance(model, onnx.ModelProto):
            proto = model
        else:
            proto = onnx.load(model, load_external_data=False)
    except Exception:  # an unreadable model is reported by the estimator when it is built
        return None
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    if len(inputs) != 1 or not inputs[0].type.HasField("tensor_type"):
        return None
    dims = inputs[0].type.tensor_type.shape.dim[1:]
    if not dims or not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
        return None
    width = 1
    for d in dims:
        width *= d.dim_value
    return width


def _check_hooks(*, idle_every: Any, **hooks: Any) -> None:
    """TypeError for a hook that is not callable, ValueError for an ``idle_every`` that is no finite number > 0."""
    for name, hook in hooks.items():
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
    if isinstance(idle_every, bool) or not isinstance(idle_every, (int, float)) or not idle_every > 0 \
            or math.isinf(idle_every):
        raise ValueError(f"Invalid idle_every: {idle_every!r}, expected a finite number of seconds > 0")


class StreamLoop:
    """Train ``estimator`` on ``source`` once: what :func:`train_stream` runs, as an object to hold.

    Use the class (rather than :func:`train_stream`) to :meth:`stop` it from another task, or to read
    :meth:`metric_events` as an async iterator while it runs.  A loop runs once: calling :meth:`run`
    again raises ``RuntimeError``.

    Parameters
    ----------
    estimator, source, options, on_batch, on_metrics, on_idle, idle_every, stop_event, layout, **option_kwargs
        As for :func:`train_stream`.
    quarantine
        The daemon's poison-message state (:class:`~streamfit.daemon.Runner` passes it): messages trained in
        batches of their own or dropped as ``poison``; None: none.
    skips
        Where skipped input is counted until a trained batch passes it (the daemon passes one that also
        counts into its run's totals); None: the loop's own.

    Examples
    --------
    >>> import anyio, pyarrow as pa
    >>> from sklearn.linear_model import SGDRegressor
    >>> table = pa.table({"x": [0.0, 1.0, 2.0, 3.0] * 50, "y": [0.0, 2.0, 4.0, 6.0] * 50})
    >>> loop = StreamLoop(SGDRegressor(), table, batch_size=40, on_batch=lambda e: e.batch == 2 and loop.stop())
    >>> summary = anyio.run(loop.run)
    >>> summary.batches, summary.ended_by
    (2, 'stop')
    """

    def __init__(
        self,
        estimator: Any,
        source: Any,
        options: StreamOptions | Mapping[str, Any] | None = None,
        *,
        on_batch: Hook | None = None,
        on_metrics: Hook | None = None,
        on_idle: Hook | None = None,
        idle_every: float = 1.0,
        stop_event: anyio.Event | None = None,
        layout: ColumnLayout | None = None,
        quarantine: Quarantine | None = None,
        skips: SkipLedger | None = None,
        **option_kwargs: Any,
    ) -> None:
        opts = self.options = StreamOptions.build(options, **option_kwargs)
        opts.check_scope("loop", "history", where="the stream loop (StreamLoop, train_stream)")
        _check_hooks(on_batch=on_batch, on_metrics=on_metrics, on_idle=on_idle, idle_every=idle_every)
        self.estimator = estimator
        self.source = source
        self.task = opts.resolved_task
        self.classes = opts.classes
        self.queue_size = opts.queue_size
        self.evaluate = opts.evaluate
        self.progress = opts.progress
        self.on_batch = on_batch
        self.on_metrics = on_metrics
        self.on_idle = on_idle
        self.idle_every = float(idle_every)
        #: seconds without new rows after which the rows waiting for a full batch are trained (None: never)
        wait = opts.max_batch_wait
        self.max_batch_wait = None if wait is None or math.isinf(wait) else wait
        self.stop_event = stop_event
        self._rebatcher = Rebatcher(opts.batch_size, self._column_plan(opts, layout), on_bad=opts.on_bad,
                                    drop_last=opts.drop_last, max_rows=opts.max_rows,
                                    ring_size=opts.queue_size + IN_FLIGHT_EXTRA, quarantine=quarantine, ledger=skips)
        #: the one count of skipped input (as read by the rebatcher, as passed by trained batches)
        self.skips = self._rebatcher.ledger
        dead_letter = opts.dead_letter
        self._own_sink = isinstance(dead_letter, str)
        self.dead_letter = open_dead_letter(dead_letter) if isinstance(dead_letter, str) else dead_letter
        self._metrics = ProgressiveMetrics(self.task, opts.window)
        #: the run's metrics history (the ``history_dir`` option; :mod:`streamfit.history`), else None
        self.history = RunHistory(None, opts.history_options(), directory=opts.history_dir) \
            if opts.history_dir is not None else None
        self._init_run_state()

    def _init_run_state(self) -> None:
        """What a run fills in: its lifecycle, the reader's flags, the metric streams, the counters."""
        self._state = LoopState.CREATED
        self._stop_requested = False
        self._idle_scope: anyio.CancelScope | None = None
        # the reader awaits the source (holds no record batch half-pushed), since when rows last came in, and the
        # event it sets when it queues a batch or takes in rows (wakes a trainer that waits with duties to do)
        self._reading = False
        self._rows_at = 0.0
        self._arrived: anyio.Event | None = None
        #: :meth:`train_pending` asked for the rows waiting for a full batch now, not after ``max_batch_wait``
        self._pending_now = False
        self._metric_sends: list[MemoryObjectSendStream[MetricsEvent]] = []
        self._dropped_metric_events = 0
        self._rows = 0
        self._batches = 0
        self._position: Position | None = None
        self._ended_by = "end"
        self._fitted = False
        self._partial_fit_called = False
        self._t0 = 0.0
        self._elapsed = 0.0
        self._progress = Progress(False)
        self._trainer: StepThread | None = None
        # streamfit's own estimator classes only (a subclass defined elsewhere may run any code in a step)
        self._inline_capable = type(self.estimator).__module__.startswith("streamfit.")
        self._fast_steps = 0
        self._step_seconds = 0.0
        self._source: Any = None
        self._history_base = (0, 0)  # (batches, rows) where the history this run continues ends

    def _column_plan(self, opts: StreamOptions, layout: ColumnLayout | None) -> ColumnPlan:
        """The run's column plan: the options' features or named inputs (default: the estimator's ``inputs``),
        label, weight, classes (default: a fitted classifier's ``classes_``), a resumed run's ``layout``."""
        estimator, inputs, classes = self.estimator, opts.inputs, opts.classes
        if inputs is None:
            inputs = getattr(estimator, "inputs", None)
        elif getattr(estimator, "inputs", None) not in (None, inputs):
            raise ValueError(f"inputs={inputs!r} differs from the estimator's inputs={estimator.inputs!r}")
        self.inputs = inputs
        #: the estimator's side of named inputs (its declared inputs; the trained rows go back through it)
        self._stream_inputs: Any = None
        model_inputs = states = None
        if inputs is not None:
            from streamfit.features._estimator import stream_inputs

            # the rebatcher reads ahead with its own copy of the encoders' states; the estimator commits its
            # own batch by batch as batches are trained
            hook = getattr(estimator, "_stream_inputs", None)
            si = self._stream_inputs = hook() if callable(hook) else stream_inputs(estimator)
            model_inputs, states = si.model_inputs, si.read_ahead
        if classes is None and self.task == "classification":
            classes = getattr(estimator, "classes_", None)
        return ColumnPlan(model_inputs, inputs, features=opts.features, label=opts.label, weight=opts.weight,
                          task=self.task, dtype=opts.dtype, cast=opts.cast, states=states, layout=layout,
                          expected_width=None if inputs is not None else declared_width(estimator), classes=classes)

    # ------------------------------------------------------------------ control
    @property
    def state(self) -> LoopState:
        return self._state

    @property
    def rebatcher(self) -> Rebatcher:
        return self._rebatcher

    @property
    def skipped_rows(self) -> Counter[str]:
        """Skipped rows behind the position of the last trained batch (what a checkpoint there covers)."""
        return self.skips.rows

    @property
    def skipped_messages(self) -> Counter[str]:
        """Skipped whole messages behind that position, by reason."""
        return self.skips.messages

    @property
    def idle(self) -> bool:
        """The trainer waits for a batch: none is queued and no step runs (read on the event loop thread)."""
        return self._idle_scope is not None

    def stop(self) -> None:
        """Finish the batch being trained (if any), then return from :meth:`run`.

        Batches already queued are not trained; the summary's ``position`` is after the last trained
        batch.  Call from the event loop thread (from another thread: ``anyio.from_thread.run_sync``).
        """
        self._stop_requested = True
        if self._state is LoopState.RUNNING:
            self._state = LoopState.DRAINING
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    def train_pending(self) -> None:
        """Train the rows waiting for a full batch as soon as the trainer is free and the reader awaits the source,
        without waiting for ``max_batch_wait`` (also when it is None): a Kafka handover (the daemon's Runner, on a
        revoke) needs the rows read of the revoked partitions trained, checkpointed and committed at once, since no
        more rows of them come and the group may complete the rebalance without this member meanwhile (a commit
        then is refused, and the next owner trains those rows again).  The rows queued in full batches are
        trained first, in order.  The request holds until the partial batch is taken, or the reader awaits the
        source with no row waiting.  It is seen while the trainer waits for rows with duties to do (``on_idle``
        or ``max_batch_wait`` given, as the Runner's loops have).  Call from the event loop thread.
        """
        self._pending_now = True
        self._wake()

    def metric_events(self, max_buffer_size: float = 1000) -> MemoryObjectReceiveStream[MetricsEvent]:
        """An async iterator of :class:`MetricsEvent`, closed when the loop ends.

        Training never waits for a slow reader: when ``max_buffer_size`` events are unread, new ones are
        dropped and counted in ``StreamSummary.dropped_metric_events``.

        Parameters
        ----------
        max_buffer_size
            Unread events kept at most (``math.inf``: all).
        """
        if self._state is LoopState.STOPPED:
            raise RuntimeError("this StreamLoop is stopped: it will send no more metric events")
        send, receive = anyio.create_memory_object_stream[MetricsEvent](max_buffer_size)
        self._metric_sends.append(send)
        return receive

    # ------------------------------------------------------------------ run
    async def run(self) -> StreamSummary:
        """Train until the source is exhausted, ``max_rows`` rows are trained or :meth:`stop` is called."""
        if self._state is not LoopState.CREATED:
            raise RuntimeError(f"this StreamLoop is {self._state.value}: a loop runs once, "
                               f"create a new StreamLoop (or call train_stream again) to train more")
        self._state = LoopState.DRAINING if self._stop_requested else LoopState.RUNNING
        self._t0 = time.perf_counter()
        self._fitted = is_fitted(self.estimator)
        self._arrived = anyio.Event()
        self._rows_at = time.monotonic()
        source = None
        error: BaseException | None = None
        try:
            source = self._source = await self._open_source()
            self._start_history()
            total = getattr(source, "total_rows", None)
            if not isinstance(total, int) or isinstance(total, bool):
                total = None
            if self._rebatcher.max_rows is not None:
                total = self._rebatcher.max_rows if total is None else min(total, self._rebatcher.max_rows)
            self._progress = Progress(bool(self.progress), total)
            send, receive = anyio.create_memory_object_stream[Union[TrainingBatch, _End, _Failure]](
                self.queue_size)
            trainer = self._trainer = StepThread()
            try:
                async with anyio.create_task_group() as tg:
                    try:
                        await tg.start(trainer.serve)
                        tg.start_soon(self._produce, source, send)
                        if self.stop_event is not None:
                            tg.start_soon(self._watch, self.stop_event)
                        await self._consume(receive)
                    finally:
                        trainer.close()  # the thread ends after the step in progress, if any
                    tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                error = _single_error(group)
                if error is None:
                    raise
            finally:
                send.close()
                receive.close()
        finally:
            self._elapsed = time.perf_counter() - self._t0
            self._state = LoopState.STOPPED
            self._progress.close()
            if self.history is not None:
                self.history.close()  # the last interval, synced
            for s in self._metric_sends:
                s.close()
            self._metric_sends.clear()
            if source is not None:
                with anyio.CancelScope(shield=True):
                    await source.aclose()
            if self._own_sink and self.dead_letter is not None:
                self.dead_letter.close()  # syncs what was written
        if error is not None:
            raise error
        return self.summary()

    def _start_history(self) -> None:
        """The history this run continues (where the ``history_dir``'s ends: no gap, no interval twice), or a new
        one; the run's start and configuration noted."""
        if self.history is None:
            return
        self._history_base = self.history.log.read().end
        est = self.estimator
        config = {"estimator": type(est).__name__, "options": self.options.as_dict(),
                  "params": est.get_params(deep=False) if hasattr(est, "get_params") else {}}
        source = self.source if isinstance(self.source, str) else None
        self.history.start(self._history_progress, resumed_from=None, source=source, config=config)

    def _history_progress(self) -> HistoryProgress:
        """The counters the history records at an interval's end (from where the history this run continues
        ends)."""
        batches, rows = self._history_base
        trainer = getattr(self.estimator, "trainer_", None)
        lag = getattr(self._source, "lag", None)
        return HistoryProgress(batches + self._batches, rows + self._rows, dict(self.skips.rows), dict(self.skips.messages),
                        dict(self._metrics.stream()),
                        None if trainer is None else float(getattr(trainer, "lr_scale", 1.0)),
                        lag(self._position) if callable(lag) and self._position is not None else {})

    def summary(self) -> StreamSummary:
        """The summary so far (final once :meth:`run` returned)."""
        elapsed = self._elapsed if self._state is LoopState.STOPPED else time.perf_counter() - self._t0
        return StreamSummary(
            rows=self._rows,
            batches=self._batches,
            skipped_rows=dict(self.skipped_rows),
            skipped_messages=dict(self.skipped_messages),
            stream_metrics=dict(self._metrics.stream()),
            window_metrics=dict(self._metrics.recent()),
            rows_per_s=self._rows / elapsed if elapsed > 0 else 0.0,
            elapsed=elapsed,
            position=self._position,
            ended_by=self._ended_by,
            dropped_metric_events=self._dropped_metric_events,
        )

    async def _open_source(self) -> Any:
        if isinstance(self.source, Source):
            return self.source
        try:
            from streamfit.sources import open_source  # lazy: the sources package is optional here
        except ImportError as exc:
            raise TypeError(f"source must be a streamfit Source, got {type(self.source).__name__} "
                            f"(streamfit.sources.open_source is not available)") from exc
        source = open_source(self.source)
        if inspect.isawaitable(source):
            source = await source
        return source

    async def _watch(self, event: anyio.Event) -> None:
        await event.wait()
        self.stop()

    # ------------------------------------------------------------------ reader
    async def _produce(self, source: Any, send: MemoryObjectSendStream) -> None:
        rb = self._rebatcher
        try:
            async with send:
                try:
                    while not rb.done:
                        self._reading = True  # nothing half-pushed: the trainer may take the partial batch
                        try:
                            sb = await source.__anext__()
                        except StopAsyncIteration:
                            break
                        finally:
                            self._reading = False
                        ahead = None
                        if sb.num_rows * (rb.n_features or 1) >= _AHEAD_VALUES:
                            # a large record batch: its checks and extraction (~1 ms per million values) in a
                            # worker thread, not on the event loop, where they would delay the trainer's turn
                            ahead = await anyio.to_thread.run_sync(rb.extract_ahead, sb)
                        # The generator fills the next ring buffer only after the previous batch is queued.
                        for tb in rb.push(sb, ahead):
                            await self._send(send, tb)
                        if sb.num_rows:
                            self._rows_at = time.monotonic()
                            self._wake()  # a waiting trainer counts max_batch_wait from now
                    for tb in rb.flush():
                        await self._send(send, tb)
                    end = _End(rb.end_position, "max_rows" if rb.done else "end", rb.end_skipped)
                except Exception as exc:  # train what came before, then raise in the trainer
                    await self._send(send, _Failure(exc))
                    return
                if self._state is LoopState.RUNNING:
                    self._state = LoopState.DRAINING
                await self._send(send, end)
        finally:
            self._wake()  # the stream is closed: a waiting trainer sees its end

    async def _send(self, send: MemoryObjectSendStream, item: Any) -> None:
        await send.send(item)
        self._wake()

    def _wake(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    # ------------------------------------------------------------------ trainer
    def _stopping(self) -> bool:
        # The event is also checked here, not only by the watcher task, so that a stop requested before a
        # batch is received never lets that batch start (the watcher may not have run yet).
        if not self._stop_requested and self.stop_event is not None and self.stop_event.is_set():
            self.stop()
        return self._stop_requested

    async def _consume(self, receive: MemoryObjectReceiveStream) -> None:
        duties = self.on_idle is not None or self.max_batch_wait is not None
        while not self._stopping():
            try:  # a queued batch is taken without yielding: the next step starts at once
                item: Any = receive.receive_nowait()
            except anyio.WouldBlock:
                item = await (self._wait(receive) if duties else self._receive(receive))
                if item is None:
                    break
            except anyio.EndOfStream:
                item = _End(None, "end")
            if isinstance(item, _End):
                self._account_skips(item.skipped)
                self._ended_by = item.ended_by
                if item.position is not None:
                    self._position = item.position
                return
            if isinstance(item, _Failure):
                raise item.error
            await self._train(item)
        self._ended_by = "stop"

    async def _receive(self, receive: MemoryObjectReceiveStream) -> Any:
        """The next queued item; ``None`` when the loop is stopped meanwhile."""
        with anyio.CancelScope() as scope:
            self._idle_scope = scope
            try:
                item = await receive.receive()
            except anyio.EndOfStream:
                item = _End(None, "end")
            finally:
                self._idle_scope = None
        if scope.cancelled_caught or self._stopping():
            return None
        return item

    async def _wait(self, receive: MemoryObjectReceiveStream) -> Any:
        """The next item, as :meth:`_receive`, doing the duties of a quiet stream meanwhile: the rows waiting
        for a full batch become the next item after ``max_batch_wait`` seconds without new rows, and ``on_idle``
        is called every ``idle_every`` seconds.  This runs in the trainer's task, between steps: no step runs
        while a hook does, so the hook may snapshot the estimator."""
        start, since = time.monotonic(), time.time()
        tick = start + self.idle_every if self.on_idle is not None else math.inf
        while True:
            self._arrived = arrived = anyio.Event()  # set by the reader: a batch queued, rows taken in, the end
            try:
                return receive.receive_nowait()
            except anyio.WouldBlock:
                pass
            except anyio.EndOfStream:
                return _End(None, "end")
            now = time.monotonic()
            due = self._partial_due()
            if due <= now:
                tb = self._rebatcher.take_partial()  # the reader awaits the source: nothing is half-pushed
                self._pending_now = False
                if tb is not None:
                    return tb
                due = math.inf
            elif self._reading and not self._rebatcher.pending_rows:
                self._pending_now = False  # every row read is queued or trained: nothing left to ask for
            if tick <= now:
                await _call(self.on_idle, IdleEvent(self._batches, self._rows, self._position, since, now - start,
                                                    self._rebatcher.pending_rows))
                if self._stopping():
                    return None
                tick = time.monotonic() + self.idle_every
                continue
            with anyio.CancelScope(deadline=anyio.current_time() + (min(due, tick) - now)) as scope:
                self._idle_scope = scope
                try:
                    await arrived.wait()
                finally:
                    self._idle_scope = None
            if self._stopping():
                return None

    def _partial_due(self) -> float:
        """When (``time.monotonic()``) the rows waiting for a full batch are to be trained: ``max_batch_wait``
        after rows last came in (at once after :meth:`train_pending`), while the reader awaits the source; ``inf``:
        not now."""
        if not self._reading or not self._rebatcher.pending_rows:
            return math.inf
        if self._pending_now:
            return -math.inf
        if self.max_batch_wait is None:
            return math.inf
        return self._rows_at + self.max_batch_wait

    def _step(self, tb: TrainingBatch, first: bool) -> tuple[dict[str, np.ndarray] | None, float | None]:
        """Worker thread: progressive prediction, then one ``partial_fit``."""
        est = self.estimator
        rows = None
        kwargs: dict[str, Any] = {}
        if tb.sample_weight is not None:
            kwargs["sample_weight"] = tb.sample_weight
        classes = self.classes if self.classes is not None else self._rebatcher.classes
        if first and classes is not None:
            kwargs["classes"] = classes
        if self.evaluate and hasattr(est, "partial_fit_predict"):
            # streamfit estimators return the outputs their training step computed before the update:
            # progressive validation without a second forward pass
            out = np.asarray(est.partial_fit_predict(tb.X, tb.y, **kwargs))
            if self._fitted:
                if self.task == "regression":
                    rows = rows_from_predictions(est, out, None, tb.y, task=self.task)
                else:
                    cls = np.asarray(getattr(est, "classes_", classes))
                    rows = rows_from_predictions(est, cls[out.argmax(axis=1)], out, tb.y, task=self.task,
                                                 classes=classes)
        else:
            if self.evaluate and self._fitted:
                rows = evaluate_batch(est, tb.X, tb.y, task=self.task, classes=classes)
            est.partial_fit(tb.X, tb.y, **kwargs)
        self._fitted = True
        loss = getattr(est, "loss_", None)
        if isinstance(loss, (int, float, np.floating)) and not isinstance(loss, bool):
            return rows, float(loss)
        return rows, None

    async def _train(self, tb: TrainingBatch) -> None:
        first = not self._partial_fit_called
        if self._inline_ok(tb):
            await anyio.lowlevel.checkpoint()  # the reader's turn (the step below blocks the event loop)
            rows, own_loss = self._timed_step(tb, first)
        else:
            await anyio.lowlevel.checkpoint_if_cancelled()  # the hand-over does not yield: cancellation is seen here
            assert self._trainer is not None
            rows, own_loss = await self._trainer.run(self._timed_step, tb, first)
        self._note_step(self._step_seconds, tb)
        if self._stream_inputs is not None:  # the estimator's encoders now hold exactly the trained rows
            self._stream_inputs.trained(tb.rows_end, self._rebatcher.plan)
        self._account_skips(tb.skipped)
        self._partial_fit_called = True
        self._rows += tb.n_rows
        self._batches += 1
        self._position = tb.position
        elapsed = time.perf_counter() - self._t0
        progressive_loss = None
        if rows is not None:
            batch_metrics = self._metrics.update(rows)
            progressive_loss = batch_metrics["loss"]
            if self.on_metrics is not None or self._metric_sends:  # nobody listens: no event to build
                event = MetricsEvent(self._batches, self._rows, tb.position, batch_metrics,
                                     self._metrics.stream(), self._metrics.recent(), dict(self.skipped_rows),
                                     dict(self.skipped_messages))
                self._publish(event)
                await _call(self.on_metrics, event)
        if self.history is not None:  # after the batch's metrics: they count in the interval it ends
            self.history.batch(self._history_base[1] + self._rows)
        if self._progress.enabled:
            self._progress.update(tb.n_rows, self._metrics.recent()["loss"] if rows is not None else own_loss)
        loss = own_loss if own_loss is not None else progressive_loss
        await _call(self.on_batch, BatchEvent(self._batches, self._rows, tb.n_rows, tb.position, loss,
                                              progressive_loss, elapsed, tb.skipped, tb.spans))

    def _account_skips(self, skipped: tuple[Skipped, ...]) -> None:
        """Skipped input now behind the trained position: count it as passed, hand it to the dead-letter sink."""
        if skipped:
            self.skips.passed(skipped)
            if self.dead_letter is not None:
                self.dead_letter.write(skipped)

    def _timed_step(self, tb: TrainingBatch, first: bool) -> tuple[dict[str, np.ndarray] | None, float | None]:
        t0 = time.perf_counter()
        try:
            return self._step(tb, first)
        finally:
            self._step_seconds = time.perf_counter() - t0

    def _inline_ok(self, tb: TrainingBatch) -> bool:
        """Run this step on the event loop thread?  Only steps of streamfit's own estimators (no user code
        that could need ``anyio.from_thread``) on full batches, after ``_INLINE_AFTER`` full-batch steps in a
        row took less than ``_INLINE_BELOW`` s each: handing such a step to a thread and back costs more than
        the step (about 0.1-0.5 ms on a busy 2-core machine)."""
        return self._fast_steps >= _INLINE_AFTER and tb.n_rows == self._rebatcher.batch_size

    def _note_step(self, seconds: float, tb: TrainingBatch) -> None:
        if (self._inline_capable and tb.n_rows == self._rebatcher.batch_size and seconds < _INLINE_BELOW
                and self._partial_fit_called):
            self._fast_steps += 1
        elif tb.n_rows == self._rebatcher.batch_size:
            self._fast_steps = 0  # a slow step: back to the trainer thread until steps are fast again

    def _publish(self, event: MetricsEvent) -> None:
        for send in list(self._metric_sends):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                self._dropped_metric_events += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._metric_sends.remove(send)


async def train_stream(
    estimator: Any,
    source: Any,
    options: StreamOptions | Mapping[str, Any] | None = None,
    *,
    on_batch: Hook | None = None,
    on_metrics: Hook | None = None,
    on_idle: Hook | None = None,
    idle_every: float = 1.0,
    stop_event: anyio.Event | None = None,
    layout: ColumnLayout | None = None,
    **option_kwargs: Any,
) -> StreamSummary:
    """Train ``estimator`` with ``partial_fit`` on a stream, evaluating each batch before training on it.

    Reading, rebatching and training overlap; a bounded queue keeps memory bounded.  Works under
    asyncio and trio (anyio).

    Parameters
    ----------
    estimator
        Anything with ``partial_fit(X, y[, sample_weight=..., classes=...])`` and ``predict``
        (``predict_proba`` is used for the log loss when present).  It must not keep ``X``/``y`` after
        ``partial_fit`` returns (the buffers are reused).
    source
        A :class:`streamfit.sources.Source`, or anything :func:`streamfit.sources.open_source` accepts (a path,
        a URI, in-memory Arrow data).  It is closed when training ends.  Sources may expose ``total_rows`` for
        the progress bar.
    options
        A :class:`~streamfit.StreamOptions` (or a mapping of its fields); keyword arguments build it or
        override its fields (see ``**option_kwargs``).
    on_batch
        ``hook(BatchEvent)`` after every trained batch (sync or async): the checkpoint point.
    on_metrics
        ``hook(MetricsEvent)`` after every evaluated batch (sync or async).
    on_idle
        ``hook(IdleEvent)`` every ``idle_every`` seconds while the trainer waits for rows (sync or async): no
        step runs until it returns, a safe point to checkpoint a quiet stream.
    idle_every
        Seconds between two ``on_idle`` calls while no row arrives (finite, > 0).
    stop_event
        An :class:`anyio.Event`; setting it stops the loop after the current batch.
    layout
        The :class:`~streamfit._columns.layout.ColumnLayout` of a resumed run (``loop.rebatcher.layout`` of the
        run that saved it): features, widths, label, weight and dtype are fixed to it.
    **option_kwargs
        Fields of :class:`~streamfit.StreamOptions` (``label="y", batch_size=1024, on_bad="skip"``, described
        there).  An unknown or misspelt name raises :class:`~streamfit.OptionError` at once.  The main ones:
        ``features`` (default: every column but label and weight of the first valid batch), ``label``,
        ``weight``, ``batch_size`` (rows per ``partial_fit`` call; the estimator's own ``batch_size`` says
        the rows per step), ``max_rows``, ``on_bad``, ``classes``, ``inputs`` (default: the estimator's),
        ``queue_size``, ``max_batch_wait``, ``evaluate``, ``progress``, ``dead_letter``.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa, pyarrow.compute
    >>> from sklearn.linear_model import SGDRegressor
    >>> from streamfit.sources.memory import MemorySource
    >>> x = pa.array(np.tile(np.linspace(-1, 1, 8), 125), pa.float32())
    >>> table = pa.table({"x": x, "y": pa.compute.multiply(x, 2.0)})
    >>> summary = train_stream_sync(SGDRegressor(random_state=0), MemorySource(table), batch_size=100,
    ...                             window=200)
    >>> summary.rows, summary.batches, summary.position, summary.ended_by
    (1000, 10, {'batch': 0, 'row': 1000}, 'end')
    >>> summary.stream_metrics["rows"]  # the first batch meets an untrained model: not evaluated
    900
    >>> summary.window_metrics["rmse"] < summary.stream_metrics["rmse"]  # it learns
    True
    """
    loop = StreamLoop(estimator, source, options, on_batch=on_batch, on_metrics=on_metrics, on_idle=on_idle,
                      idle_every=idle_every, stop_event=stop_event, layout=layout, **option_kwargs)
    return await loop.run()


def train_stream_sync(
    estimator: Any,
    source: Any,
    *,
    backend: str = "asyncio",
    backend_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> StreamSummary:
    """:func:`train_stream` from synchronous code: ``anyio.run`` on ``backend`` (``"asyncio"`` or ``"trio"``).

    The options are checked before the event loop starts (a misspelt name fails here, not inside it).

    Parameters
    ----------
    estimator, source
        As for :func:`train_stream`.
    backend
        The event loop to run on: ``"asyncio"`` (default) or ``"trio"``.
    backend_options
        Keyword arguments of that backend's ``run`` (anyio's ``backend_options``), e.g. ``{"use_uvloop": True}``.
    **kwargs
        The other arguments of :func:`train_stream` (``options``, the hooks, ``stop_event``, ``layout``) and
        the fields of :class:`~streamfit.StreamOptions`.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from sklearn.linear_model import SGDRegressor
    >>> table = pa.table({"x": [0.0, 1.0, 2.0, 3.0] * 50, "y": [0.0, 2.0, 4.0, 6.0] * 50})
    >>> summary = train_stream_sync(SGDRegressor(), table, batch_size=50, backend="trio")
    >>> summary.rows, summary.batches, summary.ended_by
    (200, 4, 'end')
    """
    options = StreamOptions.build(kwargs.pop("options", None),
                                  **{k: kwargs.pop(k) for k in list(kwargs) if k not in _LOOP_ARGS})
    return anyio.run(partial(train_stream, estimator, source, options, **kwargs), backend=backend,
                     backend_options=backend_options)
