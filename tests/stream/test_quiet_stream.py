"""A live stream that goes quiet: the partial batch is trained after ``max_batch_wait``, ``on_idle`` is called
while the trainer waits, and never while a step runs."""

from __future__ import annotations

import threading
import time

import anyio
import numpy as np
import pytest
from sklearn.linear_model import SGDRegressor

from streamfit._stream import IdleEvent, StreamLoop
from streamfit.sources._base import Source, SourceBatch

from tests.stream.helpers import fit_reference, make_batches, reference_chunks

FEATURES = ["x0", "x1", "x2"]


class LiveSource(Source):
    """Record batches as a test sends them; waits (a quiet live stream) while none is sent."""

    def __init__(self) -> None:
        self.send, self._receive = anyio.create_memory_object_stream(100)
        self._i = 0

    async def __anext__(self) -> SourceBatch:
        batch = await self._receive.receive()
        index, self._i = self._i, self._i + 1
        return SourceBatch(batch, lambda r, i=index: {"batch": i, "row": r}, where=f"batch {index}")


async def _until(predicate, what: str, timeout: float = 30.0) -> None:
    """Paced by progress: poll ``predicate`` (a generous deadline for a loaded machine)."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_a_partial_batch_is_trained_after_max_batch_wait_while_the_source_stays_open():
    batches = make_batches([100, 30, 50])
    source, est, events = LiveSource(), SGDRegressor(random_state=0), []
    loop = StreamLoop(est, source, batch_size=64, max_batch_wait=0.2, on_batch=events.append)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        await source.send.send(batches[0])
        await _until(lambda: loop.summary().rows == 100, "the partial batch of the first 100 rows")
        await source.send.send(batches[1])
        await source.send.send(batches[2])
        await _until(lambda: loop.summary().rows == 180, "the next 80 rows")
        loop.stop()
    # the first 100 rows: a full batch and the partial one; then 30 + 34 rows fill a batch, 16 wait and are trained
    assert [e.n_rows for e in events] == [64, 36, 64, 16]
    assert [e.position for e in events] == [{"batch": 0, "row": 64}, {"batch": 0, "row": 100},
                                            {"batch": 2, "row": 34}, {"batch": 2, "row": 50}]
    rows = reference_chunks(batches, FEATURES, 1000)[0]
    chunks = [tuple(None if a is None else a[i:j] for a in rows) for i, j in ((0, 64), (64, 100), (100, 164),
                                                                              (164, 180))]
    ref = fit_reference(SGDRegressor(random_state=0), chunks)
    np.testing.assert_array_equal(est.coef_, ref.coef_)
    np.testing.assert_array_equal(est.intercept_, ref.intercept_)


@pytest.mark.anyio
async def test_without_max_batch_wait_the_partial_batch_waits_for_the_end_and_on_idle_says_so():
    source, idle = LiveSource(), []
    loop = StreamLoop(SGDRegressor(random_state=0), source, batch_size=64, on_idle=idle.append, idle_every=0.02)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        await source.send.send(make_batches([100])[0])
        await _until(lambda: len(idle) >= 5 and idle[-1].rows == 64, "idle events after the full batch")
        loop.stop()
    assert loop.summary().rows == 64  # the end-of-stream rule: the 36 rows wait for more or for the end
    last: IdleEvent = idle[-1]
    assert (last.batch, last.rows, last.position, last.pending_rows) == (1, 64, {"batch": 0, "row": 64}, 36)
    assert last.idle_seconds >= 0.02 and last.since <= time.time()
    assert len({e.since for e in idle if e.rows == 64}) == 1  # one quiet spell since the batch


@pytest.mark.anyio
async def test_train_pending_trains_the_partial_batch_at_once_without_max_batch_wait():
    """A Kafka handover asks for the rows short of a full batch now (no more come of a revoked partition)."""
    source, events = LiveSource(), []
    loop = StreamLoop(SGDRegressor(random_state=0), source, batch_size=64, on_idle=lambda e: None, idle_every=0.05,
                      on_batch=events.append)
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        await source.send.send(make_batches([100])[0])
        await _until(lambda: loop.summary().rows == 64, "the full batch")
        loop.train_pending()
        await _until(lambda: loop.summary().rows == 100, "the 36 rows asked for")
        await source.send.send(make_batches([100], seed=1)[0])  # the request was spent: 36 rows wait again
        await _until(lambda: loop.summary().rows == 164, "the next full batch")
        await anyio.sleep(0.2)
        loop.stop()
    assert [(e.n_rows, e.position) for e in events] == [(64, {"batch": 0, "row": 64}), (36, {"batch": 0, "row": 100}),
                                                        (64, {"batch": 1, "row": 64})]
    assert loop.rebatcher.pending_rows == 36


class SlowSGD(SGDRegressor):
    """Each step takes a while and says when it runs (in the trainer's worker thread)."""

    def partial_fit(self, X, y, **kw):
        self.running.set()
        try:
            time.sleep(0.03)
            return super().partial_fit(X, y, **kw)
        finally:
            self.running.clear()


@pytest.mark.anyio
async def test_on_idle_never_runs_while_a_step_does_and_holds_the_next_step_back():
    est = SlowSGD(random_state=0)
    est.running = threading.Event()
    source, seen, steps = LiveSource(), [], []
    held = anyio.Event()

    async def on_idle(event: IdleEvent) -> None:
        seen.append(est.running.is_set())
        if len(seen) == 3:  # a batch arrives while the hook runs: its step waits for the hook
            await source.send.send(make_batches([8], seed=9)[0])
            await anyio.sleep(0.2)
            seen.append(est.running.is_set())
            held.set()

    loop = StreamLoop(est, source, batch_size=8, on_idle=on_idle, idle_every=0.01,
                      on_batch=lambda e: steps.append((e.rows, held.is_set())))
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        for seed in range(4):
            await source.send.send(make_batches([8], seed=seed)[0])
            await anyio.sleep(0.02)
        await _until(lambda: held.is_set() and len(steps) == 5, "the step held back by the hook")
        loop.stop()
    assert not any(seen), "on_idle ran while a step did"
    assert steps[-1] == (40, True)  # trained after the hook returned
