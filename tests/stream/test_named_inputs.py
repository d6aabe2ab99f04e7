"""Named model inputs from Arrow columns through the real stream loop: several inputs, integer ids from
string and dictionary columns, tensors, multi-output and string labels, padded lists; loop == partial_fit."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit import OnnxClassifier, OnnxRegressor, train_stream_sync
from streamfit._engine.testing import cnn_model, mlp_model, two_input_model
from streamfit._stream.batching import Rebatcher
from streamfit._columns.plan import ColumnPlan
from streamfit.exceptions import BadInputError
from streamfit.features import Hashed, Mask, Padded, Vocabulary
from streamfit.sources._base import SourceBatch

STEPS = ["fused", pytest.param("forward_backward", marks=pytest.mark.needs_ort_training)]
CITIES = np.array(["paris", "oslo", "rome", "lima", "kyiv", "baku"])
COMMON = dict(optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None, threads=1)


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    city = CITIES[rng.integers(0, len(CITIES), n)]
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    price = rng.choice(np.array([0.5, 1.0, 2.5], np.float32), n)
    y = (a - 0.5 * b + price + np.where(city == "oslo", 2.0, 0.0)).astype(np.float32)
    return pa.table({"a": a, "b": b, "price": pa.array(price).dictionary_encode(), "city": city,
                     "store": pa.array(city).dictionary_encode(), "y": y})


def _write(tmp_path, tables, **kw) -> str:
    d = tmp_path / "data"
    d.mkdir()
    for i, t in enumerate(tables):
        pq.write_table(t, d / f"part-{i:03d}.parquet", row_group_size=kw.get("row_group_size", 170))
    return f"parquet:{d}"


def _reference(est, table: pa.Table, batch_size: int, label="y", **fit_kw):
    X = table.drop_columns([label] if isinstance(label, str) else list(label))
    for i in range(0, table.num_rows, batch_size):
        sl = table.slice(i, batch_size)
        y = sl.column(label).to_numpy() if isinstance(label, str) else np.column_stack(
            [sl.column(c).to_numpy() for c in label])
        est.partial_fit(X.slice(i, batch_size), y, **(fit_kw if i == 0 else {}))
    return est


def _same_weights(a, b):
    wa, wb = a.trainer_.get_weights(), b.trainer_.get_weights()
    assert sorted(wa) == sorted(wb)
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("encoder", ["hashed", "vocabulary"])
def test_two_input_model_from_parquet_string_dictionary_and_float_columns(tmp_path, step, encoder):
    tables = [_table(500, 1), _table(400, 2)]
    tables[1] = tables[1].set_column(3, "city", pa.array(tables[1].column("city")).dictionary_encode())
    source = _write(tmp_path, tables)
    ids = Hashed("city", 64, seed=3) if encoder == "hashed" else Vocabulary("city")
    make = lambda: OnnxRegressor(two_input_model(3, 64), inputs={"x": ["a", "b", "price"], "ids": ids},  # noqa: E731
                                 batch_size=100, step=step, **COMMON)
    est = make()
    summary = train_stream_sync(est, source, batch_size=100, window=300)
    assert summary.rows == 900 and summary.skipped_rows == {}
    ref = _reference(make(), pa.concat_tables([tables[0], tables[1].cast(tables[0].schema)]), 100)
    _same_weights(est, ref)
    assert summary.window_metrics["rmse"] < summary.stream_metrics["rmse"]  # it learns

    # the exported model takes the raw columns (strings included) and gives the estimator's predictions
    test = _table(50, 9)
    sess = ort.InferenceSession(est.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in sess.get_inputs()) == ["a", "b", "city", "price"]
    assert {i.name: i.type for i in sess.get_inputs()}["city"] == "tensor(string)"
    feed = {c: test.column(c).to_numpy() for c in ("a", "b")}
    feed["price"] = np.asarray(test.column("price").to_pylist(), np.float32)
    feed["city"] = np.asarray(test.column("city").to_pylist(), dtype=object)
    np.testing.assert_allclose(sess.run(None, feed)[0].ravel(), est.predict(test.drop_columns(["y"])).ravel(),
                               rtol=1e-5, atol=1e-6)


def test_unknown_values_and_read_ahead_in_the_exported_vocabulary(tmp_path):
    source = _write(tmp_path, [_table(600, 4)])
    est = OnnxRegressor(two_input_model(3, 16), inputs={"x": ["a", "b", "price"], "ids": Vocabulary("city", 40)},
                        batch_size=50, **COMMON)
    train_stream_sync(est, source, batch_size=50, queue_size=2)
    vocab = est.encoder_states_["ids"].ids[0]
    assert sorted(vocab) == sorted(CITIES) and sorted(vocab.values()) == list(range(2, 2 + len(CITIES)))
    sess = ort.InferenceSession(est.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    test = _table(5, 5).set_column(3, "city", pa.array(["oslo", "nowhere", "paris", "", "oslo"]))
    feed = {"a": test.column("a").to_numpy(), "b": test.column("b").to_numpy(),
            "price": np.asarray(test.column("price").to_pylist(), np.float32),
            "city": np.asarray(test.column("city").to_pylist(), dtype=object)}
    np.testing.assert_allclose(sess.run(None, feed)[0].ravel(), est.predict(test.drop_columns(["y"])).ravel(),
                               rtol=1e-5, atol=1e-6)


def _tensor_table(n: int, seed: int, tensor: bool = True) -> pa.Table:
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n, 64)).astype(np.float32)
    col = pa.FixedSizeListArray.from_arrays(pa.array(img.reshape(-1)), 64)
    if tensor:
        col = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [1, 8, 8]), col)
    return pa.table({"img": col, "y": (img[:, :8].sum(axis=1) - img[:, 60]).astype(np.float32)})


@pytest.mark.needs_ort_training  # Conv's gradient: onnxruntime-training's builder
@pytest.mark.parametrize("step", STEPS)
def test_cnn_from_a_fixed_shape_tensor_column_zero_copy(tmp_path, step):
    tables = [_tensor_table(300, 1), _tensor_table(200, 2)]
    make = lambda: OnnxRegressor(cnn_model(), inputs={"X": "img"}, batch_size=50, step=step, **COMMON)  # noqa: E731
    est = make()
    summary = train_stream_sync(est, _write(tmp_path, tables, row_group_size=100), batch_size=50)
    assert summary.rows == 500
    _same_weights(est, _reference(make(), pa.concat_tables(tables), 50))
    # a whole training batch inside one record batch is a view of the Arrow buffer, shaped as the model says
    from streamfit._engine.prepare.model import ModelInput

    rb = Rebatcher(50, ColumnPlan(inputs={"X": "img"}, model_inputs=[ModelInput("X", np.dtype(np.float32), ("N", 1, 8, 8))]))
    batch = tables[0].to_batches()[0]
    (tb, *_) = rb.push(SourceBatch(batch, lambda r: {"row": r}))
    buffer = np.frombuffer(batch.column("img").storage.values.buffers()[1], np.float32)
    assert tb.X["X"].shape == (50, 1, 8, 8) and np.shares_memory(tb.X["X"], buffer)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("layout", ["fixed_size_list", "columns"])
def test_multi_output_labels(tmp_path, step, layout):
    rng = np.random.default_rng(3)
    n = 400
    X = rng.standard_normal((n, 4)).astype(np.float32)
    Y = (X @ rng.standard_normal((4, 3))).astype(np.float32)
    cols = {f"x{j}": X[:, j] for j in range(4)}
    if layout == "fixed_size_list":
        cols["Y"] = pa.FixedSizeListArray.from_arrays(pa.array(Y.reshape(-1)), 3)
        label = "Y"
    else:
        cols.update({f"y{k}": Y[:, k] for k in range(3)})
        label = ["y0", "y1", "y2"]
    table = pa.table(cols)
    inputs = {"X": [f"x{j}" for j in range(4)]}
    make = lambda: OnnxRegressor(mlp_model([4, 8, 3]), inputs=inputs, batch_size=40, step=step, **COMMON)  # noqa: E731
    est = make()
    summary = train_stream_sync(est, _write(tmp_path, [table]), batch_size=40, label=label)
    assert summary.rows == n
    ref = make()
    for i in range(0, n, 40):
        ref.partial_fit(table.select(inputs["X"]).slice(i, 40), Y[i:i + 40])
    _same_weights(est, ref)


@pytest.mark.parametrize("step", STEPS)
def test_string_labels_in_a_stream(tmp_path, step):
    rng = np.random.default_rng(5)
    n, h = 1500, 600
    X = rng.standard_normal((n, 3)).astype(np.float32)
    labels = np.array(["cat", "dog", "eel"])[np.argmax(X, axis=1)]
    t1 = pa.table({"x0": X[:h, 0], "x1": X[:h, 1], "x2": X[:h, 2], "kind": labels[:h]})
    t2 = pa.table({"x0": X[h:, 0], "x1": X[h:, 1], "x2": X[h:, 2], "kind": pa.array(labels[h:]).dictionary_encode()})
    inputs = {"X": ["x0", "x1", "x2"]}
    make = lambda: OnnxClassifier(mlp_model([3, 8, 3]), inputs=inputs, batch_size=30, step=step, **COMMON)  # noqa: E731
    est = make()
    summary = train_stream_sync(est, _write(tmp_path, [t1, t2]), batch_size=30, label="kind", window=300,
                                task="classification")  # classes learned from the first batch
    assert summary.rows == n and est.classes_.tolist() == ["cat", "dog", "eel"]
    ref = make()
    for i in range(0, n, 30):
        ref.partial_fit({"X": X[i:i + 30]}, labels[i:i + 30], **({"classes": ["cat", "dog", "eel"]} if i == 0 else {}))
    _same_weights(est, ref)
    assert summary.window_metrics["accuracy"] > 0.85
    # a label outside the classes is a bad row with its own reason
    odd = pa.table({"x0": X[:30, 0], "x1": X[:30, 1], "x2": X[:30, 2],
                    "kind": pa.array(["cat"] * 29 + ["gnu"])})
    (tmp_path / "more").mkdir()
    pq.write_table(odd, tmp_path / "more" / "part-000.parquet")
    summary = train_stream_sync(est, f"parquet:{tmp_path / 'more'}", batch_size=30, label="kind",
                                task="classification", on_bad="skip")
    assert summary.rows == 29 and summary.skipped_rows == {"unknown_class": 1}
    with pytest.raises(BadInputError, match="label column 'kind' has 'gnu', expected one of the classes"):
        train_stream_sync(est, f"parquet:{tmp_path / 'more'}", batch_size=30, label="kind", task="classification",
                          on_bad="raise")


def _bag_model(vocab: int, length: int, dim: int = 4) -> object:
    """ids [N, L] int64 and mask [N, L] float: Y = (sum_l mask * E[ids]) @ W + B (a bag of embeddings)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((vocab, dim)) * 0.1).astype(np.float32), "E"),
             numpy_helper.from_array((rng.standard_normal((dim, 1)) * 0.1).astype(np.float32), "W"),
             numpy_helper.from_array(np.zeros(1, np.float32), "B"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["e"], axis=0),
             helper.make_node("Unsqueeze", ["mask", "axis2"], ["m"]),
             helper.make_node("Mul", ["e", "m"], ["em"]),
             helper.make_node("ReduceSum", ["em", "axis1"], ["s"], keepdims=0),
             helper.make_node("MatMul", ["s", "W"], ["sw"]), helper.make_node("Add", ["sw", "B"], ["Y"])]
    graph = helper.make_graph(nodes, "bag", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", length]),
                                             helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", length])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("step", STEPS)
def test_padded_list_column_with_a_mask_input(tmp_path, step):
    rng = np.random.default_rng(8)
    n, L = 300, 5
    lists = [rng.integers(1, 20, rng.integers(0, 8)).tolist() for _ in range(n)]
    y = np.array([sum(v % 3 for v in lst[:L]) for lst in lists], np.float32)
    table = pa.table({"tags": pa.array(lists, pa.list_(pa.int64())), "y": y})
    inputs = {"ids": Padded("tags", pad=0), "mask": Mask("tags")}
    make = lambda: OnnxRegressor(_bag_model(20, L), inputs=inputs, batch_size=30, step=step, **COMMON)  # noqa: E731
    est = make()
    summary = train_stream_sync(est, _write(tmp_path, [table], row_group_size=100), batch_size=30)
    assert summary.rows == n
    _same_weights(est, _reference(make(), table, 30))
    ids, mask = est._check_X(table.slice(0, 4).drop_columns(["y"]), reset=False).arrays.values()
    assert ids.tolist() == [(lst[:L] + [0] * L)[:L] for lst in lists[:4]]
    assert mask.tolist() == [[1.0] * min(len(lst), L) + [0.0] * (L - min(len(lst), L)) for lst in lists[:4]]
    sess = ort.InferenceSession(est.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in sess.get_inputs()] == [("tags", ["N", L])]
    padded = np.array([(lst[:L] + [0] * L)[:L] for lst in lists[:20]], np.int64)
    np.testing.assert_allclose(sess.run(None, {"tags": padded})[0].ravel(),
                               est.predict(table.slice(0, 20).drop_columns(["y"])).ravel(), rtol=1e-5, atol=1e-6)


def test_mismatched_columns_are_bad_input_naming_the_input():
    from streamfit._engine.prepare.model import ModelInput

    mis = [ModelInput("x", np.dtype(np.float32), ("N", 3)), ModelInput("ids", np.dtype(np.int64), ("N",))]
    batch = _table(10).to_batches()[0]
    cases = [({"x": ["a", "b"], "ids": Hashed("city", 8)}, "wrong_shape", "input 'x' takes [3] values per row"),
             ({"x": ["a", "b", "price"], "ids": "city"}, "wrong_type",
              "column 'city' is string, expected int64 (input 'ids'"),
             ({"x": ["a", "b", "nope"], "ids": Hashed("city", 8)}, "missing_column", "column 'nope' is missing"),
             ({"x": ["a", "b", "price"], "ids": "b"}, "wrong_type", "column 'b' is float, expected int64")]
    for inputs, reason, fragment in cases:
        with pytest.raises(BadInputError) as info:
            list(Rebatcher(4, ColumnPlan(inputs=inputs, model_inputs=mis)).push(SourceBatch(batch, lambda r: {"row": r})))
        assert info.value.reason == reason and fragment in str(info.value), str(info.value)
    from streamfit.exceptions import ModelError

    with pytest.raises(ModelError, match="inputs= names \\['idz'\\], which the model does not have"):
        Rebatcher(4, ColumnPlan(inputs={"x": "a", "idz": "b"}, model_inputs=mis))


@pytest.mark.needs_ort_training  # an OnnxRegressor over a Gather model: onnxruntime-training's gradient
def test_predictions_teach_a_vocabulary_nothing():
    est = OnnxRegressor(two_input_model(3, 16), inputs={"x": ["a", "b", "price"], "ids": Vocabulary("city")},
                        batch_size=50, **COMMON)
    table = _table(100, 6)
    est.partial_fit(table.drop_columns(["y"]), table.column("y").to_numpy())
    before = {k: dict(v) for k, v in enumerate(est.encoder_states_["ids"].ids)}
    unseen = table.slice(0, 10).set_column(3, "city", pa.array(["tokyo"] * 10)).drop_columns(["y"])
    out = est.predict(unseen)
    assert {k: dict(v) for k, v in enumerate(est.encoder_states_["ids"].ids)} == before
    # unknown values predict as the unknown id, as the exported model does
    sess = ort.InferenceSession(est.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"a": unseen.column("a").to_numpy(), "b": unseen.column("b").to_numpy(),
            "price": np.asarray(unseen.column("price").to_pylist(), np.float32),
            "city": np.asarray(unseen.column("city").to_pylist(), dtype=object)}
    np.testing.assert_allclose(sess.run(None, feed)[0].ravel(), out.ravel(), rtol=1e-5, atol=1e-6)
