"""LinearRegressor/LogisticRegression(categorical=...): hashed one-hot (VW-style) beside dense columns, the same
weights as an explicit one-hot model, FTRL as McMahan's per-coordinate formulas, export on the raw columns."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pytest

from streamfit import LinearRegressor, LogisticRegression
from streamfit.features import Hashed
from streamfit.optim import FTRL
from streamfit.testing import ClickStream

BUCKETS = 64


def _stream(strings=False):
    return ClickStream(seed=5, n_categorical=4, n_dense=2, cardinalities=(5, 30, 200, 2000), strings=strings)


def _one_hot(stream, batch):
    """The explicit one-hot matrix of the hashed values (a count where two fields share a bucket) and the dense
    columns beside: what the hashed model computes with one Gather per field."""
    enc = Hashed(stream.categorical, BUCKETS)
    ids = enc.encode(enc.new_state(), [batch.column(c) for c in stream.categorical])
    X = np.zeros((batch.num_rows, BUCKETS + stream.n_dense), np.float32)
    np.add.at(X, (np.repeat(np.arange(batch.num_rows), ids.shape[1]), ids.ravel()), 1.0)
    X[:, BUCKETS:] = np.column_stack([batch.column(c).to_numpy() for c in stream.dense])
    return X


def _split(weights):
    return np.concatenate([weights["linear"], weights["dense_linear"]]), weights["bias"].ravel()


@pytest.mark.parametrize("optimizer,eta0", [("sgd", 0.2), ("adagrad", 0.1), (FTRL(beta=1.0, l1=0.5, l2=0.1), 0.1)],
                         ids=["sgd", "adagrad", "ftrl"])
def test_hashed_logistic_regression_is_the_explicit_one_hot_model(optimizer, eta0):
    stream = _stream()
    kw = dict(optimizer=optimizer, eta0=eta0, penalty=None, batch_size=50, random_state=0)
    hashed = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=BUCKETS, **kw)
    reference = LogisticRegression(standardize=False, **kw)
    for k in range(12):
        batch = stream.batch(k, 100)
        y = batch.column("label").to_numpy()
        hashed.partial_fit(batch, y, classes=[0, 1])
        reference.partial_fit(_one_hot(stream, batch), y, classes=[0, 1])
    assert hashed.trainer_._sparse is not None and list(hashed.trainer_._sparse.arrays) == ["linear"]
    coef, bias = _split(hashed.trainer_.get_weights())
    np.testing.assert_allclose(coef.ravel(), reference.coef_.ravel(), rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(bias, reference.intercept_, rtol=2e-4, atol=2e-6)
    test = stream.batch(50, 300)
    np.testing.assert_allclose(hashed.predict_proba(test), reference.predict_proba(_one_hot(stream, test)),
                               rtol=1e-4, atol=1e-6)


def test_hashed_linear_regressor_is_the_explicit_one_hot_model():
    stream = _stream()
    kw = dict(optimizer="adagrad", eta0=0.1, penalty=None, batch_size=40, random_state=0)
    hashed = LinearRegressor(categorical=stream.categorical, dense=stream.dense, buckets=BUCKETS, **kw)
    reference = LinearRegressor(standardize=False, **kw)  # both standardize the target
    for k in range(10):
        batch = stream.batch(k, 80)
        y = 3.0 + 2.0 * batch.column("d0").to_numpy() + batch.column("label").to_numpy()
        hashed.partial_fit(batch, y)
        reference.partial_fit(_one_hot(stream, batch), y)
    test = stream.batch(60, 200)
    np.testing.assert_allclose(hashed.predict(test), reference.predict(_one_hot(stream, test)), rtol=1e-4, atol=1e-5)
    coef, bias = _split(hashed.trainer_.get_weights())
    (ref_coef, ref_bias), = reference._layers()  # in standardized target units, as trained
    np.testing.assert_allclose(coef, ref_coef, rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(bias, ref_bias, rtol=2e-4, atol=2e-6)


def _mcmahan(phis, ys, alpha, beta, l1, l2):
    """Algorithm 1 of McMahan et al. (2013) per coordinate in float64 on explicit feature vectors (one-hot,
    dense, 1 for the bias); a batch's gradient is the sum of its rows' (each row one example)."""
    d = phis[0].shape[1]
    z, n = np.zeros(d), np.zeros(d)

    def weights():
        w = -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) / alpha + l2)
        return np.where(np.abs(z) <= l1, 0.0, w)

    for phi, y in zip(phis, ys):
        w = weights()
        p = 1.0 / (1.0 + np.exp(-(phi @ w)))
        g = phi.T @ (p - y)
        sigma = (np.sqrt(n + g * g) - np.sqrt(n)) / alpha
        z += g - sigma * w
        n += g * g
    return weights(), z, n


def test_ftrl_on_the_hashed_model_is_mcmahans_per_coordinate_rule():
    stream = _stream(strings=True)
    alpha, beta, l1, l2 = 0.2, 0.5, 1.0, 0.3
    clf = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=BUCKETS,
                             optimizer=FTRL(beta=beta, l1=l1, l2=l2), eta0=alpha, penalty=None, batch_size=64)
    phis, ys = [], []
    for k in range(15):
        batch = stream.batch(k, 64)
        y = batch.column("label").to_numpy()
        clf.partial_fit(batch, y, classes=[0, 1])
        phis.append(np.column_stack([_one_hot(stream, batch).astype(np.float64), np.ones(64)]))
        ys.append(y.astype(np.float64))
    w_ref, z_ref, n_ref = _mcmahan(phis, ys, alpha, beta, l1, l2)
    got = clf.trainer_.get_weights()
    w = np.concatenate([got["linear"].ravel(), got["dense_linear"].ravel(), got["bias"].ravel()])
    np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=1e-6)
    assert ((w == 0.0) == (w_ref == 0.0)).all() and (w == 0.0).sum() > 5  # l1: the same exact zeros
    state = clf.trainer_.optimizer_state()
    for slot, ref in (("z", z_ref), ("n", n_ref)):
        got_slot = np.concatenate([state[f"linear__{slot}"].ravel(), state[f"dense_linear__{slot}"].ravel(),
                                   state[f"bias__{slot}"].ravel()])
        np.testing.assert_allclose(got_slot, ref, rtol=1e-4, atol=1e-5, err_msg=slot)


def _feeds(stream, table, names):
    return {c: np.asarray(table.column(c).to_pylist(), dtype=object if c.startswith("c") else np.float32)
            for c in names}


@pytest.mark.parametrize("classes", [[0, 1], ["a", "b", "c"]], ids=["binary", "multinomial"])
def test_logistic_to_onnx_takes_the_raw_columns(classes):
    stream = _stream(strings=True)
    clf = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=2 ** 10,
                             optimizer="adagrad", eta0=0.1)
    label = lambda b: (b.column("label").to_numpy() if len(classes) == 2 else  # noqa: E731
                       np.array(classes)[(np.array(b.column("c0").to_pylist(), dtype=int) + b.column("label").to_numpy()) % 3])
    for k in range(6):
        batch = stream.batch(k, 256)
        clf.partial_fit(batch, label(batch), classes=classes)
    test = stream.batch(40, 500)
    sess = ort.InferenceSession(clf.to_onnx().SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    assert sorted(names) == sorted(stream.categorical + stream.dense)
    scores = sess.run(None, _feeds(stream, test, names))[0]
    np.testing.assert_allclose(scores.reshape(len(test), -1), clf.decision_function(test).reshape(len(test), -1),
                               rtol=1e-5, atol=1e-6)
    assert clf.score(test, label(test)) > 0.6


def test_regressor_to_onnx_takes_the_raw_columns_and_maps_back_to_target_units():
    stream = _stream()
    reg = LinearRegressor(categorical=stream.categorical, dense=stream.dense, buckets=2 ** 10,
                          optimizer="ftrl", eta0=0.1)
    for k in range(6):
        batch = stream.batch(k, 256)
        reg.partial_fit(batch, 100.0 + 5.0 * batch.column("d1").to_numpy())
    test = stream.batch(40, 300)
    sess = ort.InferenceSession(reg.to_onnx().SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    feeds = {c: test.column(c).to_numpy() for c in names}  # integer categorical columns: int64
    np.testing.assert_allclose(sess.run(None, feeds)[0].ravel(), reg.predict(test), rtol=1e-5)
    assert abs(np.mean(reg.predict(test)) - 100.0) < 5.0


def test_params_clone_state_and_errors():
    from sklearn.base import clone

    stream = _stream()
    clf = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=256, optimizer="ftrl",
                             eta0=0.1)
    assert clone(clf).get_params() == clf.get_params()
    cols = {c: stream.batch(0, 100).column(c).to_pylist() for c in stream.categorical + stream.dense}
    y = stream.batch(0, 100).column("label").to_numpy()
    clf.partial_fit(cols, y, classes=[0, 1])  # a dict of columns
    copy = clone(clf)
    copy.load_state_dict(clf.state_dict())
    np.testing.assert_array_equal(copy.predict_proba(cols), clf.predict_proba(cols))
    with pytest.raises(AttributeError, match="keeps its weights in a hashed table"):
        clf.coef_
    with pytest.raises(TypeError, match="takes an Arrow Table/RecordBatch or a dict of columns"):
        clf.predict(np.zeros((2, 6)))
    with pytest.raises(ValueError, match=r"columns \['c0'\] are both categorical and dense"):
        LogisticRegression(categorical=["c0"], dense=["c0"]).partial_fit(pa.table({"c0": [1, 2]}), [0, 1],
                                                                         classes=[0, 1])
    with pytest.raises(ValueError, match="give the dense columns as dense=, not inputs="):
        LogisticRegression(categorical=["c0"], inputs={"X": ["d0"]}).partial_fit(
            pa.table({"c0": [1, 2], "d0": [0.5, 1.0]}), [0, 1], classes=[0, 1])
    with pytest.raises(ValueError, match="passive-aggressive"):
        LinearRegressor(categorical=["c0"], learning_rate="pa1").partial_fit(pa.table({"c0": [1, 2]}), [0.0, 1.0])
    odd = LinearRegressor(categorical=5)  # a bad value: a repr and get_params still work, the fit says what is wrong
    assert "categorical=5" in repr(odd) and odd.get_params()["categorical"] == 5
    with pytest.raises(ValueError, match="categorical must be a list of column names"):
        odd.partial_fit(pa.table({"c0": [1, 2]}), [0.0, 1.0])
    plain = LogisticRegression()  # without categorical=: the dense model, as before
    plain.partial_fit(np.zeros((4, 2)), [0, 1, 0, 1], classes=[0, 1])
    assert plain.coef_.shape == (1, 2) and plain.trainer_._sparse is None
