"""The preflight's synthetic inputs look like the data a model expects (a mask of ones, ids inside the
vocabulary), and a non-finite step on them is a warning, not a refusal (issue 21, item 4)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.trainer import Trainer

ZOO2 = Path(__file__).resolve().parent / "zoo2"


@pytest.fixture(autouse=True, scope="module")
def _own_cache(tmp_path_factory):
    old = os.environ.get("STREAMFIT_CACHE_DIR")
    os.environ["STREAMFIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    os.environ["STREAMFIT_CACHE_DIR"] = old or ""


def _model(nodes, inputs, inits):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_synthetic_inputs_look_like_the_data():
    """An attention mask of ones (zeros mask every position), ids spread inside the vocabulary."""
    from streamfit._engine.prepare.model import prepare_model
    from streamfit._preflight import _synthetic_x

    X = _synthetic_x(prepare_model(ZOO2 / "bert.dynamo.onnx"), 7)
    assert (X["attention_mask"] == 1).all()
    ids = X["input_ids"]
    assert ids.min() >= 0 and ids.max() < 64 and len(np.unique(ids)) > 10


def test_a_non_finite_step_on_synthetic_inputs_is_a_warning_not_a_refusal(tmp_path):
    """log(x) of standard-normal synthetic rows is NaN; the model trains on its own (positive) data."""
    from streamfit._preflight import check_model

    W = np.full((3, 1), 0.5, np.float32)
    model = _model([helper.make_node("Log", ["x"], ["l"]), helper.make_node("MatMul", ["l", "W"], ["y"])],
                   [("x", TensorProto.FLOAT, ["N", 3])], {"W": W})
    onnx.save(model, tmp_path / "log.onnx")
    result = check_model(tmp_path / "log.onnx")
    assert result.ok, result.message()
    assert any(n.startswith("WARNING: fused, 1 rows") and "synthetic inputs" in n for n in result.notes), result.notes
    trainer = Trainer(tmp_path / "log.onnx", learning_rate=0.1)
    X = np.random.default_rng(0).uniform(0.5, 2.0, (32, 3)).astype(np.float32)
    assert np.isfinite(trainer.step(X, np.zeros((32, 1), np.float32)))
