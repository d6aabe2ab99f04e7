"""scikit-learn's ai.onnx.ml operators become trainable standard ops; skl2onnx graphs train through OnnxRegressor
and OnnxClassifier, predicting what onnxruntime predicts with the original graph before training."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamfit import OnnxClassifier, OnnxRegressor, Trainer
from streamfit.exceptions import ModelError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((40, 3)).astype(np.float32)


def _ml_model(node, out_type=TensorProto.FLOAT, outputs=("S",)):
    outs = [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "L" else out_type, None) for o in outputs]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])], outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                             ir_version=8)


def _ort(model, name):
    sess = ort.InferenceSession(model.SerializeToString())
    return sess.run([name], {"X": X})[0]


CLASSIFIERS = [(rows, transform) for rows in (1, 2, 4) for transform in ("NONE", "LOGISTIC", "SOFTMAX")]


@pytest.mark.parametrize(("rows", "transform"), CLASSIFIERS, ids=[f"{r}rows-{t}" for r, t in CLASSIFIERS])
def test_linear_classifier_rewrite_predicts_what_onnxruntime_predicts(rows, transform):
    n_classes = 2 if rows <= 2 else rows
    node = helper.make_node("LinearClassifier", ["X"], ["L", "S"], domain="ai.onnx.ml",
                            coefficients=RNG.standard_normal(rows * 3).tolist(),
                            intercepts=RNG.standard_normal(rows).tolist(), classlabels_ints=list(range(n_classes)),
                            post_transform=transform)
    model = _ml_model(node, outputs=("L", "S"))
    trainer = Trainer(model, output_name="S", loss="squared_error")
    assert trainer.weight_names == ["LinearClassifier_coef", "LinearClassifier_intercept"] or \
        all(w.endswith(("_coef", "_intercept")) for w in trainer.weight_names)
    # onnxruntime's one-row binary case is [1 - s, s] on the raw score s: the rewrite keeps it
    np.testing.assert_allclose(trainer.predict(X), _ort(model, "S"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("targets", [1, 2])
def test_linear_regressor_rewrite_predicts_and_trains(targets):
    node = helper.make_node("LinearRegressor", ["X"], ["S"], domain="ai.onnx.ml", targets=targets,
                            coefficients=RNG.standard_normal(3 * targets).tolist(),
                            intercepts=RNG.standard_normal(targets).tolist())
    model = _ml_model(node)
    trainer = Trainer(model, loss="squared_error", learning_rate=0.1)
    np.testing.assert_allclose(trainer.predict(X), _ort(model, "S"), rtol=1e-5, atol=1e-6)
    T = (X @ np.ones((3, targets), np.float32)).reshape(len(X), targets)
    first = trainer.step(X, T)
    for _ in range(50):
        last = trainer.step(X, T)
    assert last < 0.01 * first


@pytest.mark.parametrize("norm", ["L1", "L2", "MAX"])
def test_normalizer_and_scaler_rewrites(norm):
    nodes = [helper.make_node("Scaler", ["X"], ["Z"], domain="ai.onnx.ml", offset=[0.5, -1.0, 2.0], scale=[2.0, 1.0, 0.5]),
             helper.make_node("Normalizer", ["Z"], ["S"], domain="ai.onnx.ml", norm=norm)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("S", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                              ir_version=8)
    from streamfit._engine.prepare.model import prepare_model

    with pytest.raises(ModelError, match="nothing to train"):  # scaler constants are not weights
        prepare_model(model)
    sess = ort.InferenceSession(model.SerializeToString())
    import copy

    from streamfit._engine.prepare.sklearn_ops import rewrite_ml_ops

    rewritten = copy.deepcopy(model)
    rewrite_ml_ops(rewritten, [])
    assert all(n.domain != "ai.onnx.ml" for n in rewritten.graph.node)
    np.testing.assert_allclose(ort.InferenceSession(rewritten.SerializeToString()).run(None, {"X": X})[0],
                               sess.run(None, {"X": X})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transform", ["PROBIT", "SOFTMAX_ZERO"])
def test_post_transforms_without_a_faithful_rewrite_are_refused(transform):
    node = helper.make_node("LinearClassifier", ["X"], ["L", "S"], domain="ai.onnx.ml", coefficients=[1.0] * 9,
                            intercepts=[0.0] * 3, classlabels_ints=[0, 1, 2], post_transform=transform)
    with pytest.raises(ModelError, match=f"post_transform={transform}.*NONE, LOGISTIC and SOFTMAX"):
        Trainer(_ml_model(node, outputs=("L", "S")), output_name="S")
    with pytest.raises(ModelError, match="label output 'L'.*has no gradient: train through its scores"):
        node2 = helper.make_node("LinearClassifier", ["X"], ["L", "S"], domain="ai.onnx.ml", coefficients=[1.0] * 9,
                                 intercepts=[0.0] * 3, classlabels_ints=[0, 1, 2])
        m = _ml_model(node2, outputs=("L", "S"))
        m.graph.node.append(helper.make_node("Cast", ["L"], ["Lf"], to=TensorProto.FLOAT))
        m.graph.output.append(helper.make_tensor_value_info("Lf", TensorProto.FLOAT, None))
        Trainer(m, output_name="Lf")


# -- skl2onnx graphs through the estimators ----------------------------------------------------------------
sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")
from sklearn import linear_model as sk_linear  # noqa: E402
from sklearn import neural_network as sk_nn  # noqa: E402
from sklearn import svm as sk_svm  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import MinMaxScaler, StandardScaler  # noqa: E402

COEF, COEF3 = RNG.standard_normal(5), RNG.standard_normal((5, 3))
X_OLD, X_NEW, X_TEST = (RNG.standard_normal((n, 5)).astype(np.float32) for n in (60, 3000, 1000))


def _target(X, kind):
    z = X @ COEF
    return {"reg": 10 * z + 3, "bin": (z > 0.2).astype(int), "multi": np.argmax(X @ COEF3, axis=1)}[kind]


def _convert(sk, task, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X_OLD, _target(X_OLD, task))
        return skl2onnx.to_onnx(sk, X_OLD[:1], options=options or None)


REGRESSORS = [sk_linear.Ridge(alpha=30.0), sk_linear.Lasso(alpha=1.0), sk_svm.LinearSVR(C=0.01),
              make_pipeline(MinMaxScaler(), sk_linear.Ridge(alpha=30.0)),
              make_pipeline(StandardScaler(), sk_linear.PassiveAggressiveRegressor(C=0.001, max_iter=2, tol=None))]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("sk", REGRESSORS, ids=lambda sk: "+".join(type(s).__name__ for _, s in getattr(sk, "steps", [(0, sk)])))
def test_skl2onnx_regressors_train(sk):
    """Weights in LinearRegressor attributes ("the model has nothing to train" before): trained now."""
    model = _convert(sk, "reg")
    reg = OnnxRegressor(model, optimizer="adam", learning_rate="constant", eta0=0.3, penalty=None, batch_size=20)
    reg.partial_fit(X_OLD[:1], _target(X_OLD[:1], "reg"), sample_weight=[0.0])  # builds it, changes nothing
    np.testing.assert_allclose(reg.predict(X_TEST).ravel(), sk.predict(X_TEST), rtol=1e-4, atol=1e-3)
    before = reg.score(X_TEST, _target(X_TEST, "reg"))
    for i in range(0, len(X_NEW), 20):
        reg.partial_fit(X_NEW[i:i + 20], _target(X_NEW[i:i + 20], "reg"))
    after = reg.score(X_TEST, _target(X_TEST, "reg"))
    assert after > min(before + 0.5, 0.98), (before, after)
    assert not any(n.domain == "ai.onnx.ml" for n in reg.to_onnx().graph.node)
    np.testing.assert_allclose(ort.InferenceSession(reg.to_onnx().SerializeToString()).run(None, {"X": X_TEST})[0]
                               .ravel(), reg.predict(X_TEST).ravel(), rtol=1e-5, atol=1e-4)


CLASSIFIERS_SK = [  # (estimator, task, skl2onnx options, loss or "auto", output kind)
    (sk_nn.MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0), "bin", {"zipmap": False}, "probabilities"),
    (sk_nn.MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0), "multi", {"zipmap": False},
     "probabilities"),
    (sk_linear.LogisticRegression(C=0.01), "bin", {"zipmap": False}, "probabilities"),
    (sk_linear.LogisticRegression(C=0.01), "multi", {}, "probabilities"),  # a ZipMap output: its tensor trains
    (sk_svm.LinearSVC(C=0.001), "bin", {}, "scores"),
    (sk_svm.LinearSVC(C=0.001), "multi", {}, "scores"),
]


@pytest.mark.parametrize(("sk", "task", "options", "kind"), CLASSIFIERS_SK,
                         ids=[f"{type(c[0]).__name__}-{c[1]}" for c in CLASSIFIERS_SK])
def test_skl2onnx_classifiers_train_through_probabilities_or_scores(sk, task, options, kind):
    """Output 0 is the label (no gradient): the classifier picks the probabilities/scores output and trains it."""
    model = _convert(sk, task, **options)
    loss = "hinge" if kind == "scores" else "auto"
    clf = OnnxClassifier(model, loss=loss, learning_rate="constant", eta0=0.1, penalty=None, batch_size=20)
    y_old = _target(X_OLD, task)
    clf.partial_fit(X_OLD[:1], y_old[:1], classes=np.unique(y_old), sample_weight=[0.0])
    assert clf.output_kind_ == kind
    assert np.array_equal(clf.predict(X_TEST), sk.predict(X_TEST))
    if kind == "probabilities":
        assert clf.loss_name_ == "probability_log_loss"
        np.testing.assert_allclose(clf.predict_proba(X_TEST), sk.predict_proba(X_TEST), rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_allclose(clf.decision_function(X_TEST), sk.decision_function(X_TEST), rtol=1e-4, atol=1e-5)
    before = clf.score(X_TEST, _target(X_TEST, task))
    y_new = _target(X_NEW, task)
    for i in range(0, len(X_NEW), 20):
        clf.partial_fit(X_NEW[i:i + 20], y_new[i:i + 20])
    after = clf.score(X_TEST, _target(X_TEST, task))
    assert after > before + 0.02 and after > 0.85, (before, after)


def test_skl2onnx_constants_are_not_trained():
    model = _convert(make_pipeline(MinMaxScaler(), sk_nn.MLPClassifier(hidden_layer_sizes=(4,), max_iter=5,
                                                                       random_state=0)), "bin", zipmap=False)
    clf = OnnxClassifier(model).partial_fit(X_OLD, _target(X_OLD, "bin"), classes=[0, 1])
    # 1 - p's "unity" and the MinMaxScaler's Mul/Add constants stay frozen: only the layers train
    assert sorted(clf.trainer_.weight_names) == ["coefficient", "coefficient1", "intercepts", "intercepts1"]
