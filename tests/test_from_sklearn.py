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
from sklearn import svm as sk_svm  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import MaxAbsScaler, MinMaxScaler, StandardScaler  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Class PassiveAggressive:FutureWarning")
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
    (sk_linear.Ridge(alpha=10.0), "reg", LinearRegressor),
    (sk_linear.Lasso(alpha=0.5), "reg", LinearRegressor),
    (sk_linear.ElasticNet(alpha=0.5, l1_ratio=0.3), "reg", LinearRegressor),
    (sk_svm.LinearSVR(C=0.01, max_iter=5000), "reg", LinearRegressor),
    (sk_linear.PassiveAggressiveRegressor(C=0.01, max_iter=2, tol=None, random_state=0), "reg", LinearRegressor),
    (sk_linear.Perceptron(max_iter=2, tol=None, random_state=0), "bin", LogisticRegression),
    (sk_linear.Perceptron(max_iter=2, tol=None, random_state=0), "multi", LogisticRegression),
    (sk_linear.PassiveAggressiveClassifier(C=0.01, max_iter=2, tol=None, random_state=0), "bin", LogisticRegression),
    (sk_svm.LinearSVC(C=0.005), "bin", LogisticRegression),
    (sk_svm.LinearSVC(C=0.005, loss="hinge"), "multi", LogisticRegression),
    (sk_linear.SGDClassifier(loss="modified_huber", max_iter=2, tol=None, random_state=0), "multi", LogisticRegression),
    (make_pipeline(MinMaxScaler(), sk_linear.Ridge(alpha=10.0)), "reg", LinearRegressor),
    (make_pipeline(MaxAbsScaler(), StandardScaler(with_mean=False), sk_nn.MLPClassifier(
        hidden_layer_sizes=(8,), max_iter=20, random_state=0)), "multi", MLPClassifier),
]
IDS = [f"{'+'.join(type(s).__name__ for _, s in getattr(sk, 'steps', [(0, sk)]))}-{task}" for sk, task, _ in CASES]


@pytest.fixture(params=range(len(CASES)), ids=IDS)
def converted(request):
    """A scikit-learn model fitted on few rows (not converged), and its conversion."""
    sk, task, cls = CASES[request.param]
    sk = copy.deepcopy(sk)
    exact = (sk_linear.LinearRegression, sk_linear.Ridge, sk_linear.Lasso, sk_linear.ElasticNet, sk_svm.LinearSVR)
    rows = 10 if isinstance(getattr(sk, "steps", [(0, sk)])[-1][1], exact) else len(X_OLD)  # batch solvers: few rows
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
    if hasattr(sk, "predict_proba") and not (isinstance(sk, sk_linear.SGDClassifier) and sk.loss != "log_loss"):
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
    est = from_sklearn(sk, loss="huber", batch_size=16)
    assert est.loss == "huber" and est.batch_size == 16 and est.warm_start
    with pytest.raises(TypeError, match="from_sklearn converts SGDRegressor, SGDClassifier, Perceptron, .*got HuberRegressor"):
        from_sklearn(sk_linear.HuberRegressor().fit(X_OLD, _target(X_OLD, "reg")))
    from sklearn.preprocessing import PolynomialFeatures

    with pytest.raises(TypeError, match=r"a Pipeline of StandardScaler, MinMaxScaler, MaxAbsScaler steps and a model; "
                                        r"got steps \['PolynomialFeatures', 'Ridge'\]"):
        from_sklearn(make_pipeline(PolynomialFeatures(), sk_linear.Ridge()).fit(X_OLD, _target(X_OLD, "reg")))
    with pytest.raises(ValueError, match="clip=True"):
        from_sklearn(make_pipeline(MinMaxScaler(clip=True), sk_linear.Ridge()).fit(X_OLD, _target(X_OLD, "reg")))
    with pytest.raises(ValueError, match="average=True"):
        from_sklearn(sk_linear.SGDRegressor(average=True, max_iter=2, tol=None).fit(X_OLD, _target(X_OLD, "reg")))
    with pytest.raises(sklearn.exceptions.NotFittedError):
        from_sklearn(sk_linear.SGDRegressor())
    with pytest.raises(sklearn.exceptions.NotFittedError):
        from_sklearn(make_pipeline(MaxAbsScaler(), sk_linear.Ridge().fit(X_OLD, _target(X_OLD, "reg"))))


def test_scaler_pipelines_export_and_checkpoint_their_frozen_scaling():
    pipe = make_pipeline(MinMaxScaler(feature_range=(-1, 2)), MaxAbsScaler(), sk_linear.Ridge(alpha=1.0))
    pipe.fit(X_OLD * 100 + 5, _target(X_OLD, "reg"))
    est = from_sklearn(pipe)
    X = (X_TEST * 100 + 5).astype(np.float32)
    np.testing.assert_allclose(est.predict(X), pipe.predict(X), rtol=1e-4, atol=1e-3)
    est.partial_fit(X_NEW[:200] * 100 + 5, _target(X_NEW[:200], "reg"))
    import onnxruntime as ort

    out = ort.InferenceSession(est.to_onnx().SerializeToString()).run(None, {"X": X})[0].ravel()
    np.testing.assert_allclose(out, est.predict(X), rtol=1e-5, atol=1e-3)
    twin = LinearRegressor(standardize=True, standardize_target=False)
    twin.load_state_dict(est.state_dict())  # the frozen scaling travels in the state, as a checkpoint holds it
    np.testing.assert_array_equal(twin.predict(X), est.predict(X))
    mean = est.scaler_.mean_.copy()
    est.partial_fit(X_NEW[:50] * 1000, _target(X_NEW[:50], "reg"))
    np.testing.assert_array_equal(est.scaler_.mean_, mean)  # fitted scaling stays fitted


# shuffle=False: scikit-learn's partial_fit shuffles the rows of each call with its own generator
_SGD = {"max_iter": 2, "tol": None, "shuffle": False, "learning_rate": "constant", "eta0": 0.01}
_PA = {"max_iter": 2, "tol": None, "shuffle": False}
STEPWISE = [  # scikit-learn's partial_fit and streamfit take the same steps: same loss, rate, penalty, order
    (sk_linear.SGDClassifier(loss="hinge", **_SGD), "bin"),
    (sk_linear.SGDClassifier(loss="hinge", alpha=1e-3, **_SGD), "multi"),
    (sk_linear.SGDClassifier(loss="hinge", alpha=0.05, **dict(_SGD, learning_rate="optimal")), "bin"),
    (sk_linear.SGDClassifier(loss="squared_hinge", **dict(_SGD, learning_rate="invscaling")), "bin"),
    (sk_linear.SGDClassifier(loss="modified_huber", **_SGD), "multi"),
    (sk_linear.SGDClassifier(loss="log_loss", **_SGD), "multi"),  # one-vs-rest, as scikit-learn's
    (sk_linear.Perceptron(**_PA), "bin"),
    (sk_linear.Perceptron(penalty="l2", alpha=1e-3, **_PA), "multi"),
    (sk_linear.SGDRegressor(loss="epsilon_insensitive", epsilon=0.5, **_SGD), "reg"),
    (sk_linear.SGDRegressor(loss="squared_epsilon_insensitive", **_SGD), "reg"),
    (sk_linear.PassiveAggressiveRegressor(C=0.1, **_PA), "reg"),
    (sk_linear.PassiveAggressiveRegressor(C=0.1, loss="squared_epsilon_insensitive", **_PA), "reg"),
    (sk_linear.PassiveAggressiveClassifier(C=0.05, **_PA), "bin"),
    (sk_linear.PassiveAggressiveClassifier(C=0.05, loss="squared_hinge", **_PA), "bin"),
    (sk_linear.SGDClassifier(loss="hinge", penalty=None, **dict(_SGD, learning_rate="pa1", eta0=0.05)), "bin"),
]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("sk", "task"), STEPWISE,
                         ids=[f"{type(sk).__name__}-{getattr(sk, 'loss', 'perceptron')}-{task}" for sk, task in STEPWISE])
def test_continues_step_for_step_as_sklearn_partial_fit(sk, task):
    X_old, X_new = X_OLD * [1, 2, 0.5, 1, 3], X_NEW[:300] * [1, 2, 0.5, 1, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X_old, _target(X_OLD, task))
    est = from_sklearn(sk)
    start = est.coef_.copy()
    y_new = _target(X_new, task)
    for i in range(0, len(X_new), 50):
        sk.partial_fit(X_new[i:i + 50], y_new[i:i + 50])
        est.partial_fit(X_new[i:i + 50], y_new[i:i + 50])
    assert not np.allclose(est.coef_, start, rtol=1e-3, atol=1e-3)  # the steps did move the weights
    ref = sk.decision_function(X_TEST) if task != "reg" else sk.predict(X_TEST)
    out = est.decision_function(X_TEST) if task != "reg" else est.predict(X_TEST)
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4 * np.abs(ref).max())
    np.testing.assert_allclose(est.coef_.reshape(sk.coef_.shape), sk.coef_, rtol=2e-4, atol=2e-4 * np.abs(sk.coef_).max())
    if getattr(sk, "loss", None) == "log_loss":
        np.testing.assert_allclose(est.predict_proba(X_TEST), sk.predict_proba(X_TEST), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("task", ["bin", "multi"])
def test_mlp_classifier_continues_as_sklearn_partial_fit(task):
    sk = sk_nn.MLPClassifier(hidden_layer_sizes=(8,), max_iter=20, shuffle=False, random_state=0, batch_size=20,
                             learning_rate_init=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X_OLD, _target(X_OLD, task))
    est = from_sklearn(sk)
    y_new = _target(X_NEW[:300], task)
    for i in range(0, 300, 60):
        sk.partial_fit(X_NEW[i:i + 60], y_new[i:i + 60])
        est.partial_fit(X_NEW[i:i + 60], y_new[i:i + 60])
    np.testing.assert_allclose(est.predict_proba(X_TEST), sk.predict_proba(X_TEST), rtol=1e-4, atol=1e-5)
