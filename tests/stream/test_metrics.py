"""Progressive validation: predict-then-train metrics equal a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import SGDClassifier, SGDRegressor

from streamfit._stream import StreamLoop, train_stream
from streamfit._stream.metrics import EPS, ProgressiveMetrics

from tests.stream.helpers import ListSource, make_batches, reference_chunks

SIZES = [10, 10, 10, 10]
BS = 10
WINDOW = 15


def hand_regression():
    batches = make_batches(SIZES, d=3, seed=5)
    est = SGDRegressor(random_state=0)
    abs_err, sq_err = [], []
    for k, (X, y, _) in enumerate(reference_chunks(batches, ["x0", "x1", "x2"], BS)):
        if k > 0:  # the first batch meets an untrained model
            err = est.predict(X).astype(np.float64) - y.astype(np.float64)
            abs_err.append(np.abs(err))
            sq_err.append(err ** 2)
        est.partial_fit(X, y)
    return batches, np.concatenate(abs_err), np.concatenate(sq_err)


@pytest.mark.anyio
async def test_regression_metrics_match_hand_computation():
    batches, abs_err, sq_err = hand_regression()
    events, streamed = [], []
    loop = StreamLoop(SGDRegressor(random_state=0), ListSource(batches), batch_size=BS, window=WINDOW,
                      on_metrics=events.append)
    import anyio

    async def read(rx):
        async with rx:
            async for ev in rx:
                streamed.append(ev)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read, loop.metric_events())
        summary = await loop.run()
    approx = lambda v: pytest.approx(v, rel=1e-12)  # noqa: E731
    s = summary.stream_metrics
    assert s["rows"] == 30
    assert s["mae"] == approx(abs_err.mean())
    assert s["rmse"] == approx(np.sqrt(sq_err.mean()))
    assert s["loss"] == approx(sq_err.mean())
    w = summary.window_metrics
    assert w["rows"] == WINDOW
    assert w["mae"] == approx(abs_err[-WINDOW:].mean())
    assert w["rmse"] == approx(np.sqrt(sq_err[-WINDOW:].mean()))
    assert [e.batch for e in events] == [2, 3, 4] and streamed == events
    assert events[0].batch_metrics["mae"] == approx(abs_err[:10].mean())
    assert events[1].window["mae"] == approx(abs_err[5:20].mean())
    assert events[-1].position == {"batch": 3, "row": 10}


@pytest.mark.anyio
async def test_classification_metrics_match_hand_computation():
    batches = make_batches([12] * 4, d=2, classes=3, seed=2)
    classes = np.array([0, 1, 2])
    est = SGDClassifier(loss="log_loss", random_state=0)
    correct, logloss = [], []
    for k, (X, y, _) in enumerate(reference_chunks(batches, ["x0", "x1"], 12, label_dtype=np.int64)):
        if k > 0:
            correct.append(est.predict(X) == y)
            p = est.predict_proba(X)[np.arange(len(y)), y]
            logloss.append(-np.log(np.clip(p, EPS, 1)))
        est.partial_fit(X, y, classes=classes if k == 0 else None)
    correct, logloss = np.concatenate(correct), np.concatenate(logloss)
    summary = await train_stream(SGDClassifier(loss="log_loss", random_state=0), ListSource(batches),
                                 classes=classes, batch_size=12, window=20)
    s, w = summary.stream_metrics, summary.window_metrics
    assert s["accuracy"] == pytest.approx(correct.mean(), rel=1e-12)
    assert s["log_loss"] == pytest.approx(logloss.mean(), rel=1e-12) and s["loss"] == s["log_loss"]
    assert w["rows"] == 20 and w["accuracy"] == pytest.approx(correct[-20:].mean(), rel=1e-12)
    assert w["log_loss"] == pytest.approx(logloss[-20:].mean(), rel=1e-12)


@pytest.mark.anyio
async def test_classifier_without_proba_has_accuracy_only():
    batches = make_batches([12] * 3, d=2, classes=2, seed=2)
    summary = await train_stream(SGDClassifier(random_state=0), ListSource(batches), classes=[0, 1],
                                 batch_size=12)
    assert summary.stream_metrics["accuracy"] is not None
    assert summary.stream_metrics["log_loss"] is None and summary.stream_metrics["loss"] is None


class OwnLoss:
    """An estimator exposing its own loss function and training loss (like streamfit's engine)."""

    def __init__(self):
        self.inner = SGDRegressor(random_state=0)

    def partial_fit(self, X, y, sample_weight=None):
        self.inner.partial_fit(X, y, sample_weight=sample_weight)
        self.loss_ = 42.0
        return self

    def predict(self, X):
        return self.inner.predict(X)

    def loss_function(self, y, pred):
        return 3 * np.abs(y - pred)


@pytest.mark.anyio
async def test_estimator_own_loss_is_used():
    batches, abs_err, _ = hand_regression()
    events = []
    summary = await train_stream(OwnLoss(), ListSource(batches), batch_size=BS, on_batch=events.append)
    assert summary.stream_metrics["loss"] == pytest.approx(3 * abs_err.mean(), rel=1e-6)
    assert [e.loss for e in events] == [42.0] * 4
    assert events[0].progressive_loss is None
    assert events[1].progressive_loss == pytest.approx(3 * abs_err[:10].mean(), rel=1e-6)


def test_window_ring_exact_with_batches_larger_than_window():
    m = ProgressiveMetrics("regression", window=7)
    rng = np.random.default_rng(0)
    allerr = []
    for n in [3, 5, 1, 20, 2, 6]:
        e = rng.normal(size=n)
        allerr.append(e)
        m.update({"loss": e ** 2, "abs_error": np.abs(e), "sq_error": e ** 2})
        cat = np.concatenate(allerr)
        assert m.recent()["mae"] == pytest.approx(np.abs(cat[-7:]).mean())
        assert m.stream()["rows"] == len(cat)
        assert m.stream()["mae"] == pytest.approx(np.abs(cat).mean())
