"""inputs= on the ready-made models: their one feature input from columns, vector columns or an encoder,
trained as the array path trains (same weights), in memory and from a Parquet stream."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor, train_stream_sync
from streamfit.exceptions import ModelError
from streamfit.features import Padded

N = 120


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 5)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5, 3.0, -1.0]) + 0.3).astype(np.float32)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(X[:, 2:].reshape(-1)), 3)
    lists = pa.array([row.tolist() for row in X], pa.list_(pa.float32()))
    table = pa.table({"a": X[:, 0], "b": pa.array(X[:, 1].astype(np.float64)), "emb": emb, "v": lists})
    return X, y, table


def _weights(est):
    return est.trainer_.get_weights()


def _same(a, b):
    wa, wb = _weights(a), _weights(b)
    assert sorted(wa) == sorted(wb)
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


CASES = [("columns and a vector column", {"X": ["a", "b", "emb"]}, lambda t: t.select(["a", "b", "emb"])),
         ("an encoder", {"X": Padded("v", length=5)}, lambda t: t.select(["v"])),
         ("a dict of columns", {"X": ["a", "b", "emb"]},
          lambda t: {c: t.column(c).combine_chunks() for c in ("a", "b", "emb")})]


@pytest.mark.parametrize("cls", [LinearRegressor, MLPRegressor, LogisticRegression, MLPClassifier])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_inputs_train_as_the_array_path(cls, case):
    _, inputs, view = case
    X, y, table = _data()
    classifier = cls in (LogisticRegression, MLPClassifier)
    target = (y > 0).astype(np.int64) if classifier else y
    kw = dict(random_state=0, batch_size=20)
    by_columns, by_array = cls(inputs=inputs, **kw), cls(**kw)
    for i in range(0, N, 40):
        extra = {"classes": [0, 1]} if classifier and i == 0 else {}
        by_columns.partial_fit(view(table.slice(i, 40)), target[i:i + 40], **extra)
        by_array.partial_fit(X[i:i + 40], target[i:i + 40], **extra)
    _same(by_columns, by_array)
    np.testing.assert_array_equal(by_columns.predict(view(table)), by_array.predict(X))
    assert by_columns.n_features_in_ == 5


def test_fit_epochs_and_export_take_the_raw_columns():
    X, y, table = _data(1)
    est = LinearRegressor(inputs={"X": Padded("v", length=5)}, random_state=0, max_iter=3).fit(table, y)
    ref = LinearRegressor(random_state=0, max_iter=3).fit(X, y)
    _same(est, ref)
    model = est.to_onnx()  # standardization inside, the list column padded in the graph
    assert [i.name for i in model.graph.input] == ["v"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"v": X[:7]})[0].ravel(), est.predict(table.slice(0, 7)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("step", ["fused", pytest.param("forward_backward", marks=pytest.mark.needs_ort_training)])
def test_a_stream_trains_as_partial_fit(tmp_path, step):
    X, y, table = _data(2)
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(table.append_column("y", pa.array(y)), d / "part-0.parquet", row_group_size=50)
    make = lambda: LinearRegressor(inputs={"X": ["a", "b", "emb"]}, random_state=0, batch_size=30,  # noqa: E731
                                   step=step)
    est = make()
    summary = train_stream_sync(est, f"parquet:{d}", batch_size=30)
    assert summary.rows == N
    ref = make()
    for i in range(0, N, 30):
        ref.partial_fit(table.slice(i, 30), y[i:i + 30])
    _same(est, ref)


def test_a_mapping_that_names_another_input_is_a_model_error():
    X, y, table = _data()
    with pytest.raises(ModelError, match="inputs= names \\['x'\\], which the model does not have; its inputs are "
                                         "\\['X'\\]"):
        LinearRegressor(inputs={"x": ["a", "b"]}).partial_fit(table, y)


def test_an_integer_column_in_memory_says_how_to_convert_it():
    """The in-memory column plan has no cast= (the estimators take none): its error says to convert the column,
    and doing what it says trains; a stream, which has cast=, is told to pass it."""
    import pyarrow.compute as pc

    from streamfit.exceptions import BadInputError

    X, y, table = _data()
    ints = table.set_column(0, "a", pa.array(np.round(X[:, 0] * 10).astype(np.int64)))
    ints = ints.set_column(2, "emb", pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3 * N)), 3))
    est = LinearRegressor(inputs={"X": ["a", "b", "emb"]})
    with pytest.raises(BadInputError) as err:
        est.partial_fit(ints, y)
    message = str(err.value)
    assert "pass cast=True" not in message
    assert "cast it to float32 first, e.g. with pyarrow.compute.cast(table['a'], pyarrow.float32())" in message
    fixed = ints.set_column(0, "a", pc.cast(ints["a"], pa.float32()))
    with pytest.raises(BadInputError, match=r"cast it to fixed_size_list<float32>\[3\] first, e\.g\. with "
                                            r"pyarrow\.compute\.cast\(table\['emb'\], pyarrow\.list_\(pyarrow\."
                                            r"float32\(\), 3\)\)"):
        est.partial_fit(fixed, y)
    fixed = fixed.set_column(2, "emb", pc.cast(fixed["emb"], pa.list_(pa.float32(), 3)))
    est.partial_fit(fixed, y)
    assert est.n_features_in_ == 5
    with pytest.raises(BadInputError, match=r"pass cast=True to convert int columns"):
        train_stream_sync(LinearRegressor(inputs={"X": ["a", "b", "emb"]}), ints.append_column("y", pa.array(y)),
                          label="y", on_bad="raise")


@pytest.mark.parametrize("cls", [LinearRegressor, MLPRegressor, LogisticRegression, MLPClassifier])
@pytest.mark.parametrize(("short", "mapping"), [(["a", "b", "emb"], {"X": ["a", "b", "emb"]}),
                                                (Padded("v", length=5), {"X": Padded("v", length=5)})],
                         ids=["columns", "an encoder"])
def test_inputs_shorthand_is_the_one_input_X(cls, short, mapping):
    """The ready-made models have one input, so inputs= may name its columns (or encoder) alone: it trains and
    predicts as {"X": ...}, and get_params/clone keep the parameter as given."""
    from sklearn.base import clone

    X, y, table = _data(3)
    classifier = cls in (LogisticRegression, MLPClassifier)
    target = (y > 0).astype(np.int64) if classifier else y
    extra = {"classes": [0, 1]} if classifier else {}
    a, b = cls(inputs=short, random_state=0, batch_size=20), cls(inputs=mapping, random_state=0, batch_size=20)
    a.partial_fit(table, target, **extra)
    b.partial_fit(table, target, **extra)
    _same(a, b)
    np.testing.assert_array_equal(a.predict(table), b.predict(table))
    assert a.get_params()["inputs"] is short and clone(a).get_params()["inputs"] == short
    assert a.n_features_in_ == 5


def test_inputs_shorthand_in_a_stream_and_its_errors():
    X, y, table = _data(4)
    est = LinearRegressor(inputs=["a", "b", "emb"], random_state=0, batch_size=30)
    summary = train_stream_sync(est, table.append_column("y", pa.array(y)), label="y", batch_size=30)
    assert summary.rows == N and est.n_features_in_ == 5
    ref = LinearRegressor(inputs={"X": ["a", "b", "emb"]}, random_state=0, batch_size=30)
    for i in range(0, N, 30):
        ref.partial_fit(table.slice(i, 30), y[i:i + 30])
    _same(est, ref)
    with pytest.raises(ValueError, match=r"inputs\['X'\] must be a column name, a list of column names or a "
                                         r"streamfit.features encoder, got 5"):
        LinearRegressor(inputs=5).partial_fit(table, y)
