"""Factorization machines and hashed linear models: the graph's math and gradients, sparse training from
Arrow columns, export that takes the raw columns."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pytest

from streamfit import FMClassifier, FMRegressor
from streamfit._engine.trainer import Trainer
from streamfit.models._fm_graph import fm_model
from streamfit.testing import ClickStream
from tests.engine.helpers import finite_difference


def _inputs(rng, n=5, fields=3, dense=2, buckets=7):
    return {"ids": rng.integers(0, buckets, (n, fields)), "x": rng.standard_normal((n, dense))}


def _numpy_fm(w, ids, x):
    """Rendle's definition, pair by pair: every (field, field) pair of the categorical and dense fields."""
    rows = []
    for r in range(len(ids)):
        vecs = [w["factors"][i] for i in ids[r]] + [x[r, j] * w["dense_factors"][j] for j in range(x.shape[1])]
        pair = sum(float(a @ b) for a, b in itertools.combinations(vecs, 2))
        rows.append(w["bias"][0, 0] + w["linear"][ids[r], 0].sum() + x[r] @ w["dense_linear"][:, 0] + pair)
    return np.array(rows)


@pytest.mark.needs_ort_training  # forward()/backward() run onnxruntime's TrainingAgent
def test_fm_graph_is_rendles_model_and_its_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    model = fm_model(3, 2, buckets=7, n_factors=4, rng=rng, init_scale=0.5, dtype=np.float64)
    trainer = Trainer(model, step="forward_backward", sparse=False)
    weights = {k: v + rng.standard_normal(v.shape) * 0.3 for k, v in trainer.get_weights().items()}
    trainer.set_weights(weights)
    X = _inputs(rng)
    X["ids"][0, 1] = X["ids"][0, 0]  # a duplicate id in a row
    np.testing.assert_allclose(trainer.predict(X).ravel(), _numpy_fm(weights, X["ids"], X["x"]), rtol=1e-10)
    trainer.forward(X)
    grads = trainer.backward(np.ones((5, 1)))
    for name in ("linear", "factors", "dense_linear", "dense_factors", "bias"):
        w = {k: v.copy() for k, v in weights.items()}

        def f():
            trainer.set_weights(w)
            return float(trainer.predict(X).sum())

        np.testing.assert_allclose(grads[name], finite_difference(f, w[name]), rtol=1e-6, atol=1e-8, err_msg=name)


def _stream(strings=False):
    return ClickStream(seed=3, n_categorical=5, n_dense=2, cardinalities=(5, 20, 100, 1000, 5000), strings=strings)


@pytest.mark.parametrize("optimizer,eta0,n_factors", [("adagrad", 0.05, 4), ("adam", 0.05, 4), ("ftrl", 0.5, 0)])
def test_fm_classifier_trains_its_tables_sparsely_and_exports_raw_columns(optimizer, eta0, n_factors):
    stream = _stream(strings=True)
    clf = FMClassifier(stream.categorical, dense=stream.dense, buckets=2 ** 12, n_factors=n_factors, random_state=0,
                       optimizer=optimizer, eta0=eta0)
    for k in range(15):
        batch = stream.batch(k, 256)
        clf.partial_fit(batch, batch.column("label").to_numpy(), classes=[0, 1])
    trainer = clf.trainer_
    tables = ["factors", "linear"] if n_factors else ["linear"]
    assert sorted(trainer._sparse.arrays) == tables
    assert trainer._train_pm.weights == ["bias", "dense_linear"] + (["dense_factors"] if n_factors else [])
    test = stream.batch(99, 3000)
    y = test.column("label").to_numpy()
    p = clf.predict_proba(test)[:, 1]
    assert clf.score(test, y) > 0.65 and np.mean((p - y) ** 2) < np.mean((y.mean() - y) ** 2)
    onnx_model = clf.to_onnx()
    sess = ort.InferenceSession(onnx_model.SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    assert sorted(names) == sorted(stream.categorical + stream.dense)  # the raw columns
    feeds = {c: np.asarray(test.column(c).to_pylist(), dtype=object if c.startswith("c") else np.float32)
             for c in names}
    logit = sess.run(None, feeds)[0].ravel()
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), p, rtol=1e-4, atol=1e-6)


def test_hashed_linear_model_and_regressor_and_state():
    stream = _stream()
    clf = FMClassifier(stream.categorical, buckets=2 ** 10, n_factors=0, optimizer="ftrl", eta0=0.1, random_state=0)
    table = stream.table(4000, batch_rows=1000)
    clf.fit(table, table.column("label").to_numpy())
    assert list(clf.trainer_.get_weights()) == ["bias", "linear"]
    copy = FMClassifier(stream.categorical, buckets=2 ** 10, n_factors=0, optimizer="ftrl", eta0=0.1)
    copy.load_state_dict(clf.state_dict())
    test = stream.batch(50, 500)
    np.testing.assert_array_equal(copy.predict_proba(test), clf.predict_proba(test))
    reg = FMRegressor(["c0", "c1"], dense=["d0"], buckets=64, n_factors=2, random_state=0, eta0=0.3)
    cols = {"c0": ["a", "b", "a", "c"] * 50, "c1": [1, 2, 3, 4] * 50, "d0": np.linspace(0, 1, 200)}
    y = np.array([1.0, 2.0, 1.0, 3.0] * 50) + np.linspace(0, 1, 200)
    for _ in range(30):
        reg.partial_fit(cols, y)  # a dict of columns
    assert np.mean((reg.predict(cols) - y) ** 2) < 0.2 * np.var(y)
    with pytest.raises(TypeError, match="takes an Arrow Table/RecordBatch or a dict of columns"):
        reg.predict(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="categorical must be a list of column names"):
        FMClassifier("c0").fit(pa.table({"c0": [1, 2]}), [0, 1])


def test_trains_from_parquet_files_as_partial_fit_does(tmp_path):
    import streamfit

    stream = _stream()
    stream.write_parquet(tmp_path, rows=6000, rows_per_file=2500, batch_rows=500)
    make = lambda: FMClassifier(stream.categorical, dense=stream.dense, buckets=2 ** 10, n_factors=3,  # noqa: E731
                                random_state=0, batch_size=1000)
    streamed = make()
    summary = streamfit.train_stream_sync(streamed, f"parquet:{tmp_path}", label="label", batch_size=1000,
                                          classes=[0, 1])
    assert summary.rows == 6000
    direct = make()
    table = stream.table(6000, batch_rows=500)
    for start in range(0, 6000, 1000):
        part = table.slice(start, 1000)
        direct.partial_fit(part, part.column("label").to_numpy(), classes=[0, 1])
    for k, v in direct.trainer_.get_weights().items():
        np.testing.assert_allclose(streamed.trainer_.get_weights()[k], v, rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("cls", [FMRegressor, FMClassifier])
def test_a_dict_of_columns_named_like_a_model_input_is_read_as_columns(cls):
    """A categorical column named 'x' (the dense input's name) in a dict of columns: the column plan decides
    what the dict holds (columns, not the model's inputs), not its keys."""
    rng = np.random.default_rng(0)
    cities = [str(c) for c in rng.choice(["a", "b", "c", "d"], 64)]
    y = rng.integers(0, 2, 64)
    by_dict = cls(categorical=["x"], buckets=64, n_factors=2, random_state=0)
    by_table = cls(categorical=["x"], buckets=64, n_factors=2, random_state=0)
    kw = {"classes": [0, 1]} if cls is FMClassifier else {}
    by_dict.partial_fit({"x": cities}, y, **kw)
    by_table.partial_fit(pa.table({"x": cities}), y, **kw)
    np.testing.assert_array_equal(by_dict.predict({"x": cities}), by_table.predict(pa.table({"x": cities})))
