"""Trainer(inputs=): Arrow tables and dicts of columns through the column plan, against the array path."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pytest

from streamfit import Trainer
from streamfit._engine.testing import cnn_model, two_input_model
from streamfit.exceptions import BadInputError, ModelError
from streamfit.features import Hashed, Padded, Vocabulary

pytestmark = pytest.mark.needs_ort_training  # Trainer builds these models' gradients with onnxruntime-training

CITIES = np.array(["paris", "oslo", "rome", "lima"])


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"a": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n),
                     "price": pa.array(rng.choice(np.array([0.5, 1.0, 2.5], np.float32), n)).dictionary_encode(),
                     "city": CITIES[rng.integers(0, len(CITIES), n)]})


def _arrays(t: pa.Table, hashed: Hashed) -> dict[str, np.ndarray]:
    """The model inputs computed by hand (floats stacked, ids hashed by the encoder on its own)."""
    x = np.column_stack([t.column("a").to_numpy(), t.column("b").to_numpy(),
                         np.asarray(t.column("price").to_pylist())]).astype(np.float32)
    ids = hashed.encode(hashed.new_state(), [t.column("city").combine_chunks()]).reshape(-1)
    return {"x": x, "ids": ids}


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_table_and_dict_of_columns_train_as_the_arrays(step):
    hashed = Hashed("city", 32, seed=1)
    kw = dict(optimizer="adam", learning_rate=0.02, step=step, threads=1)
    by_columns = Trainer(two_input_model(3, 32), inputs={"x": ["a", "b", "price"], "ids": hashed}, **kw)
    by_dict = Trainer(two_input_model(3, 32), inputs={"x": ["a", "b", "price"], "ids": hashed}, **kw)
    by_arrays = Trainer(two_input_model(3, 32), **kw)
    for seed in range(6):
        t = _table(40, seed)
        y = np.random.default_rng(seed + 100).standard_normal(40).astype(np.float32)
        by_columns.step(t if seed % 2 else t.to_batches()[0], y)
        by_dict.step({c: t.column(c).combine_chunks() for c in t.column_names}, y)
        by_arrays.step(_arrays(t, hashed), y)
    for k, w in by_arrays.get_weights().items():
        np.testing.assert_array_equal(by_columns.get_weights()[k], w, err_msg=k)
        np.testing.assert_array_equal(by_dict.get_weights()[k], w, err_msg=k)
    t = _table(10, 50)
    np.testing.assert_array_equal(by_columns.predict(t), by_arrays.predict(_arrays(t, hashed)))
    # the exported model takes the raw columns (strings included) and hashes them in its graph
    sess = ort.InferenceSession(by_columns.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"a": t.column("a").to_numpy(), "b": t.column("b").to_numpy(),
            "price": np.asarray(t.column("price").to_pylist(), np.float32),
            "city": np.asarray(t.column("city").to_pylist(), dtype=object)}
    np.testing.assert_allclose(sess.run(None, feed)[0], by_columns.predict(t), rtol=1e-5, atol=1e-6)


def test_a_cnn_from_a_fixed_shape_tensor_column():
    rng = np.random.default_rng(0)
    img = rng.standard_normal((20, 64)).astype(np.float32)
    col = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [1, 8, 8]),
                                         pa.FixedSizeListArray.from_arrays(pa.array(img.reshape(-1)), 64))
    y = img[:, :4].sum(axis=1).astype(np.float32)
    a = Trainer(cnn_model(), inputs={"X": "img"}, optimizer="adam", learning_rate=0.01)
    b = Trainer(cnn_model(), optimizer="adam", learning_rate=0.01)
    for i in range(0, 20, 5):
        a.step(pa.table({"img": col.slice(i, 5)}), y[i:i + 5])
        b.step(img[i:i + 5].reshape(5, 1, 8, 8), y[i:i + 5])
    for k, w in b.get_weights().items():
        np.testing.assert_array_equal(a.get_weights()[k], w, err_msg=k)


def test_vocabulary_state_is_in_the_state_dict_and_predictions_teach_it_nothing():
    make = lambda: Trainer(two_input_model(3, 16), inputs={"x": ["a", "b", "price"],  # noqa: E731
                                                           "ids": Vocabulary("city")}, learning_rate=0.05)
    tr = make()
    t = _table(30, 1)
    tr.step(t.slice(0, 20), np.ones(20, np.float32))
    before = tr.state_dict()["encoders"]["ids"]
    unseen = t.slice(20, 10).set_column(3, "city", pa.array(["tokyo"] * 10))
    tr.predict(unseen)
    assert "tokyo" not in tr._columns.plan.states["ids"].ids[0]
    again = make()
    again.load_state_dict(tr.state_dict())
    assert again._columns.plan.states["ids"].ids == tr._columns.plan.states["ids"].ids
    np.testing.assert_array_equal(again.predict(t), tr.predict(t))
    assert sorted(before["ids_0_keys"].tolist()) == sorted(set(t.column("city").to_pylist()[:20]))


@pytest.mark.parametrize("inputs, fragment", [
    ({"x": ["a", "b", "price", "q"], "ids": "city"}, "4 columns, but model input 'x' (float32, shape [N, 3]) takes 3"),
    ({"x": ["a", "b", "price"], "ids": Hashed(["city", "a"], 16)},
     "2 value(s) per row, but model input 'ids' (int64, shape [N]) expects 1"),
    ({"x": ["a", "b", "price"], "idz": Hashed("city", 16)}, "inputs= names ['idz'], which the model does not have"),
    ({"x": ["a", "b", "price"], "ids": Padded("tags")}, "no length given and model input 'ids'"),
    ({"x": ["a", "b", "price"], "ids": 3}, "inputs['ids'] must be a column name"),
])
def test_a_mapping_the_model_cannot_take_is_a_model_error_when_built(inputs, fragment):
    with pytest.raises(ModelError) as info:
        Trainer(two_input_model(3, 16), inputs=inputs)
    assert fragment in str(info.value)


def test_a_column_of_the_wrong_type_is_bad_input_naming_column_and_input():
    tr = Trainer(two_input_model(3, 16), inputs={"x": ["a", "b", "price"], "ids": "city"})
    with pytest.raises(BadInputError, match="column 'city' is string, expected int64 \\(input 'ids'"):
        tr.step(_table(4, 0), np.zeros(4, np.float32))


def test_an_estimator_checks_its_mapping_against_the_model_when_it_builds_the_trainer():
    from streamfit import OnnxRegressor

    est = OnnxRegressor(two_input_model(3, 16), inputs={"x": ["a", "b", "price", "q"], "ids": Hashed("city", 16)})
    with pytest.raises(ModelError, match="4 columns, but model input 'x' \\(float32, shape \\[N, 3\\]\\) takes 3"):
        est.partial_fit({"x": np.zeros((2, 3), np.float32), "ids": np.zeros(2, np.int64)}, np.zeros(2))
