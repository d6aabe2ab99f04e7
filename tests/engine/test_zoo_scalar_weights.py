"""A rank-0 weight (an exporter's scalar trained through ``weights=``) keeps shape () through training, the
weights and optimizer state, a checkpoint written and read back, and ``to_onnx()`` (before: shape [1], from
``np.ascontiguousarray`` in the device buffers)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit import OnnxRegressor
from streamfit._engine.trainer import Trainer
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon.state import restore_estimator, snapshot_estimator


def _scaled_linear() -> "object":
    """y = (x @ W) * s, with s a rank-0 initializer."""
    W = np.array([[0.5], [-0.25], [1.0]], np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Mul", ["h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
                              [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array(2.0, np.float32), "s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((32, 3)).astype(np.float32)
    return X, (X @ np.array([[1.0], [0.5], [-1.0]], np.float32) * 3.0).astype(np.float32)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_a_scalar_weight_trains_and_keeps_its_shape(step):
    trainer = Trainer(_scaled_linear(), weights=["W", "s"], step=step, optimizer="adam", learning_rate=0.01)
    X, y = _data()
    trainer.step(X, y)
    weights = trainer.get_weights()
    assert weights["s"].shape == () and weights["s"] != np.float32(2.0)  # trained, still a scalar
    assert {k: v.shape for k, v in trainer.optimizer_state().items() if k.startswith("s_")} == {
        "s__exp_avg": (), "s__exp_avg_sq": ()}
    assert trainer.state_dict()["weights"]["s"].shape == ()
    exported = {i.name: list(i.dims) for i in trainer.to_onnx().graph.initializer}
    assert exported["s"] == [] and exported["W"] == [3, 1]
    sess = ort.InferenceSession(trainer.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], trainer.predict(X), rtol=1e-6)
    trainer.set_weights({"s": np.array(1.5, np.float32)})  # a scalar goes back in as a scalar
    np.testing.assert_allclose(trainer.predict(X), X @ weights["W"] * 1.5, rtol=1e-5)


def test_a_scalar_weight_survives_a_checkpoint(tmp_path):
    reg = OnnxRegressor(_scaled_linear(), weights=["W", "s"], optimizer="adam", learning_rate="constant",
                        eta0=0.01)
    X, y = _data()
    for _ in range(3):
        reg.partial_fit(X, y.ravel())
    model, arrays, state = snapshot_estimator(reg)
    store = CheckpointStore(tmp_path)
    store.save(3, model, arrays, {"estimator": state})
    ckpt = store.load_latest()
    assert ckpt is not None
    scalars = {k: v.shape for k, v in ckpt.arrays.items() if v.ndim == 0}
    assert scalars and all(s == () for s in scalars.values())
    fresh = OnnxRegressor(_scaled_linear(), weights=["W", "s"], optimizer="adam", learning_rate="constant",
                          eta0=0.01)
    restore_estimator(fresh, ckpt.meta["estimator"], ckpt.arrays)
    np.testing.assert_array_equal(fresh.predict(X), reg.predict(X))
    fresh.partial_fit(X, y.ravel())
    reg.partial_fit(X, y.ravel())
    np.testing.assert_array_equal(fresh.predict(X), reg.predict(X))
    assert [list(i.dims) for i in fresh.to_onnx().graph.initializer if i.name == "s"] == [[]]
