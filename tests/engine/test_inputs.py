"""Several model inputs, each of its declared dtype and shape: two-input (floats + int64 ids), CNN, int32/bool;
both step strategies, gradients against numpy, and every mismatch of data and model refused clearly."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamfit import InputMismatchError, ModelError, OnnxClassifier, OnnxRegressor
from streamfit._engine.prepare.model import ModelInput
from streamfit._engine.testing import cnn_model, flags_model, linear_model, two_input_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import BadInputError
from tests.engine.helpers import finite_difference


def _batch(n, rng, vocab=10, d=3, dtype=np.float32):
    x = rng.standard_normal((n, d)).astype(dtype)
    ids = rng.integers(0, vocab, n)
    y = (x[:, 0] - 0.5 * x[:, 1] + np.cos(ids)).astype(dtype)
    return {"x": x, "ids": ids}, y


def _numpy_two_input(w, X):
    h = np.concatenate([X["x"], w["E"][X["ids"]]], axis=1)
    return h @ w["W"] + w["B"]


def test_model_inputs_are_declared_types_and_shapes():
    trainer = Trainer(flags_model(3, 5))
    assert trainer.model_inputs == (ModelInput("x", np.dtype(np.float32), ("N", 3)),
                                    ModelInput("code", np.dtype(np.int32), ("N",)),
                                    ModelInput("flag", np.dtype(np.bool_), ("N", 1)))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("batch", [8, 128])  # 128 runs the large-batch graph
def test_two_inputs_fused_equals_forward_backward(optimizer, batch):
    rng = np.random.default_rng(0)
    batches = [_batch(batch, rng) for _ in range(6)] + [_batch(5, rng)]  # a short last batch too
    runs = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(two_input_model(3, 10, seed=1), step=step, optimizer=optimizer, learning_rate=0.05)
        losses = [trainer.step(X, y) for X, y in batches]
        runs[step] = trainer.get_weights(), losses, trainer.predict(batches[0][0])
    for name, w in runs["fused"][0].items():
        np.testing.assert_allclose(w, runs["forward_backward"][0][name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(runs["fused"][1], runs["forward_backward"][1], rtol=1e-4)
    np.testing.assert_allclose(runs["fused"][2], runs["forward_backward"][2], rtol=1e-4, atol=1e-6)
    assert runs["fused"][1][-2] < runs["fused"][1][0]  # it learns


def test_two_inputs_gradients_match_finite_differences():
    """dL/dW of the embedding table (repeated ids accumulate) and the dense weights, float64."""
    rng = np.random.default_rng(3)
    model = two_input_model(3, 6, dim=2, dtype=np.float64, seed=2)
    trainer = Trainer(model, step="forward_backward", learning_rate=0.1)
    X = {"x": rng.standard_normal((9, 3)), "ids": np.array([0, 1, 1, 5, 2, 1, 0, 5, 3])}
    y = rng.standard_normal(9)
    out = trainer.forward(X)
    w = trainer.get_weights()
    np.testing.assert_allclose(out, _numpy_two_input(w, X), rtol=1e-12)
    grads = trainer.backward((out.ravel() - y)[:, None] / len(y))

    def loss():
        r = _numpy_two_input(w, X).ravel() - y
        return 0.5 * float(np.mean(r * r))

    for name in ("E", "W", "B"):
        np.testing.assert_allclose(grads[name], finite_difference(loss, w[name]), rtol=1e-6, atol=1e-9, err_msg=name)
    assert np.all(grads["E"][4] == 0)  # an id not in the batch gets no gradient


@pytest.mark.parametrize("batch", [4, 64])
def test_fused_sgd_step_is_numpy_sgd_on_two_inputs(batch):
    rng = np.random.default_rng(4)
    trainer = Trainer(two_input_model(3, 6, dim=2, dtype=np.float64, seed=2), learning_rate=0.2, optimizer="sgd")
    X, y = _batch(batch, rng, vocab=6, dtype=np.float64)
    w = trainer.get_weights()
    trainer.step(X, y)
    r = (_numpy_two_input(w, X).ravel() - y) / batch
    h = np.concatenate([X["x"], w["E"][X["ids"]]], axis=1)
    gW = h.T @ r[:, None]
    gE = np.zeros_like(w["E"])
    np.add.at(gE, X["ids"], r[:, None] * w["W"][3:, 0])
    new = trainer.get_weights()
    np.testing.assert_allclose(new["W"], w["W"] - 0.2 * gW, rtol=1e-10)
    np.testing.assert_allclose(new["B"], w["B"] - 0.2 * r.sum(), rtol=1e-10)
    np.testing.assert_allclose(new["E"], w["E"] - 0.2 * gE, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_cnn_from_a_4d_array(step):
    rng = np.random.default_rng(5)
    trainer = Trainer(cnn_model(channels=1, size=8), step=step, optimizer="adam", learning_rate=0.01)
    assert trainer.model_inputs[0].shape == ("N", 1, 8, 8)
    losses = []
    for _ in range(60):
        X = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
        losses.append(trainer.step(X, X[:, 0, 2:5, 2:5].mean(axis=(1, 2))))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert trainer.predict(X).shape == (16, 1)


def test_cnn_strategies_agree():
    rng = np.random.default_rng(6)
    batches = [rng.standard_normal((n, 1, 8, 8)).astype(np.float32) for n in (8, 8, 70)]
    weights = []
    for step in ("fused", "forward_backward"):
        trainer = Trainer(cnn_model(), step=step, learning_rate=0.01)
        for X in batches:
            trainer.step(X, X.mean(axis=(1, 2, 3)))
        weights.append(trainer.get_weights())
    for name in weights[0]:
        np.testing.assert_allclose(weights[0][name], weights[1][name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_int32_and_bool_inputs_keep_their_types(step):
    rng = np.random.default_rng(7)
    trainer = Trainer(flags_model(2, 4), step=step, learning_rate=0.1)
    target = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
    for _ in range(300):
        x = rng.standard_normal((16, 2)).astype(np.float32)
        code = rng.integers(0, 4, 16).astype(np.int32)
        flag = rng.random((16, 1)) > 0.5
        trainer.step({"x": x, "code": code, "flag": flag}, x[:, 0] + target[code] + 3.0 * flag[:, 0])
    w = trainer.get_weights()
    np.testing.assert_allclose(w["F"], [3.0], atol=0.05)
    np.testing.assert_allclose(w["E"].ravel(), target, atol=0.05)
    np.testing.assert_allclose(w["W"].ravel(), [1.0, 0.0], atol=0.05)


# -- mismatches: each a clear error naming the input and what the model expects ---------------------------
def _ids_model(id_shape=("N",), x_shape=("N", 3)):
    model = two_input_model(3, 10)
    for vi in model.graph.input:
        shape = id_shape if vi.name == "ids" else x_shape
        del vi.type.tensor_type.shape.dim[:]
        for d in shape:
            dim = vi.type.tensor_type.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            else:
                dim.dim_param = d
    return model


_X = np.zeros((4, 3), np.float32)
_IDS = np.zeros(4, np.int64)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
@pytest.mark.parametrize("X, message", [
    ({"x": _X, "ids": _IDS, "extra": _IDS}, r"X names \['extra'\], which are not inputs of the model; its inputs are "
                                            r"'x' \(float32, shape \[N, 3\]\), 'ids' \(int64, shape \[N\]\)"),
    ({"x": _X}, r"X has no array for the model input\(s\) \['ids'\]"),
    (_X, r"the model has 2 inputs 'x' .*: pass X as a dict"),
    ({"x": _X, "ids": _IDS.astype(np.float32)}, r"input 'ids' \(int64, shape \[N\]\) got float32 data; expected int64 "
                                                r"\(integers or bool\)"),
    ({"x": _X.astype(str), "ids": _IDS}, r"input 'x' \(float32, shape \[N, 3\]\) got <U32 data; expected float32"),
    ({"x": _X, "ids": _IDS[:, None]}, r"input 'ids' \(int64, shape \[N\]\) got an array of rank 2 \(shape \[4, 1\]\); "
                                      r"expected rank 1"),
    ({"x": _X[:, :2], "ids": _IDS}, r"input 'x' \(float32, shape \[N, 3\]\) got shape \[4, 2\]; dim 1 must be 3"),
    ({"x": _X, "ids": _IDS[:3]}, r"input 'ids' has 3 rows but input 'x' has 4"),
])
def test_mismatches_name_the_input(step, X, message):
    trainer = Trainer(two_input_model(3, 10), step=step)
    for call in (lambda: trainer.step(X, np.zeros(4, np.float32)), lambda: trainer.predict(X)):
        with pytest.raises(InputMismatchError, match=message) as info:
            call()
        assert isinstance(info.value, ModelError) and isinstance(info.value, BadInputError)
    if step == "forward_backward":
        with pytest.raises(InputMismatchError, match=message):
            trainer.forward(X)
    assert trainer.step({"x": _X, "ids": _IDS}, np.zeros(4, np.float32)) >= 0  # the trainer is still usable


def test_fixed_batch_dim_and_bool_input_mismatches():
    trainer = Trainer(_ids_model(id_shape=(4,), x_shape=(4, 3)))
    with pytest.raises(InputMismatchError, match=r"input 'x' \(float32, shape \[4, 3\]\) got shape \[2, 3\]; "
                                                 r"the batch dim \(the model was exported for that batch size\) must be 4"):
        trainer.step({"x": _X[:2], "ids": _IDS[:2]}, np.zeros(2, np.float32))
    trainer.step({"x": _X, "ids": _IDS}, np.zeros(4, np.float32))  # its own batch size works
    flags = Trainer(flags_model(2, 4))
    with pytest.raises(InputMismatchError, match=r"input 'flag' \(bool, shape \[N, 1\]\) got int64 data; expected bool"):
        flags.step({"x": np.zeros((2, 2), np.float32), "code": np.zeros(2, np.int32), "flag": np.ones((2, 1), int)},
                   np.zeros(2, np.float32))


def test_empty_batch_is_a_bad_input():
    trainer = Trainer(two_input_model(3, 10))
    with pytest.raises(BadInputError, match="non-empty batch") as info:
        trainer.step({"x": _X[:0], "ids": _IDS[:0]}, np.zeros(0, np.float32))
    assert info.value.reason == "empty_batch"


def test_string_input_is_refused_at_build():
    model = two_input_model(3, 10)
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.STRING
    with pytest.raises(ModelError, match="input 'ids' is string; streamfit feeds numeric and bool inputs"):
        Trainer(model)


# -- estimators ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_regressor_on_a_dict_of_inputs(step):
    rng = np.random.default_rng(8)
    X, y = _batch(600, rng)
    reg = OnnxRegressor(two_input_model(3, 10), optimizer="adam", learning_rate="constant", eta0=0.02,
                        batch_size=32, max_iter=15, shuffle=True, random_state=0, step=step)
    assert reg.fit(X, y).score(X, y) > 0.95
    pred = reg.predict(X)
    assert pred.shape == (600,)
    session = ort.InferenceSession(reg.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, X)[0].ravel(), pred, rtol=1e-5, atol=1e-6)
    out = reg.partial_fit_predict({k: v[:40] for k, v in X.items()}, y[:40])
    assert out.shape == (40,)


def test_regressor_dict_mismatch_is_a_model_error():
    reg = OnnxRegressor(two_input_model(3, 10))
    with pytest.raises(ModelError, match=r"input 'ids' \(int64, shape \[N\]\) got float64 data"):
        reg.partial_fit({"x": _X, "ids": np.zeros(4)}, np.zeros(4))


def test_inputs_mapping_names_are_checked_when_built():
    with pytest.raises(ModelError, match=r"inputs= maps 'idz', which is not an input of the model; its inputs are "
                                         r"'x' \(float32, shape \[N, 3\]\), 'ids' \(int64, shape \[N\]\)"):
        OnnxRegressor(two_input_model(3, 10), inputs={"idz": "user"}).partial_fit({"x": _X, "ids": _IDS}, np.zeros(4))
    with pytest.raises(ModelError, match=r"a list must hold one or more column names"):
        OnnxRegressor(two_input_model(3, 10), inputs={"x": []}).partial_fit({"x": _X, "ids": _IDS}, np.zeros(4))


def test_classifier_on_a_dict_of_inputs():
    rng = np.random.default_rng(9)
    X, _ = _batch(400, rng)
    labels = np.where(X["x"][:, 0] + (X["ids"] % 2) > 0.5, "yes", "no")
    clf = OnnxClassifier(two_input_model(3, 10), learning_rate="constant", eta0=0.2, max_iter=20)
    clf.partial_fit({k: v[:10] for k, v in X.items()}, labels[:10], classes=["no", "yes"])
    clf.fit(X, labels)
    assert clf.score(X, labels) > 0.9
    assert clf.predict_proba(X).shape == (400, 2)


def test_multi_output_regression_labels():
    rng = np.random.default_rng(10)
    X, _ = _batch(500, rng)
    Y = np.stack([X["x"][:, 0], X["x"][:, 1] - X["x"][:, 2], np.sin(X["ids"])], axis=1).astype(np.float32)
    reg = OnnxRegressor(two_input_model(3, 10, n_outputs=3), optimizer="adam", learning_rate="constant",
                        eta0=0.02, max_iter=20)
    reg.fit(X, Y)
    assert reg.predict(X).shape == (500, 3)
    assert reg.score(X, Y) > 0.95
    with pytest.raises(BadInputError, match=r"do not fit the model output \(N, \*\(3,\)\)"):
        reg.partial_fit({k: v[:4] for k, v in X.items()}, Y[:4, :2])
    again = OnnxRegressor(two_input_model(3, 10, n_outputs=3), optimizer="adam", learning_rate="constant", eta0=0.02)
    again.load_state_dict(reg.state_dict())
    np.testing.assert_allclose(again.predict(X), reg.predict(X))


def _two_output_model():
    model = linear_model(2, seed=0)
    model.graph.node.append(helper.make_node("Neg", ["Y"], ["Z"]))
    model.graph.output.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 1]))
    return model


def test_output_name_and_input_name_on_estimators():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((300, 2)).astype(np.float32)
    y = X[:, 0] - X[:, 1]
    reg = OnnxRegressor(_two_output_model(), output_name="Z", input_name="X", learning_rate="constant", eta0=0.1,
                        max_iter=10).fit(X, y)
    assert reg.score(X, y) > 0.99
    assert [o.name for o in reg.to_onnx().graph.output] == ["Z"]
    with pytest.raises(ModelError, match="unknown output 'Q'"):
        OnnxRegressor(_two_output_model(), output_name="Q").fit(X, y)
    with pytest.raises(ModelError, match="unknown input 'x'"):
        OnnxRegressor(_two_output_model(), input_name="x").fit(X, y)


# -- the batch-1 paths: bindings made once, one validation pass ----------------------------------------------
@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_predict_bindings_follow_the_live_weights(step):
    """Predictions through the bound buffers read whichever ping-pong set is live, after steps, a skipped step
    and set_weights; large batches (unbound) agree with small ones."""
    rng = np.random.default_rng(12)
    trainer = Trainer(two_input_model(3, 10, seed=3), step=step, learning_rate=0.1, on_nonfinite="skip")
    X, y = _batch(100, rng)
    one = {k: v[:1] for k, v in X.items()}
    for i in range(5):
        w = trainer.get_weights()
        np.testing.assert_allclose(trainer.predict(one), _numpy_two_input(w, one), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(trainer.predict(X)[:1], trainer.predict(one), rtol=1e-5, atol=1e-6)
        out = trainer.predict(one)
        out += 1.0  # a returned prediction is the caller's: the next one is unaffected
        trainer.step({k: v[i:i + 1] for k, v in X.items()}, y[i:i + 1])
    bad = {"x": np.full((1, 3), np.nan, np.float32), "ids": X["ids"][:1]}
    before = trainer.predict(one)
    trainer.step(bad, y[:1])  # not finite: skipped, the live set unchanged
    np.testing.assert_array_equal(trainer.predict(one), before)
    trainer.set_weights({"B": np.array([5.0], np.float32)})
    np.testing.assert_allclose(trainer.predict(one), _numpy_two_input(trainer.get_weights(), one), rtol=1e-5)


def test_one_validation_pass_per_call(monkeypatch):
    """A ready-made estimator's partial_fit/predict check X, y and the sample weights once each."""
    import streamfit._arrow
    import streamfit.models._base as base
    import streamfit.models._validation as validation
    from streamfit import LogisticRegression

    rng = np.random.default_rng(13)
    X = rng.standard_normal((40, 4))
    y = X[:, 0] > 0
    clf = LogisticRegression().fit(X, y)
    calls: dict[str, int] = {}

    def counted(name, f):
        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return f(*args, **kwargs)
        return wrapper

    for module, name in ((base, "check_features"), (base, "check_labels"), (base, "check_sample_weight"),
                         (validation, "as_labels"), (streamfit.estimators.classifier, "as_labels"),
                         (streamfit.estimators._base, "as_labels"), (streamfit.estimators._base, "as_features")):
        monkeypatch.setattr(module, name, counted(f"{module.__name__}.{name}", getattr(module, name)))
    clf.partial_fit(X[:1], y[:1], sample_weight=[2.0])
    assert calls == {"streamfit.models._base.check_features": 1, "streamfit.models._base.check_labels": 1,
                     "streamfit.models._base.check_sample_weight": 1, "streamfit.models._validation.as_labels": 2}
    calls.clear()
    clf.predict(X[:1])  # a (1, n) float row after a one-row partial_fit: the one-row path's own check only
    assert calls == {}
    clf.predict(X[:1].tolist())
    assert calls == {"streamfit.models._base.check_features": 1}


def test_one_row_label_encoding_and_unknown_labels():
    from streamfit import LogisticRegression

    X = np.random.default_rng(14).standard_normal((4, 2))
    clf = LogisticRegression().partial_fit(X, np.array(["a", "b", "a", "b"]), classes=["a", "b"])
    for label in ("a", "b", "a"):
        clf.partial_fit(X[:1], np.array([label]))
    assert clf._encode(np.array(["b"])).tolist() == [1.0]
    with pytest.raises(BadInputError, match=r"labels \['z'\] are not in classes_ \['a', 'b'\]"):
        clf.partial_fit(X[:1], np.array(["z"]))
    with pytest.raises(BadInputError, match=r"labels \['z'\] are not in classes_"):
        clf.partial_fit(X[:1], np.array(["z"]))  # the second time too (unknown labels are not remembered)


def test_one_row_scaler_updates_equal_the_two_pass_statistics():
    from streamfit.models.scaler import RunningScaler

    rng = np.random.default_rng(15)
    X = (rng.standard_normal((300, 5)) * [1, 10, 1e-3, 1, 0] + [0, 5, 1, -3, 7]).astype(np.float32)
    one, batched = RunningScaler(5), RunningScaler(5)
    for row in X:
        one.update(row[None])
    for i in range(0, 300, 64):
        batched.update(X[i:i + 64])
    np.testing.assert_allclose(one.mean_, X.astype(np.float64).mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(one.var_, X.astype(np.float64).var(axis=0), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(one.scale_, batched.scale_, rtol=1e-9)
    assert one.scale_[4] == 1.0  # a constant feature
    expected = (X[:3] - one.mean_.astype(np.float32)) / one.scale_.astype(np.float32)
    np.testing.assert_array_equal(one.transform(X[:3]), expected)
