"""The one-row path of the ready-made estimators (streamfit/models/_rows.py) against the general path."""

from __future__ import annotations

import numpy as np
import pytest

from streamfit import LinearRegressor, LogisticRegression
from streamfit.estimators._cache import caches
from streamfit.exceptions import BadInputError


def _rows(n: int = 300, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, d))
    X = Z * [1.0, 10.0, 0.1, 100.0, 3.0][:d] + [0.0, 50.0, -1.0, 1000.0, 2.0][:d]  # units far apart
    return X, Z @ np.linspace(-1.0, 1.0, d) + 0.5 + 0.1 * rng.standard_normal(n)


def _state(est: object) -> dict:
    state = est.state_dict()  # type: ignore[attr-defined]
    return {"weights": state["trainer"]["weights"], "optimizer": state["trainer"]["optimizer"],
            **{k: state[k] for k in ("scaler", "target_scaler") if k in state}}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for name in a[key]:
            np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=f"{key}/{name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("standardize", [True, False])
def test_classifier_row_path_equals_the_general_path(dtype, standardize):
    X, score = _rows()
    X = X.astype(dtype)
    y = np.where(score > 0.5, "yes", "no")
    fast, general = (LogisticRegression(standardize=standardize, random_state=0) for _ in range(2))
    classes = ["no", "yes"]
    fast_pred, general_pred = [], []
    for i in range(len(X)):
        row = X[i:i + 1]
        if i:
            fast_pred.append(fast.predict(row)[0])
            general_pred.append(general.predict(row.tolist())[0])  # a list: never the one-row path
            taken = caches(fast).rows.rows
            np.testing.assert_array_equal(fast.predict_proba(row), general.predict_proba(row.tolist()))
            assert caches(fast).rows.rows == taken + 1  # the probabilities came from the one-row path
        fast.partial_fit(row, y[i:i + 1], classes=classes if i == 0 else None)
        general.partial_fit(row, y[i:i + 1], classes=classes)  # classes= on every call: the general path
        caches(general).rows = None  # and its predictions too
    assert caches(fast).rows is not None
    assert fast_pred == general_pred
    _assert_same(_state(fast), _state(general))
    np.testing.assert_array_equal(fast.decision_function(X), general.decision_function(X))
    assert fast.t_ == general.t_ == len(X) and fast.loss_ == general.loss_


@pytest.mark.parametrize("standardize_target", [True, False])
def test_regressor_row_path_equals_the_general_path(standardize_target):
    X, y = _rows(seed=1)
    fast, general = (LinearRegressor(standardize_target=standardize_target, random_state=0) for _ in range(2))
    fast_pred, general_pred = [], []
    for i in range(len(X)):
        row = X[i:i + 1]
        if i:
            fast_pred.append(fast.predict(row))
            general_pred.append(general.predict(row.tolist()))
        fast.partial_fit(row, y[i:i + 1])
        general.partial_fit(row.tolist(), y[i:i + 1])  # a list: the general path
        caches(general).rows = None
    assert caches(fast).rows is not None
    assert all(a.dtype == b.dtype == np.float64 and a.shape == b.shape == (1,) for a, b in zip(fast_pred, general_pred))
    np.testing.assert_array_equal(np.concatenate(fast_pred), np.concatenate(general_pred))
    _assert_same(_state(fast), _state(general))


def test_row_path_still_refuses_bad_rows_and_labels_and_follows_replaced_state():
    X, score = _rows(n=40)
    y = score > 0.5
    clf = LogisticRegression(random_state=0)
    clf.partial_fit(X[:1], y[:1], classes=[False, True])
    for i in range(1, 20):
        clf.partial_fit(X[i:i + 1], y[i:i + 1])
    assert caches(clf).rows is not None
    before = _state(clf)
    bad = X[20:21].copy()
    bad[0, 2] = np.nan
    with pytest.raises(BadInputError, match="NaN or infinity"):
        clf.partial_fit(bad, y[20:21])
    with pytest.raises(BadInputError, match="NaN or infinity"):
        clf.predict(bad)
    with pytest.raises(BadInputError, match="not in classes_"):
        clf.partial_fit(X[20:21], np.array(["maybe"]))
    with pytest.raises(ValueError, match="features"):
        clf.partial_fit(X[20:21, :3], y[20:21])
    _assert_same(_state(clf), before)  # nothing was learned from the refused rows, scaler included
    # a restored state replaces the scaler: the row path follows it (it is made again for the new objects)
    other = LogisticRegression(random_state=0)
    other.load_state_dict(clf.state_dict())
    for est in (clf, other):
        for i in range(20, 40):
            est.partial_fit(X[i:i + 1], y[i:i + 1])
    _assert_same(_state(clf), _state(other))


def test_graph_scaling_statistics_equal_numpy_and_river_and_resume_exactly():
    """Row by row (the one-row path), the statistics the graph scales with are River's StandardScaler's and
    numpy's two-pass ones; a checkpoint taken halfway and resumed continues bit for bit."""
    river = pytest.importorskip("river")
    from river import preprocessing

    X, score = _rows(n=200)
    y = score > 0.5
    clf = LogisticRegression(random_state=0)
    ref = preprocessing.StandardScaler()
    keys = [f"x{j}" for j in range(X.shape[1])]
    half = None
    for i in range(len(X)):
        clf.partial_fit(X[i:i + 1], y[i:i + 1], classes=[False, True] if i == 0 else None)
        ref.learn_one(dict(zip(keys, X[i].astype(np.float32).tolist())))
        if i == 99:
            half = clf.state_dict()
    assert river is not None and caches(clf).rows is not None
    X32 = X.astype(np.float64).astype(np.float32).astype(np.float64)  # the rows as the model received them
    np.testing.assert_allclose(clf.scaler_.mean_, X32.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(clf.scaler_.var_, X32.var(axis=0), rtol=1e-10)
    np.testing.assert_allclose(clf.scaler_.mean_, [ref.means[k] for k in keys], rtol=1e-12)
    np.testing.assert_allclose(clf.scaler_.var_, [ref.vars[k] for k in keys], rtol=1e-10)
    host = clf.trainer_.host_arrays  # what the graph reads: the scaler's float32 mean and scale
    np.testing.assert_array_equal(host["sf_mean"], clf.scaler_.mean_.astype(np.float32))
    np.testing.assert_array_equal(host["sf_scale"], clf.scaler_.scale_.astype(np.float32))
    resumed = LogisticRegression(random_state=0)
    resumed.load_state_dict(half)
    for i in range(100, len(X)):
        resumed.partial_fit(X[i:i + 1], y[i:i + 1])
    _assert_same(_state(resumed), _state(clf))
    np.testing.assert_array_equal(resumed.decision_function(X), clf.decision_function(X))


@pytest.mark.parametrize("standardize", [True, False])
def test_classifier_row_path_partial_fit_predict_equals_the_general_path(standardize, monkeypatch):
    from streamfit.estimators.classifier import OnnxClassifier

    calls = []
    general_method = OnnxClassifier.partial_fit_predict
    monkeypatch.setattr(OnnxClassifier, "partial_fit_predict",
                        lambda self, *a, **k: calls.append(self) or general_method(self, *a, **k))
    X, score = _rows(seed=2)
    y = np.where(score > 0.5, "yes", "no")
    fast, general = (LogisticRegression(standardize=standardize, random_state=0) for _ in range(2))
    fast_out, general_out = [], []
    for i in range(len(X)):
        row = X[i:i + 1]
        fast_out.append(fast.partial_fit_predict(row, y[i:i + 1], classes=["no", "yes"] if i == 0 else None))
        general_out.append(general.partial_fit_predict(row, y[i:i + 1], classes=["no", "yes"]))  # the general path
        caches(general).rows = None
    assert caches(fast).rows is not None
    assert all(a.dtype == b.dtype == np.float64 and a.shape == b.shape == (1, 2) for a, b in zip(fast_out, general_out))
    np.testing.assert_array_equal(np.concatenate(fast_out), np.concatenate(general_out))
    _assert_same(_state(fast), _state(general))
    # the first sight of each label only (it fills the label cache): every later row took the one-row path
    assert sum(c is fast for c in calls) <= 2
    # each row's probabilities come from the weights before its own step: the first row's from zero weights
    np.testing.assert_array_equal(fast_out[0], [[0.5, 0.5]])


@pytest.mark.parametrize("standardize_target", [True, False])
def test_regressor_row_path_partial_fit_predict_equals_the_general_path(standardize_target, monkeypatch):
    from streamfit.estimators.regressor import OnnxRegressor

    calls = []
    general_method = OnnxRegressor.partial_fit_predict
    monkeypatch.setattr(OnnxRegressor, "partial_fit_predict",
                        lambda self, *a, **k: calls.append(self) or general_method(self, *a, **k))
    X, y = _rows(seed=3)
    fast, general = (LinearRegressor(standardize_target=standardize_target, random_state=0) for _ in range(2))
    fast_out, general_out = [], []
    for i in range(len(X)):
        row = X[i:i + 1]
        fast_out.append(fast.partial_fit_predict(row, y[i:i + 1]))
        general_out.append(general.partial_fit_predict(row.tolist(), y[i:i + 1]))  # a list: the general path
        caches(general).rows = None
    assert caches(fast).rows is not None
    assert all(a.dtype == b.dtype and a.shape == b.shape == (1,) for a, b in zip(fast_out, general_out))
    np.testing.assert_array_equal(np.concatenate(fast_out), np.concatenate(general_out))
    _assert_same(_state(fast), _state(general))
    assert sum(c is fast for c in calls) == 1  # the first row only: every later one took the one-row path
    # a prediction never sees its own row: the row's output before the step, in the units before the row
    assert fast_out[0][0] == 0.0
