"""The loop: same model as plain partial_fit, backpressure, positions, stop, errors, lifecycle, backends."""

from __future__ import annotations

import time

import anyio
import anyio.from_thread
import numpy as np
import pytest
from sklearn.linear_model import SGDClassifier, SGDRegressor

from streamfit._stream import (IN_FLIGHT_EXTRA, LoopState, StreamLoop, StreamSummary, train_stream,
                               train_stream_sync)
from streamfit.exceptions import SourceError

from tests.stream.helpers import (BLOCK, FAIL, ListSource, expected_position, fit_reference, make_batches,
                                  reference_chunks, to_vector)

SIZES = [5, 61, 300, 1, 1, 200, 44, 513, 3]
FEATURES = ["x0", "x1", "x2", "x3"]


def assert_same_model(a, b):
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)


@pytest.mark.anyio
@pytest.mark.parametrize("batch_size", [7, 64, 10_000])
async def test_same_coefficients_as_partial_fit_on_the_same_batches(batch_size):
    batches = make_batches(SIZES, d=4, weight=True)
    est = SGDRegressor(random_state=0)
    events = []
    summary = await train_stream(est, ListSource(batches), weight="w", batch_size=batch_size,
                                 on_batch=events.append)
    chunks = reference_chunks(batches, FEATURES, batch_size, weight="w")
    assert_same_model(est, fit_reference(SGDRegressor(random_state=0), chunks))
    assert summary.rows == sum(SIZES) and summary.batches == len(chunks)
    assert [e.n_rows for e in events] == [len(c[1]) for c in chunks]  # the last partial batch included
    assert summary.position == {"batch": len(SIZES) - 1, "row": SIZES[-1]} and summary.ended_by == "end"


@pytest.mark.anyio
@pytest.mark.parametrize("tensor", [False, True])
async def test_same_coefficients_with_a_vector_feature_column(tensor):
    batches = [to_vector(b, 4, tensor=tensor) for b in make_batches([64, 37, 128, 11], d=4)]
    est = SGDRegressor(random_state=0)
    await train_stream(est, ListSource(batches), features=["emb"], batch_size=32)
    assert_same_model(est, fit_reference(SGDRegressor(random_state=0),
                                         reference_chunks(batches, ["emb"], 32)))


@pytest.mark.anyio
async def test_same_coefficients_classifier_with_classes_on_first_call():
    batches = make_batches([30, 17, 50], d=3, classes=3)
    est = SGDClassifier(loss="log_loss", random_state=0)
    await train_stream(est, ListSource(batches), classes=[0, 1, 2], batch_size=16, dtype=np.float64)
    ref = fit_reference(SGDClassifier(loss="log_loss", random_state=0),
                        reference_chunks(batches, ["x0", "x1", "x2"], 16, dtype=np.float64,
                                         label_dtype=np.int64), classes=[0, 1, 2])
    assert_same_model(est, ref)


@pytest.mark.anyio
async def test_on_batch_positions_are_right_after_each_batch_last_row():
    batches = make_batches(SIZES, d=2)
    events = []

    async def on_batch(event):  # async hooks are awaited
        await anyio.lowlevel.checkpoint()
        events.append(event)

    await train_stream(SGDRegressor(), ListSource(batches), batch_size=100, on_batch=on_batch)
    ends = list(range(100, sum(SIZES), 100)) + [sum(SIZES)]
    assert [e.position for e in events] == [expected_position(SIZES, e) for e in ends]
    assert [e.rows for e in events] == ends and [e.batch for e in events] == list(range(1, len(ends) + 1))
    assert events[2].position == {"batch": 2, "row": 234}  # row 300 = 5 + 61 + 234: inside batch 2


class SlowChecking:
    """A slow estimator that checks its input buffers are not overwritten while it trains."""

    def __init__(self, delay=0.002):
        self.inner = SGDRegressor(random_state=0)
        self.delay = delay
        self.calls = 0
        self.on_call = None

    def partial_fit(self, X, y, sample_weight=None):
        snapshot = (X.copy(), y.copy())
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        time.sleep(self.delay)
        np.testing.assert_array_equal(X, snapshot[0])  # the ring did not reuse a buffer in use
        np.testing.assert_array_equal(y, snapshot[1])
        self.inner.partial_fit(X, y, sample_weight=sample_weight)
        self.coef_ = self.inner.coef_
        return self

    def predict(self, X):
        return self.inner.predict(X)


@pytest.mark.anyio
@pytest.mark.parametrize("queue_size", [1, 3])
async def test_backpressure_bounds_batches_in_flight(queue_size):
    bs = 16
    batches = make_batches([bs] * 40, d=3)
    trained = []
    in_flight = []
    source = ListSource(batches, on_read=lambda s: in_flight.append(s.reads - len(trained)))
    est = SlowChecking()
    summary = await train_stream(est, source, batch_size=bs, queue_size=queue_size,
                                 on_batch=lambda e: trained.append(e.rows))
    assert summary.rows == 40 * bs
    # queue_size queued + one being trained + one held by the reader (being filled / waiting to send)
    assert max(in_flight) <= queue_size + IN_FLIGHT_EXTRA
    assert max(in_flight) >= queue_size + 1  # the producer really ran ahead until blocked


@pytest.mark.anyio
async def test_backpressure_bounds_rows_in_flight_when_rebatching():
    bs, rb_rows, q = 16, 40, 2
    batches = make_batches([rb_rows] * 30, d=3)
    trained = [0]
    peak = [0]

    def on_read(s):
        peak[0] = max(peak[0], s.rows_read - trained[0])

    def on_batch(e):
        trained[0] = e.rows

    await train_stream(SlowChecking(0.001), ListSource(batches, on_read=on_read), batch_size=bs,
                       queue_size=q, on_batch=on_batch)
    assert peak[0] <= (q + IN_FLIGHT_EXTRA) * bs + rb_rows


@pytest.mark.anyio
async def test_stop_during_a_batch_finishes_it_and_returns_its_position():
    batches = make_batches([10] * 20, d=2)
    est = SlowChecking(0.01)
    loop = StreamLoop(est, ListSource(batches), batch_size=10)
    est.on_call = lambda n: anyio.from_thread.run_sync(loop.stop) if n == 3 else None
    summary = await loop.run()
    assert est.calls == 3 and summary.batches == 3 and summary.rows == 30
    assert summary.position == {"batch": 2, "row": 10} and summary.ended_by == "stop"
    assert loop.state is LoopState.STOPPED


@pytest.mark.anyio
async def test_stop_event_from_hook_and_stop_while_waiting_for_data():
    batches = make_batches([10, 10, 10], d=2)
    stop = anyio.Event()
    source = ListSource(batches)
    summary = await train_stream(SGDRegressor(), source, batch_size=10, stop_event=stop,
                                 on_batch=lambda e: stop.set() if e.batch == 2 else None)
    assert summary.batches == 2 and summary.position == {"batch": 1, "row": 10}
    assert source.close_calls == 1

    # a live source with no new data: the trainer is idle; stop returns at once
    source = ListSource(batches[:2] + [BLOCK])
    loop = StreamLoop(SGDRegressor(), source, batch_size=10,
                      on_batch=lambda e: None)

    async def stopper():
        while loop.summary().batches < 2:
            await anyio.sleep(0.001)
        loop.stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stopper)
        summary = await loop.run()
    assert summary.batches == 2 and summary.ended_by == "stop" and source.close_calls == 1


@pytest.mark.anyio
async def test_stop_before_run_trains_nothing():
    loop = StreamLoop(SGDRegressor(), ListSource(make_batches([10], d=2)), batch_size=10)
    loop.stop()
    summary = await loop.run()
    assert summary.rows == 0 and summary.position is None and summary.ended_by == "stop"


@pytest.mark.anyio
async def test_max_rows():
    batches = make_batches([50, 50], d=2)
    summary = await train_stream(SGDRegressor(), ListSource(batches), batch_size=16, max_rows=70)
    assert summary.rows == 70 and summary.ended_by == "max_rows"
    assert summary.position == {"batch": 1, "row": 20}


class Boom(Exception):
    pass


class FailingEstimator(SGDRegressor):
    def partial_fit(self, X, y, sample_weight=None):
        if getattr(self, "_n", 0) == 2:
            raise Boom("diverged")
        self._n = getattr(self, "_n", 0) + 1
        return super().partial_fit(X, y, sample_weight=sample_weight)


@pytest.mark.anyio
async def test_errors_propagate_unwrapped_and_the_source_is_closed():
    source = ListSource(make_batches([10] * 5, d=2))
    with pytest.raises(Boom, match="diverged"):
        await train_stream(FailingEstimator(), source, batch_size=10)
    assert source.close_calls == 1

    source = ListSource(make_batches([10, 10, 10], d=2)[:2] + [FAIL])
    events = []
    with pytest.raises(SourceError, match="connection lost"):
        await train_stream(SGDRegressor(), source, batch_size=10, on_batch=events.append)
    assert len(events) == 2 and source.close_calls == 1  # read batches are trained before the error

    def bad_hook(event):
        raise KeyError("hook failed")

    source = ListSource(make_batches([10, 10], d=2))
    with pytest.raises(KeyError, match="hook failed"):
        await train_stream(SGDRegressor(), source, batch_size=10, on_batch=bad_hook)
    assert source.close_calls == 1


@pytest.mark.anyio
async def test_cancellation_from_outside_closes_the_source():
    source = ListSource(make_batches([10] * 10, d=2))
    est = SlowChecking(0.005)
    with anyio.CancelScope() as scope:
        await train_stream(est, source, batch_size=10, on_batch=lambda e: scope.cancel() if e.batch == 2 else None)
    assert scope.cancelled_caught and source.close_calls == 1
    assert est.calls == 2 or est.calls == 3  # a running partial_fit is finished, never torn


@pytest.mark.anyio
async def test_lifecycle_and_reuse_error():
    loop = StreamLoop(SGDRegressor(), ListSource(make_batches([10, 10], d=2)), batch_size=10,
                      on_batch=lambda e: states.append(loop.state))
    states = []
    assert loop.state is LoopState.CREATED
    summary = await loop.run()
    assert isinstance(summary, StreamSummary)
    assert states[0] in (LoopState.RUNNING, LoopState.DRAINING) and loop.state is LoopState.STOPPED
    with pytest.raises(RuntimeError, match="stopped: a loop runs once"):
        await loop.run()


@pytest.mark.anyio
async def test_progress_bar(capsys):
    source = ListSource(make_batches([50, 50], d=2), total_rows=100)
    summary = await train_stream(SGDRegressor(), source, batch_size=20, progress=True)
    err = capsys.readouterr().err
    assert "100/100" in err and "loss=" in err
    assert summary.rows_per_s > 0 and summary.elapsed > 0


@pytest.mark.anyio
async def test_open_source_is_imported_lazily(monkeypatch):
    import streamfit.sources as sources

    batches = make_batches([10, 10], d=2)
    opened = []

    async def open_source(spec):
        opened.append(spec)
        return ListSource(batches)

    monkeypatch.setattr(sources, "open_source", open_source, raising=False)
    summary = await train_stream(SGDRegressor(), "memory://whatever", batch_size=10)
    assert opened == ["memory://whatever"] and summary.rows == 20


@pytest.mark.anyio
async def test_with_the_memory_source():
    memory = pytest.importorskip("streamfit.sources.memory")
    import pyarrow as pa

    batches = make_batches([30, 20], d=2)
    est = SGDRegressor(random_state=0)
    summary = await train_stream(est, memory.MemorySource(pa.Table.from_batches(batches)), batch_size=16)
    assert summary.rows == 50 and summary.position == {"batch": 1, "row": 20}
    assert_same_model(est, fit_reference(SGDRegressor(random_state=0),
                                         reference_chunks(batches, ["x0", "x1"], 16)))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_train_stream_sync(backend):
    batches = make_batches([40, 40], d=2)
    est = SGDRegressor(random_state=0)
    summary = train_stream_sync(est, ListSource(batches), backend=backend, batch_size=32)
    assert summary.rows == 80 and summary.batches == 3
    assert_same_model(est, fit_reference(SGDRegressor(random_state=0),
                                         reference_chunks(batches, ["x0", "x1"], 32)))


class Blocking(SGDRegressor):
    """partial_fit number ``block_at`` waits until released: a step in progress when the loop is cancelled."""

    def __init__(self, block_at=2):
        super().__init__(random_state=0)
        self.block_at = block_at
        self.entered = __import__("threading").Event()
        self.release = __import__("threading").Event()
        self.finished = 0
        self.threads = set()

    def partial_fit(self, X, y, sample_weight=None):
        self.threads.add(__import__("threading").get_ident())
        if self.finished + 1 == self.block_at:
            self.entered.set()
            assert self.release.wait(10)
        super().partial_fit(X, y, sample_weight=sample_weight)
        self.finished += 1
        return self


@pytest.mark.anyio
async def test_cancelling_waits_for_the_step_in_progress_and_the_trainer_thread_ends():
    est = Blocking(block_at=2)
    source = ListSource(make_batches([10] * 10, d=2))
    loop = StreamLoop(est, source, batch_size=10)
    log = []
    scope = anyio.CancelScope()

    async def cancel_during_step():
        await anyio.to_thread.run_sync(est.entered.wait)
        scope.cancel()
        await anyio.sleep(0.05)
        log.append("loop still waiting" if loop.state is not LoopState.STOPPED else "loop returned mid-step")
        est.release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_during_step)
        with scope:
            await loop.run()
        log.append(est.finished)
    assert scope.cancelled_caught and source.close_calls == 1
    assert log == ["loop still waiting", 2]  # the interrupted call finished, no further one started
    assert len(est.threads) == 1 and not loop._trainer.serving  # one trainer thread for every step; it ended


@pytest.mark.anyio
async def test_a_queued_batch_is_handed_to_the_trainer_without_letting_the_reader_run(monkeypatch):
    """The next step is handed over right after the previous batch's hooks: the reader (on the event loop)
    reads while the model trains, not in between (it used to run inside to_thread.run_sync's checkpoint)."""
    import streamfit._stream.loop as loop_module

    source = ListSource(make_batches([10] * 12, d=2))
    at_hook, at_handover = [], []

    class Recording(loop_module.StepThread):
        async def run(self, fn, *args):
            at_handover.append(source.reads)
            return await super().run(fn, *args)

    monkeypatch.setattr(loop_module, "StepThread", Recording)
    await train_stream(SlowChecking(0.003), source, batch_size=10, queue_size=3,
                       on_batch=lambda e: at_hook.append(source.reads))
    assert len(at_handover) == len(at_hook) == 12
    assert at_handover[1:] == at_hook[:-1]  # nothing was read between a batch's hook and the next hand-over
    assert max(at_hook) > min(at_hook)  # the reader did run meanwhile (while the steps ran)


@pytest.mark.anyio
async def test_large_record_batches_extracted_in_a_thread_give_the_same_model_and_positions():
    import streamfit._stream.loop as loop_module

    d = 8
    sizes = [loop_module._AHEAD_VALUES // d + 5, 300, loop_module._AHEAD_VALUES // d - 7]  # large, small, large
    batches = make_batches(sizes, d=d, weight=True)
    features = [f"x{j}" for j in range(d)]
    est = SGDRegressor(random_state=0)
    events = []
    summary = await train_stream(est, ListSource(batches), weight="w", batch_size=4096, on_batch=events.append)
    chunks = reference_chunks(batches, features, 4096, weight="w")
    assert_same_model(est, fit_reference(SGDRegressor(random_state=0), chunks))
    assert [e.position for e in events] == [expected_position(sizes, e.rows) for e in events]
    assert summary.rows == sum(sizes) and summary.position == {"batch": 2, "row": sizes[2]}
