"""The loop driving streamfit's own estimators: same weights as partial_fit, progressive outputs from the step."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from streamfit import OnnxClassifier, OnnxRegressor
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._stream import train_stream_sync
from streamfit.sources.memory import MemorySource


def _batches(n=1000, d=4, seed=0, classify=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = X @ np.arange(1, d + 1, dtype=np.float32) + 0.5
    if classify:
        y = (y > 0.5).astype(np.int64)
    sizes = [137, 300, 63, 500]  # record batches that do not line up with training batches
    out, start = [], 0
    for size in sizes:
        cols = {f"x{j}": X[start:start + size, j] for j in range(d)}
        cols["y"] = y[start:start + size]
        out.append(pa.record_batch(cols))
        start += size
    return X, y, out


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_loop_equals_partial_fit_on_same_batches(backend):
    X, y, batches = _batches()
    looped = OnnxRegressor(mlp_model([4, 8, 1], seed=0), batch_size=64, optimizer="adam",
                           learning_rate="constant", eta0=0.01)
    summary = train_stream_sync(looped, MemorySource(batches), batch_size=64, backend=backend)
    direct = OnnxRegressor(mlp_model([4, 8, 1], seed=0), batch_size=64, optimizer="adam",
                           learning_rate="constant", eta0=0.01)
    progressive = []
    for i in range(0, 1000, 64):
        if i:
            progressive.append(direct.predict(X[i:i + 64]))
        direct.partial_fit(X[i:i + 64], y[i:i + 64])
    for name, w in direct.trainer_.get_weights().items():
        np.testing.assert_array_equal(looped.trainer_.get_weights()[name], w)
    assert summary.rows == 1000 and summary.batches == 16
    pred = np.concatenate(progressive)
    err = pred - y[64:]
    assert summary.stream_metrics["rows"] == 1000 - 64
    assert summary.stream_metrics["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-5)
    assert summary.stream_metrics["rmse"] == pytest.approx(np.sqrt((err ** 2).mean()), rel=1e-5)


def test_loop_with_onnx_classifier_progressive_accuracy():
    X, y, batches = _batches(classify=True)
    clf = OnnxClassifier(linear_model(4), batch_size=50, learning_rate="constant", eta0=0.5)
    summary = train_stream_sync(clf, MemorySource(batches), batch_size=50, classes=[0, 1])
    assert summary.rows == 1000
    assert summary.window_metrics["accuracy"] > 0.9
    assert 0 < summary.stream_metrics["log_loss"] < 0.7


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_fast_steps_of_streamfit_estimators_move_to_the_event_loop_with_the_same_result(backend, monkeypatch):
    import threading

    import streamfit._stream.loop as loop_module

    monkeypatch.setattr(loop_module, "_INLINE_BELOW", 0.05)  # "fast" even on a loaded machine

    X, y, batches = _batches(n=1000)
    looped = OnnxRegressor(linear_model(4), batch_size=32, learning_rate="constant", eta0=0.01)
    threads = []
    step = looped.partial_fit_predict

    def recording(*args, **kwargs):  # an instance attribute: the class (and the inline rule) is unchanged
        threads.append(threading.get_ident())
        return step(*args, **kwargs)

    looped.partial_fit_predict = recording
    main = []
    summary = train_stream_sync(looped, MemorySource(batches), batch_size=32, backend=backend,
                                on_batch=lambda e: main.append(threading.get_ident()))
    direct = OnnxRegressor(linear_model(4), batch_size=32, learning_rate="constant", eta0=0.01)
    for i in range(0, 1000, 32):
        direct.partial_fit(X[i:i + 32], y[i:i + 32])
    for name, w in direct.trainer_.get_weights().items():
        np.testing.assert_array_equal(looped.trainer_.get_weights()[name], w)
    assert summary.rows == 1000 and len(threads) == 32
    loop_thread = main[0]
    assert set(threads[:loop_module._INLINE_AFTER]) != {loop_thread}  # the first steps in the trainer thread
    assert threads.count(loop_thread) >= 10  # then (fast steps) on the event loop thread
    assert threads[-1] != loop_thread  # the last, partial batch (another shape) in the trainer thread again


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_slow_step_goes_back_to_the_trainer_thread_and_cancelling_inline_trains_no_further_batch(backend,
                                                                                                    monkeypatch):
    import threading
    import time

    import anyio

    import streamfit._stream.loop as loop_module
    from streamfit._stream import train_stream

    monkeypatch.setattr(loop_module, "_INLINE_BELOW", 0.05)  # "fast" even on a loaded machine

    _, _, batches = _batches(n=1000)
    est = OnnxRegressor(linear_model(4), batch_size=16, learning_rate="constant", eta0=0.01)
    threads = []
    step = est.partial_fit_predict

    def recording(*args, **kwargs):
        threads.append(threading.get_ident())
        if len(threads) == 20:
            time.sleep(2 * loop_module._INLINE_BELOW)  # one slow step
        return step(*args, **kwargs)

    est.partial_fit_predict = recording
    main = []

    async def run():
        with anyio.CancelScope() as scope:
            def on_batch(e):
                main.append(threading.get_ident())
                if e.batch == 40:
                    scope.cancel()
            await train_stream(est, MemorySource(batches), batch_size=16, on_batch=on_batch)
        return scope.cancelled_caught

    assert anyio.run(run, backend=backend)
    loop_thread = main[0]
    inline = [t == loop_thread for t in threads]
    assert len(threads) == 40  # cancelled in the hook of batch 40 (an inline step): no step 41
    assert inline[19] and not any(inline[20:20 + loop_module._INLINE_AFTER]) and inline[-1]
