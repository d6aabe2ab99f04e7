"""from_sklearn: a fitted scikit-learn model predicts the same once converted, then keeps learning."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

from streamfit import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor, from_sklearn

sklearn = pytest.importorskip("sklearn")
from sklearn import linear_model as sk_linear  # noqa: E402
from sklearn import neural_network as sk_nn  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

RNG = np.random.default_rng(0)
COEF = RNG.standard_normal(5)
X_OLD, X_NEW, X_TEST = (RNG.standard_normal((n, 5)) for n in (80, 3000, 1000))


def _target(X, kind):
    z = X @ COEF
    noise = np.random.default_rng(len(X)).standard_normal(len(X))
    return {"reg": 10 * z + 3 + 2 * noise, "bin": (z > 0.2).astype(int),
            "multi": np.array(["lo", "mid", "hi"])[np.digitize(z, [-0.7, 0.7])]}[kind]


CASES = [  # (scikit-learn estimator, task, streamfit class)
    (sk_linear.SGDRegressor(max_iter=3, tol=None, random_state=0), "reg", LinearRegressor),
    (sk_linear.LinearRegression(), "reg", LinearRegressor),
    (sk_nn.MLPRegressor(hidden_layer_sizes=(16,), learning_rate_init=0.01, max_iter=30, random_state=0), "reg",
     MLPRegressor),
    (sk_linear.SGDClassifier(loss="log_loss", max_iter=3, tol=None, random_state=0), "bin", LogisticRegression),
    (sk_linear.SGDClassifier(loss="log_loss", max_iter=3, tol=None, random_state=0), "multi", LogisticRegression),
    (sk_linear.LogisticRegression(C=0.05), "bin", LogisticRegression),
    (sk_linear.LogisticRegression(C=0.05), "multi", LogisticRegression),
    (sk_nn.MLPClassifier(hidden_layer_sizes=(8,), activation="tanh", max_iter=20, random_state=0), "bin",
     MLPClassifier),
    (sk_nn.MLPClassifier(hidden_layer_sizes=(8, 4), activation="logistic", solver="sgd", momentum=0.9,
                         learning_rate_init=0.2, batch_size=32, max_iter=20, random_state=0), "multi", MLPClassifier),
]
IDS = [f"{type(sk).__name__}-{task}" for sk, task, _ in CASES]


@pytest.fixture(params=range(len(CASES)), ids=IDS)
def converted(request):
    """A scikit-learn model fitted on few rows (not converged), and its conversion."""
    sk, task, cls = CASES[request.param]
    sk = copy.deepcopy(sk)
    rows = 10 if isinstance(sk, sk_linear.LinearRegression) else len(X_OLD)  # exact least squares: few rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: a weak start is the point
        sk.fit(X_OLD[:rows], _target(X_OLD[:rows], task))
    est = from_sklearn(sk)
    assert type(est) is cls
    return sk, task, est


def test_converted_model_predicts_what_sklearn_predicts(converted):
    sk, task, est = converted
    np.testing.assert_array_equal(est.classes_, sk.classes_) if task != "reg" else None
    if task == "reg":
        np.testing.assert_allclose(est.predict(X_TEST), sk.predict(X_TEST), rtol=1e-5, atol=1e-5)
        return
    assert np.array_equal(est.predict(X_TEST), sk.predict(X_TEST))
    if hasattr(sk, "decision_function"):
        np.testing.assert_allclose(est.decision_function(X_TEST), sk.decision_function(X_TEST), rtol=1e-5, atol=1e-5)
    if hasattr(sk, "predict_proba") and not (isinstance(sk, sk_linear.SGDClassifier) and task == "multi"):
        np.testing.assert_allclose(est.predict_proba(X_TEST), sk.predict_proba(X_TEST), rtol=1e-5, atol=1e-5)


def test_converted_model_improves_on_new_data(converted):
    sk, task, est = converted
    y_new, y_test = _target(X_NEW, task), _target(X_TEST, task)
    before = est.score(X_TEST, y_test)
    for i in range(0, len(X_NEW), 100):  # a stream of batches
        est.partial_fit(X_NEW[i:i + 100], y_new[i:i + 100])
    after = est.score(X_TEST, y_test)
    assert after > before + 0.01, (before, after)
    assert after > sk.score(X_TEST, y_test)


@pytest.mark.parametrize("sk", [
    sk_linear.SGDRegressor(max_iter=3, tol=None, shuffle=False, random_state=0),
    sk_nn.MLPRegressor(hidden_layer_sizes=(8,), max_iter=30, shuffle=False, random_state=0, batch_size=20,
                       learning_rate_init=0.01),
    sk_nn.MLPRegressor(hidden_layer_sizes=(8,), solver="sgd", momentum=0.9, max_iter=30, shuffle=False,
                       random_state=0, batch_size=20, learning_rate_init=0.01),
], ids=["SGDRegressor", "MLPRegressor-adam", "MLPRegressor-sgd-momentum"])
def test_continues_as_sklearn_partial_fit_would(sk):
    """Schedule position, solver and its state carry over: both continue along the same path."""
    y_old, y_new = _target(X_OLD, "reg"), _target(X_NEW[:300], "reg") + 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X_OLD, y_old)
    est = from_sklearn(sk)
    for i in range(0, 300, 60):
        sk.partial_fit(X_NEW[i:i + 60], y_new[i:i + 60])
        est.partial_fit(X_NEW[i:i + 60], y_new[i:i + 60])
    np.testing.assert_allclose(est.predict(X_TEST), sk.predict(X_TEST), rtol=1e-4, atol=1e-4)


def test_pipeline_with_standard_scaler_becomes_standardize():
    X_old, X_test = X_OLD * [1e-2, 1, 1e2, 1e3, 1e4], X_TEST * [1e-2, 1, 1e2, 1e3, 1e4]
    pipe = make_pipeline(StandardScaler(), sk_linear.SGDRegressor(max_iter=5, tol=None, random_state=0))
    pipe.fit(X_old, _target(X_OLD, "reg"))
    est = from_sklearn(pipe)
    assert est.standardize and est.scaler_.count == len(X_old)
    np.testing.assert_allclose(est.predict(X_test), pipe.predict(X_test), rtol=1e-5, atol=1e-5)


def test_overrides_and_errors():
    sk = sk_linear.SGDRegressor(loss="epsilon_insensitive", max_iter=2, tol=None).fit(X_OLD, _target(X_OLD, "reg"))
    with pytest.raises(ValueError, match="loss='epsilon_insensitive'.* has no streamfit equivalent; pass loss="):
        from_sklearn(sk)
    est = from_sklearn(sk, loss="huber", batch_size=16)
    assert est.loss == "huber" and est.batch_size == 16 and est.warm_start
    with pytest.raises(TypeError, match="from_sklearn converts SGDRegressor, SGDClassifier, LinearRegression, "
                                        "LogisticRegression, MLPRegressor, MLPClassifier.*got Ridge"):
        from_sklearn(sk_linear.Ridge().fit(X_OLD, _target(X_OLD, "reg")))
    with pytest.raises(sklearn.exceptions.NotFittedError):
        from_sklearn(sk_linear.SGDRegressor())
    with pytest.warns(UserWarning, match="no 'hinge' loss"):
        clf = from_sklearn(sk_linear.SGDClassifier(max_iter=2, tol=None).fit(X_OLD, _target(X_OLD, "bin")))
    assert clf.loss == "auto"
