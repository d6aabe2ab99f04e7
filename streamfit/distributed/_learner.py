"""A learner: streamfit's own stream loop on one share, paused at every synchronization barrier.

Runs as a Ray actor (an asyncio actor: its methods and the loop share one event loop).  The loop calls
``on_batch`` after each trained batch; when a round is over (``sync_every_batches`` batches, or
``sync_every_seconds`` seconds, since the last synchronization) the hook waits there until the coordinator
has mixed the learners' states and sent the result back.  So every report is taken at a batch boundary,
with the exact source position after that batch, and nothing trains while the learner waits.

With a divergence guard, a batch that diverges makes the learner roll back to its state at the last round
and train again from there (:mod:`streamfit.distributed._guard`): the bad input's cost stays on this learner.
Skipped input goes to this learner's dead-letter sink, synced at every global checkpoint.

With a row budget (``max_rows`` of the run), the coordinator gives each learner a quota: the rows it may have
trained in all (resumes included).  Its loop stops exactly there (the last batch cut short) and the learner
reports ``capped``; a quota raised later (another learner's share ended before its quota) starts a new loop
from where it stopped.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from typing import Any, Mapping

import numpy as np

from streamfit._stream import StreamLoop
from streamfit._stream.deadletter import DeadLetterSink, open_dead_letter
from streamfit._stream.events import BatchEvent
from streamfit._stream.skips import SkipLedger
from streamfit.daemon.guard import DivergenceGuard
from streamfit.daemon.state import flatten_state, restore_estimator
from streamfit.distributed._averaging import synced_names
from streamfit.distributed._guard import LearnerGuard, RollbackPoint
from streamfit.distributed._messages import LearnerState, RoundReport, StartFrom
from streamfit.distributed._shares import Share
from streamfit.exceptions import SourceError
from streamfit.sources import Position, Source, SourceBatch

__all__ = ["Learner"]


#: how often an idle learner checks whether its round is over (sync_every_seconds, or a stop request).
_IDLE_POLL = 0.01  # s


class _Gate(Source):
    """Hands the loop its source's batches; a closed gate holds them (the learner waits at an idle barrier).

    The loop closes its source on exit; the learner still commits offsets after that, then closes it.
    """

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.waiting = False  # the reader is blocked in the source: it holds no batch
        self.open = asyncio.Event()
        self.open.set()

    async def __anext__(self) -> SourceBatch:
        self.waiting = True
        try:
            sb = await self.inner.__anext__()
        except StopAsyncIteration:
            self.waiting = False
            await self.open.wait()  # the end flushes a last partial batch: not during a barrier
            raise
        finally:
            self.waiting = False
        await self.open.wait()
        return sb

    async def aclose(self) -> None:
        self._closed = True


class Learner:
    """One share of the stream, trained locally between synchronizations (see the module docstring)."""

    def __init__(self, share: Share, estimator: Any, loop_options: Mapping[str, Any],
                 sync_every_batches: int | None, sync_every_seconds: float | None, sync_optimizer: bool,
                 finite: bool, guard: DivergenceGuard | None = None, dead_letter: str | None = None,
                 hold_dead_letters: bool = False, idle_round_seconds: float | None = None) -> None:
        #: with rounds of batches: a learner without input this long ends its round at its last trained batch
        self.idle_round_seconds = idle_round_seconds
        self.guard_options = guard
        self.dead_letter_path = dead_letter
        self.hold_dead_letters = hold_dead_letters
        self.share = share
        self.template = estimator
        self.loop_options = dict(loop_options)
        self.every_batches = sync_every_batches
        self.every_seconds = sync_every_seconds
        self.sync_optimizer = sync_optimizer
        self.finite = finite
        self.estimator: Any = None
        self._task: asyncio.Task[Any] | None = None
        self._source: Source | None = None
        self._loop: StreamLoop | None = None
        self._ready = asyncio.Event()  # at a barrier, or the share ended
        self._go = asyncio.Event()     # the coordinator's answer arrived
        self._epoch = 0
        self._error: BaseException | None = None
        self._ended = False   # the loop is not running: the share ended, or (``_capped``) the quota is reached
        self._capped = False
        self._quota: int | None = None  # rows this learner may have trained in all (None: no budget)
        self._snapshot: tuple[Any, dict[str, np.ndarray]] | None = None
        self._gate: _Gate | None = None
        self._watcher: asyncio.Task[Any] | None = None
        self._asked = False      # the coordinator wants the round to end now (stop)
        self._at_barrier = False
        self._guard: LearnerGuard | None = None
        self._skips = SkipLedger()  # this learner's skipped input (as passed), over its loops
        self._sink: DeadLetterSink | None = None
        self._sink_state: dict[str, Any] | None = None

    def pid(self) -> int:
        """The worker process id (what a test kills)."""
        return os.getpid()

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, start: StartFrom, quota: int | None = None) -> None:
        """(Re)start from ``start`` with a row ``quota`` (None: none): a running loop is abandoned (its progress
        discarded), its source closed."""
        await self._abandon()
        self._epoch += 1
        self._ready, self._go = asyncio.Event(), asyncio.Event()
        self._error, self._ended, self._capped, self._snapshot = None, False, False, None
        self._quota = quota
        self.estimator = copy.deepcopy(self.template)
        if start.state is not None:
            restore_estimator(self.estimator, {"class": start.state.cls, "state": start.state.tree},
                              start.state.arrays)
        self._open_sink(start.dead_letter)
        self._guard = None
        if self.guard_options is not None:
            self._guard = LearnerGuard(copy.deepcopy(self.guard_options), self.loop_options.get("on_bad", "raise"),
                                       self.share.index)
            self._guard.load(start.poison, start.rollbacks)
        self._rows, self._batches, self._position = start.rows, start.batches, start.position
        self._point = RollbackPoint(None if start.state is None else start.state.tree,
                                    {} if start.state is None else dict(start.state.arrays), start.position,
                                    start.rows, start.batches, start.evaluated_rows, start.loss_sum,
                                    dict(start.skipped_rows), dict(start.skipped_messages),
                                    dead_letter=self._sink.mark() if self._sink is not None else 0)
        self._round_rows = self._round_batches = 0
        self._round_t0 = time.monotonic()
        self._round_train = 0.0
        self._asked = self._at_barrier = False
        self._launch()

    def _launch(self) -> None:
        """A new loop from the rollback point, its task and its idle watcher."""
        self._new_loop()
        self._task = asyncio.ensure_future(self._run(self._epoch))
        self._watcher = asyncio.ensure_future(self._watch_idle(self._epoch))

    def _open_sink(self, state: Mapping[str, Any] | None) -> None:
        """This learner's dead-letter sink, at the state of the checkpoint it starts from (exactly once: a file
        is cut back to what that checkpoint covers)."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        if self.dead_letter_path is None:
            return
        self._sink = open_dead_letter(self.dead_letter_path)
        self._sink.hold = self.hold_dead_letters
        self._sink.restore(state)
        self._sink_state = dict(state) if state else None

    def _new_loop(self) -> None:
        """A stream loop from the rollback point (the start, or the last round's barrier after a rollback)."""
        point = self._point
        self._base = point
        self._skips.restore(point.skipped_rows, point.skipped_messages)
        self._source = self.share.open(point.position, self.finite)
        self._gate = _Gate(self._source)
        guard = self._guard
        budget = None if self._quota is None else max(self._quota - point.rows, 0)
        self._loop = StreamLoop(self.estimator, self._gate, on_batch=self._on_batch,
                                quarantine=None if guard is None else guard.quarantine,
                                skips=SkipLedger(parent=self._skips), dead_letter=self._sink, max_rows=budget,
                                **self.loop_options)
        if guard is not None:
            guard.loop_started(getattr(self.estimator, "trainer_", None))

    async def _roll_back(self) -> None:
        """The batch just trained diverged: back to the rollback point, train the share again from there."""
        guard, point = self._guard, self._point
        assert guard is not None
        trainer = getattr(self.estimator, "trainer_", None)
        decision = guard.roll_back(1.0 if trainer is None else float(trainer.lr_scale), point)
        if point.tree is None:
            self.estimator = copy.deepcopy(self.template)
        else:
            restore_estimator(self.estimator, {"class": type(self.estimator).__name__, "state": point.tree},
                              point.arrays)
        trainer = getattr(self.estimator, "trainer_", None)
        if trainer is not None:
            trainer.lr_scale = decision.scale
            trainer.n_skipped = 0
        if self._sink is not None:
            self._sink.rewind(point.dead_letter)  # the replayed skips are written again
        self._rows, self._batches, self._position = point.rows, point.batches, point.position
        self._round_rows, self._round_batches = point.round_rows, point.round_batches
        source, self._source = self._source, None
        if source is not None:
            await source.aclose()
        self._new_loop()

    def _take_point(self, round_rows: int = 0, round_batches: int = 0) -> None:
        """The state now is the rollback point (a barrier, or the first trained batch of a fresh learner)."""
        tree, arrays = flatten_state(self.estimator.state_dict()) if hasattr(self.estimator, "trainer_") else (None, {})
        assert self._loop is not None
        stream = self._loop.summary()
        evaluated, loss_sum = self._evaluated(stream)
        self._point = RollbackPoint(tree, arrays, self._position, self._rows, self._batches, evaluated, loss_sum,
                                    dict(self._skips.rows), dict(self._skips.messages), round_rows, round_batches,
                                    self._sink.mark() if self._sink is not None else 0)

    def _evaluated(self, stream: Any) -> tuple[int, float]:
        """Progressive-loss rows and loss sum, over restarts and rollbacks."""
        evaluated = int(stream.stream_metrics.get("rows", 0) or 0)
        loss = stream.stream_metrics.get("loss")
        loss_sum = float(loss) * evaluated if loss is not None and evaluated else 0.0
        return self._base.evaluated_rows + evaluated, self._base.loss_sum + loss_sum

    async def _run(self, epoch: int) -> None:
        try:
            while True:
                loop = self._loop
                assert loop is not None
                summary = await loop.run()
                if epoch != self._epoch:
                    return
                if self._guard is not None and self._guard.reason is not None:
                    await self._roll_back()
                    continue
                if summary.position is not None:
                    self._position = summary.position  # may move past trailing skipped input
                self._capped = summary.ended_by == "max_rows"
                break
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the coordinator by the next report
            if epoch == self._epoch:
                self._error = exc
        finally:
            if epoch == self._epoch:
                self._ended = True
                self._round_train += time.monotonic() - self._round_t0
                self._ready.set()

    async def _watch_idle(self, epoch: int) -> None:
        """An idle learner (no input) ends its round at the last trained batch when the round's time is up or
        the coordinator asks: the reader holds no batch, nothing is queued or training, and the gate keeps it so."""
        idle_since: float | None = None
        while epoch == self._epoch and not self._ended:
            await asyncio.sleep(_IDLE_POLL)
            loop, gate = self._loop, self._gate
            if loop is None or gate is None or self._at_barrier or not (gate.waiting and loop.idle):
                idle_since = None
                continue
            now = time.monotonic()
            idle_since = now if idle_since is None else idle_since
            quiet = self.idle_round_seconds is not None and now - idle_since >= self.idle_round_seconds
            if self._asked or quiet or (self.every_seconds is not None and now - self._round_t0 >= self.every_seconds):
                idle_since = None
                gate.open.clear()
                self._at_barrier = True
                self._round_train += time.monotonic() - self._round_t0
                self._ready.set()

    def request_barrier(self) -> None:
        """End this round at the next batch boundary, or now if idle (the coordinator is stopping)."""
        self._asked = True

    async def _abandon(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        source, self._source = self._source, None
        if source is not None:
            await source.aclose()

    async def close(self) -> None:
        """Stop training and close the source (after the final commit) and the dead-letter sink."""
        await self._abandon()
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    # -- the barrier ----------------------------------------------------------------------------------------
    async def _on_batch(self, event: BatchEvent) -> None:
        guard = self._guard
        if guard is not None and guard.check(event, getattr(self.estimator, "trainer_", None)):
            assert self._loop is not None
            self._loop.stop()  # rolled back by _run: nothing of this batch counts
            return
        self._rows = self._base.rows + event.rows
        self._batches = self._base.batches + event.batch
        self._position = event.position
        self._round_rows += event.n_rows
        self._round_batches += 1
        if guard is not None and self._point.tree is None:  # a fresh learner: its first batch is the first point
            self._take_point(self._round_rows, self._round_batches)
        due = self._asked or (self.every_batches is not None and self._round_batches >= self.every_batches) or (
            self.every_seconds is not None and time.monotonic() - self._round_t0 >= self.every_seconds)
        if due:
            self._round_train += time.monotonic() - self._round_t0
            go = self._go
            self._at_barrier = True
            self._ready.set()
            await go.wait()  # the coordinator's apply() sets it; nothing trains meanwhile

    async def next_round(self, round_: int, want_state: bool) -> RoundReport | None:
        """Wait for this learner's barrier (or the end of its share); report its state there."""
        epoch = self._epoch
        await self._ready.wait()
        if epoch != self._epoch:
            return None  # restarted meanwhile: the coordinator no longer waits for this report
        if self._error is not None:
            raise self._error
        assert self._loop is not None
        fitted = hasattr(self.estimator, "trainer_")
        synced = state = None
        if fitted:
            tree, arrays = flatten_state(self.estimator.state_dict())
            self._snapshot = (tree, arrays)
            if self._round_rows:
                synced = {k: arrays[k] for k in synced_names(arrays, self.sync_optimizer)}
            if want_state:
                state = LearnerState(type(self.estimator).__name__, tree, arrays)
        evaluated, loss_sum = self._evaluated(self._loop.summary())
        guard = self._guard
        if want_state and self._sink is not None:  # durable before the checkpoint that moves past them
            self._sink_state = self._sink.sync()
        trainer = getattr(self.estimator, "trainer_", None)
        return RoundReport(self.share.index, round_, self._rows, self._batches, self._round_rows, self._position,
                           synced, state, self._ended and not self._capped, evaluated, loss_sum,
                           dict(self._skips.rows),
                           self._round_train, dict(self._skips.messages),
                           0 if guard is None else guard.rollbacks,
                           None if guard is None or not want_state else guard.state(),
                           [] if guard is None else guard.poison.message_rows(),
                           1.0 if trainer is None else float(trainer.lr_scale),
                           self._sink_state if want_state else None, self._capped)

    async def apply(self, round_: int, mixed: Mapping[str, np.ndarray] | None,
                    commit: Position | None, quota: int | None = None) -> str | None:
        """Load the mixed state, commit offsets covered by a durable checkpoint, then train the next round (up to
        ``quota`` rows in all: a learner that reached its old quota trains on when it is raised); the source's
        refusal of the commit, if it refused it (:meth:`commit`)."""
        if mixed is not None and self._snapshot is not None:
            tree, arrays = self._snapshot
            restore_estimator(self.estimator, {"class": type(self.estimator).__name__, "state": tree},
                              {**arrays, **mixed})
        self._snapshot = None
        if self._guard is not None and not self._ended:
            self._take_point()  # the mixed state at this barrier: where a divergence in the next round goes back
        refused = None if commit is None else await self.commit(commit)
        self._round_rows = self._round_batches = 0
        self._round_train = 0.0
        self._round_t0 = time.monotonic()
        self._asked = False
        self._quota = quota
        if self._capped and (quota is None or quota > self._rows):
            await self._go_on()
        elif not self._ended:
            go = self._go
            self._ready, self._go = asyncio.Event(), asyncio.Event()
            self._at_barrier = False
            go.set()
            if self._gate is not None:
                self._gate.open.set()
        return refused

    async def _go_on(self) -> None:
        """The quota was raised after this learner reached it: a new loop from here (the state, position and
        counters now are its base and rollback point)."""
        self._take_point()
        source, self._source = self._source, None
        if source is not None:
            await source.aclose()
        self._ready, self._go = asyncio.Event(), asyncio.Event()
        self._ended = self._capped = self._at_barrier = False
        self._launch()

    async def commit(self, position: Position) -> str | None:
        """Tell the source that ``position`` is durably checkpointed (Kafka commits the offsets); the source's
        refusal of that commit (:class:`~streamfit.exceptions.SourceError`: a broker refusing it, a rebalance of
        the group ahead of it), if it refused it.

        A refusal is returned, not raised: the learner goes on, and its next commit (of the next durable global
        checkpoint) carries these offsets too: a position names every partition this learner trained.
        """
        if self._source is None:
            return None
        try:
            await self._source.commit(position)
        except SourceError as exc:  # a normal event for a Kafka group: not a reason to end the run
            return str(exc)
        return None
