"""OnnxRegressor / OnnxClassifier: the seed example, scikit-learn's contract, Arrow input, export."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pytest

from streamfit import OnnxClassifier, OnnxRegressor
from streamfit._engine.testing import linear_model, mlp_model
from streamfit.exceptions import BadInputError

sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")


@pytest.fixture(scope="module")
def seed_example():
    """The seed: an identity-activation MLPRegressor on make_regression(n_features=2, bias=2), in ONNX."""
    from sklearn.datasets import make_regression
    from sklearn.neural_network import MLPRegressor

    X, y = make_regression(n_features=2, bias=2, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.float32)
    mlp = MLPRegressor(hidden_layer_sizes=(), activation="identity", max_iter=200, batch_size=10, solver="sgd",
                       alpha=0, learning_rate_init=1e-2, n_iter_no_change=1000, momentum=0,
                       nesterovs_momentum=False, random_state=0, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp.fit(X, y)
    return X, y, mlp, skl2onnx.to_onnx(mlp, X[:1], target_opset=15)


def _zero_weights(onx):
    from onnx import ModelProto, numpy_helper

    out = ModelProto()
    out.CopyFrom(onx)
    for init in out.graph.initializer:
        if init.name in ("coefficient", "intercepts"):
            init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    return out


def test_seed_example_trains_to_sklearn_coefficients(seed_example):
    X, y, mlp, onx = seed_example
    onx = _zero_weights(onx)  # the converted model carries the fitted weights: start from scratch instead
    reg = OnnxRegressor(onx, learning_rate="constant", eta0=1e-2, batch_size=10, max_iter=200, penalty=None)
    reg.fit(X, y)
    w = reg.trainer_.get_weights()
    assert reg.trainer_.weight_names == ["coefficient", "intercepts"]  # shape_tensor is not a weight
    np.testing.assert_allclose(w["coefficient"].ravel(), mlp.coefs_[0].ravel(), rtol=1e-3)
    np.testing.assert_allclose(w["intercepts"].ravel(), mlp.intercepts_[0], rtol=1e-2)
    assert reg.loss_curve_[-1] < 1e-3 * reg.loss_curve_[0]


def test_seed_example_forward_backward_equals_fused(seed_example):
    X, y, _, onx = seed_example
    a = OnnxRegressor(onx, batch_size=10, max_iter=3, step="fused").fit(X, y)
    b = OnnxRegressor(onx, batch_size=10, max_iter=3, step="forward_backward").fit(X, y)
    np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=1e-5, atol=1e-4)  # outputs up to ~250: float32 noise


def test_to_onnx_predictions_equal_estimator(seed_example):
    X, y, _, onx = seed_example
    reg = OnnxRegressor(onx, max_iter=2).fit(X, y)
    sess = ort.InferenceSession(reg.to_onnx().SerializeToString())
    np.testing.assert_allclose(sess.run(None, {"X": X})[0].ravel(), reg.predict(X), rtol=1e-5, atol=1e-5)


def test_clone_get_set_params():
    from sklearn.base import clone

    reg = OnnxRegressor(linear_model(3), eta0=0.1, optimizer="adam")
    params = reg.get_params()
    assert params["eta0"] == 0.1 and params["optimizer"] == "adam" and "step" in params
    twin = clone(reg).set_params(eta0=0.2)
    assert twin.eta0 == 0.2 and not hasattr(twin, "trainer_")


def test_partial_fit_equals_fit_one_epoch_and_accepts_arrow():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 3)).astype(np.float32)
    y = (X @ np.array([1.0, 2.0, -1.0]) + 0.5).astype(np.float32)
    fit = OnnxRegressor(linear_model(3), max_iter=1, batch_size=16).fit(X, y)
    table = pa.table({f"x{i}": X[:, i] for i in range(3)})
    part = OnnxRegressor(linear_model(3), batch_size=16)
    part.partial_fit(table.slice(0, 48), pa.array(y[:48]))
    part.partial_fit(pa.record_batch([pa.FixedSizeListArray.from_arrays(pa.array(X[48:].ravel()), 3)], ["x"]),
                     y[48:])
    np.testing.assert_allclose(part.predict(X), fit.predict(X), rtol=1e-6)
    with pytest.raises(BadInputError, match="column 'x1' has 1 null"):
        part.partial_fit(pa.table({"x0": [1.0], "x1": pa.array([None], pa.float32()), "x2": [1.0]}), [0.0])
    with pytest.raises(BadInputError, match="column 'x0' is string, expected float32"):
        part.partial_fit(pa.table({"x0": ["a"], "x1": [1.0], "x2": [1.0]}), [0.0])
    with pytest.raises(BadInputError, match="X has 2 features, but OnnxRegressor is expecting 3"):
        part.partial_fit(X[:, :2], y)


def test_binary_classifier_matches_sklearn_logistic_regression_accuracy():
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    X, y = make_classification(600, n_features=5, random_state=0)
    X = X.astype(np.float32)
    clf = OnnxClassifier(linear_model(5), learning_rate="constant", eta0=0.1, max_iter=20, penalty=None).fit(X, y)
    ref = LogisticRegression().fit(X, y)
    assert clf.score(X, y) >= ref.score(X, y) - 0.02
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert np.array_equal(clf.predict(X), clf.classes_[proba.argmax(axis=1)])


def test_multiclass_classifier_with_partial_fit_and_classes():
    from sklearn.datasets import make_blobs

    X, y = make_blobs(900, n_features=4, centers=3, random_state=1)
    X = X.astype(np.float32)
    names = np.array(["a", "b", "c"])[y]
    clf = OnnxClassifier(mlp_model([4, 16, 3], seed=0), optimizer="adam", learning_rate="constant", eta0=0.01)
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        clf.partial_fit(X[:10], names[:10])
    for i in range(0, 900, 90):
        clf.partial_fit(X[i:i + 90], names[i:i + 90], classes=["a", "b", "c"])
    assert clf.score(X, names) > 0.95
    with pytest.raises(BadInputError, match=r"labels \['z'\] are not in classes_"):
        clf.partial_fit(X[:1], ["z"])
    with pytest.raises(ValueError, match="outputs 3 scores but 2 classes"):
        OnnxClassifier(mlp_model([4, 16, 3])).fit(X[:20], np.arange(20) % 2)


def test_unfitted_estimator_says_so():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        OnnxRegressor(linear_model(2)).predict(np.zeros((1, 2), np.float32))


def test_schedule_object_parameter_is_not_mutated_and_refits_agree():
    from streamfit.schedules import InvScaling

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3)).astype(np.float32)
    y = X.sum(axis=1)
    schedule = InvScaling(0.1)
    est = OnnxRegressor(linear_model(3, seed=0), learning_rate=schedule, batch_size=4, max_iter=2)
    first = est.fit(X, y).predict(X)
    assert schedule.t == 0 and est.trainer_.schedule.t == 20
    np.testing.assert_array_equal(est.fit(X, y).predict(X), first)


@pytest.mark.parametrize("classes", [[0, 1], [0, 1, 2], [1, 2], [0, 2, 5]])
def test_integer_labels_encode_as_their_class_index_and_an_unknown_one_is_refused(classes):
    """Classes 0..k-1 take a shortcut (a label is its own index): it gives searchsorted's indices, and labels out of
    range, negative ones, or ones between other integer classes are refused naming them."""
    from streamfit import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 3)).astype(np.float32)
    y = np.array(classes)[rng.integers(0, len(classes), 64)]
    clf = LogisticRegression().partial_fit(X, y, classes=classes)
    for dtype in (np.int64, np.int32, np.uint8):
        got = clf._encode(y.astype(dtype))
        assert got.dtype == (clf.trainer_.dtype if len(classes) == 2 else np.int64)
        np.testing.assert_array_equal(got, np.searchsorted(classes, y))
    for bad in (-1, max(classes) + 1) + ((3,) if classes == [0, 2, 5] else ()):
        labels = y.copy()
        labels[7] = bad
        with pytest.raises(BadInputError, match=rf"labels \[{bad}\] are not in classes_"):
            clf.partial_fit(X, labels)
