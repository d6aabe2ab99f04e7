"""The Trainer: strategies agree, scikit-learn's SGD is reproduced, bad models and steps are refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import BadInputError, ModelError, NonFiniteError, StreamfitError
from streamfit.penalties import Penalty
from streamfit.schedules import InvScaling


def _stream(n=512, d=10, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(dtype)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(n)).astype(dtype)
    return X, y


@pytest.mark.parametrize("batch", [32, 128])  # 128 runs the large-batch graph (ReluGrad rewritten)
@pytest.mark.parametrize("optimizer", ["sgd", "nesterov", "adam"])
def test_fused_and_forward_backward_agree_on_mlp(optimizer, batch):
    X, y = _stream()
    runs = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(mlp_model([10, 32, 16, 1], "Relu", seed=1), optimizer=optimizer, step=step,
                          learning_rate=0.01, penalty=Penalty(1e-3, 0.15))
        losses = [trainer.step(X[i:i + batch], y[i:i + batch]) for i in range(0, 512, batch)]
        losses.append(trainer.step(X[:7], y[:7]))  # a short last batch
        runs[step] = (trainer.get_weights(), losses)
    for name, w in runs["fused"][0].items():
        np.testing.assert_allclose(w, runs["forward_backward"][0][name], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(runs["fused"][1], runs["forward_backward"][1], rtol=1e-4)
    assert runs["fused"][1][-2] < runs["fused"][1][0]  # it learns


def test_reproduces_sklearn_sgdregressor_at_batch_1():
    from sklearn.linear_model import SGDRegressor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 4))
    y = X @ np.array([1.5, -2.0, 0.5, 3.0]) + 1.0 + 0.1 * rng.standard_normal(80)
    epochs = 3
    skl = SGDRegressor(loss="squared_error", penalty="l2", alpha=0.01, learning_rate="invscaling", eta0=0.02,
                       power_t=0.25, shuffle=False, max_iter=epochs, tol=None, average=False)
    skl.fit(X, y)
    trainer = Trainer(linear_model(4, dtype=np.float64), optimizer="sgd", penalty=Penalty(alpha=0.01, l1_ratio=0.0),
                      learning_rate=InvScaling(eta0=0.02, power_t=0.25))
    for _ in range(epochs):
        for i in range(len(X)):
            trainer.step(X[i:i + 1], y[i:i + 1])
    w = trainer.get_weights()
    np.testing.assert_allclose(w["W"].ravel(), skl.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w["B"], skl.intercept_, rtol=1e-4, atol=1e-6)


def test_float64_model_trains_in_float64():
    X, y = _stream(dtype=np.float64)
    trainer = Trainer(mlp_model([10, 8, 1], "Tanh", dtype=np.float64), learning_rate=0.05)
    first = trainer.step(X[:64], y[:64])
    for _ in range(30):
        last = trainer.step(X[:64], y[:64])
    assert trainer.get_weights()["W0"].dtype == np.float64 and last < first


def test_staging_is_reused_per_shape():
    X, y = _stream()
    trainer = Trainer(linear_model(10))
    trainer.step(X[:16], y[:16])
    cache = trainer._strategy.cache._cache
    staged = dict(cache)
    for i in range(16, 160, 16):
        trainer.step(X[i:i + 16], y[i:i + 16])
    assert dict(cache) == staged and all(cache[k] is staged[k] for k in staged)  # no new buffers
    trainer.step(X[:5], y[:5])  # a short batch gets its own buffers, once
    assert len(cache) == 2


def test_to_onnx_runs_in_plain_onnxruntime_with_same_predictions():
    X, y = _stream()
    trainer = Trainer(mlp_model([10, 16, 1], seed=3), learning_rate=0.05)
    for i in range(0, 512, 64):
        trainer.step(X[i:i + 64], y[i:i + 64])
    model = trainer.to_onnx()
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString())
    # same weights, same graph; only float32 rounding of differently fused kernels may differ
    np.testing.assert_allclose(sess.run(None, {"X": X})[0], trainer.predict(X), rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_continues_identically():
    X, y = _stream()
    a = Trainer(linear_model(10), optimizer="adam", learning_rate=InvScaling(0.05))
    for i in range(0, 256, 32):
        a.step(X[i:i + 32], y[i:i + 32])
    b = Trainer(linear_model(10), optimizer="adam", learning_rate=InvScaling(0.05))
    b.load_state_dict(a.state_dict())
    for i in range(256, 512, 32):
        a.step(X[i:i + 32], y[i:i + 32])
        b.step(X[i:i + 32], y[i:i + 32])
    for name, w in a.get_weights().items():
        np.testing.assert_array_equal(w, b.get_weights()[name])


def test_piece_by_piece_forward_backward_apply():
    X, y = _stream(n=32)
    fused = Trainer(linear_model(10, seed=2), learning_rate=0.1)
    fused.step(X, y)
    manual = Trainer(linear_model(10, seed=2), learning_rate=0.1, step="forward_backward")
    out = manual.forward(X)
    dy = (out - y.reshape(-1, 1)) / len(X)  # the caller's own dL/dY (half squared error)
    grads = manual.backward(dy)
    np.testing.assert_allclose(grads["W"], X.T @ dy, rtol=1e-5, atol=1e-6)
    assert manual.apply_gradients(grads)
    for name, w in fused.get_weights().items():
        np.testing.assert_allclose(manual.get_weights()[name], w, rtol=1e-5, atol=1e-7)
    with pytest.raises(StreamfitError, match="need step='forward_backward'"):
        fused.forward(X)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_nonfinite_step_is_never_applied(step):
    X, y = _stream(n=64)
    trainer = Trainer(linear_model(10, seed=1), step=step)
    trainer.step(X[:32], y[:32])
    before = trainer.get_weights()
    bad = X[:32].copy()
    bad[3, 4] = np.nan
    with pytest.raises(NonFiniteError, match="not applied"):
        trainer.step(bad, y[:32])
    for name, w in trainer.get_weights().items():
        np.testing.assert_array_equal(w, before[name])
    skipping = Trainer(linear_model(10, seed=1), step=step, on_nonfinite="skip", learning_rate=1e30)
    skipping.step(X[:32] * 1e20, y[:32])  # finite loss, overflowing update
    assert skipping.n_skipped == 1 and skipping.n_steps == 0
    assert all(np.isfinite(w).all() for w in skipping.get_weights().values())
    skipping.step(X[:32], y[:32] * 0)  # still trains afterwards (lr is absurd but finite here)
    assert skipping.n_steps + skipping.n_skipped == 2


def _model_with(inits, nodes, inputs=None):
    graph = helper.make_graph(nodes, "m", inputs or [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_default_weights_skip_structural_initializers():
    inits = [numpy_helper.from_array(np.ones((2, 1), np.float32), "W"),
             numpy_helper.from_array(np.array([-1, 1], np.int64), "shape"),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(9.0, np.float32), "hi")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]), helper.make_node("Clip", ["M", "lo", "hi"], ["C"]),
             helper.make_node("Reshape", ["C", "shape"], ["Y"])]
    trainer = Trainer(_model_with(inits, nodes))
    assert trainer.weight_names == ["W"]


def test_explicit_weights_in_any_order_and_frozen_rest():
    X, y = _stream(n=32, d=3)
    trainer = Trainer(mlp_model([3, 4, 1], seed=1), weights=["W1", "B0", "W0"], learning_rate=0.1)
    assert trainer.weight_names == ["W1", "B0", "W0"]
    b1 = numpy_helper.to_array(next(i for i in trainer.prepared.model.graph.initializer if i.name == "B1"))
    trainer.step(X, y)
    frozen = numpy_helper.to_array(next(i for i in trainer.to_onnx().graph.initializer if i.name == "B1"))
    np.testing.assert_array_equal(frozen, b1)


def test_model_errors_are_clear():
    model = linear_model(3)
    with pytest.raises(ModelError, match=r"unknown weight 'nope'; the model's initializers are \['B', 'W'\]"):
        Trainer(model, weights=["nope"])
    ints = _model_with([numpy_helper.from_array(np.ones((2, 1), np.int64), "K")],
                       [helper.make_node("Cast", ["X"], ["Xi"], to=TensorProto.INT64),
                        helper.make_node("MatMul", ["Xi", "K"], ["Mi"]), helper.make_node("Cast", ["Mi"], ["Y"], to=1)])
    with pytest.raises(ModelError, match="weight 'K' is int64; only float32 and float64"):
        Trainer(ints, weights=["K"])
    with pytest.raises(ModelError, match="nothing to train"):
        Trainer(ints)
    with pytest.raises(ModelError, match="cannot load the ONNX model"):
        Trainer(b"not a model at all")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        Trainer(model, device="tpu")
    with pytest.raises(ValueError, match="no CUDA provider"):
        Trainer(model, device="cuda:1")


def test_ir_version_above_10_is_lowered():
    model = linear_model(3)
    model.ir_version = 11
    model.opset_import[0].version = 23
    trainer = Trainer(model)
    assert trainer.prepared.model.ir_version == 10
    assert any("IR version 11 -> 10" in n for n in trainer.prepared.notes)
    float4 = linear_model(3)
    float4.ir_version = 11
    float4.graph.value_info.append(helper.make_tensor_value_info("extra", 23, [1]))  # FLOAT4E2M1: IR 11 only
    with pytest.raises(ModelError, match="cannot express"):
        Trainer(float4)


def test_bad_batches_raise_bad_input():
    trainer = Trainer(linear_model(3))
    with pytest.raises(BadInputError, match="non-empty batch"):
        trainer.step(np.zeros((0, 3), np.float32), np.zeros(0, np.float32))
    with pytest.raises(BadInputError, match="3 rows of features but 2 labels"):
        trainer.step(np.zeros((3, 3), np.float32), np.zeros(2, np.float32))


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_last_output_is_the_prediction_before_the_update(step):
    X, y = _stream(n=300)
    trainer = Trainer(mlp_model([10, 8, 1], seed=0), step=step, learning_rate=0.1)
    for batch in (16, 100):  # small- and large-batch graphs
        before = trainer.predict(X[:batch])
        trainer.step(X[:batch], y[:batch])
        np.testing.assert_allclose(trainer.last_output, before, rtol=1e-5, atol=1e-6)
        assert not np.allclose(trainer.predict(X[:batch]), before)  # the step did change the model


def test_session_options_and_device_parsing():
    from streamfit._engine.runtime.device import parse_device, session_options

    opts = session_options(threads=3, spinning=False)
    assert opts.intra_op_num_threads == 3
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.get_session_config_entry("session.set_denormal_as_zero") == "1"
    with pytest.raises(ValueError, match="threads must be >= 1"):
        session_options(threads=0)
    cuda = parse_device("cuda:2", check=False)
    assert (cuda.kind, cuda.index, str(cuda)) == ("cuda", 2, "cuda:2")
    assert cuda.providers[0] == ("CUDAExecutionProvider", {"device_id": "2"})  # the index reaches ORT
    assert parse_device("CPU").providers == ["CPUExecutionProvider"]
    trainer = Trainer(linear_model(3), threads=None)
    assert trainer.small_batch_options.intra_op_num_threads == 1  # small batches: one thread by default
    assert Trainer(linear_model(3), threads=2).small_batch_options.intra_op_num_threads == 2


_SPIN_CHILD = """
import json, time
import streamfit as sf
from streamfit.testing import ClickStream
stream = ClickStream(seed=0, n_categorical=16, n_dense=0, strings=True)
table = stream.table(8192)
y, X = table.column("label").to_numpy(), table.drop_columns(["label"])
sf.LogisticRegression(categorical=stream.categorical, optimizer="ftrl").partial_fit(X, y, classes=[0, 1])  # warm
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(3):  # from a new model each time, as a stream starts
    est = sf.LogisticRegression(categorical=stream.categorical, optimizer="ftrl", batch_size=1024)
    est.partial_fit_predict(X.slice(0, 1024), y[:1024], classes=[0, 1])
    for i in range(1024, len(y), 1024):
        est.partial_fit_predict(X.slice(i, 1024), y[i:i + 1024])
print(json.dumps([time.process_time() - cpu, time.perf_counter() - wall, est.trainer_._predictor._heavy is None]))
"""


def test_predictions_of_a_small_model_run_on_one_thread_and_large_ones_on_the_pool():
    """A new session's pool of spinning intra-op threads, run once (the first step's probe of the output's shape),
    kept a second core spinning: a hashed model's 20,000-row pass from a new model took twice its wall time in CPU
    time.  So the predictor's first session is a light one (one thread); a large batch on a model with many
    weights gets the pool.  (The CPU time is measured in a process of its own: the sessions of other tests would
    count in this one's.)"""
    import json
    import subprocess
    import sys

    from streamfit._engine.testing import mlp_model

    out = subprocess.run([sys.executable, "-c", _SPIN_CHILD], capture_output=True, text=True, timeout=300, check=True)
    cpu, wall, light = json.loads(out.stdout.strip().splitlines()[-1])
    assert cpu < 1.4 * wall + 0.01, (cpu, wall)  # no second core spinning beside the steps
    assert light
    big = Trainer(mlp_model([64, 512, 512, 1], seed=0), threads=None)
    Xb = np.ones((200, 64), np.float32)
    np.testing.assert_allclose(big.predict(Xb), big.predict(Xb[:50].repeat(4, 0)), rtol=1e-5)  # 200 x 300k weights
    assert big._predictor._heavy is not None
    assert Trainer(linear_model(3), threads=2)._predictor._make_heavy is None  # threads given: one session for all


def test_cuda_staging_falls_back_to_host_memory_that_the_bound_value_sees():
    from streamfit._engine.runtime.device import Device

    value, arr = Device("cuda", 1).staging((2, 3), np.float32)  # no pinned allocator in the CPU build
    arr[...] = 7.0
    np.testing.assert_array_equal(value.numpy(), np.full((2, 3), 7.0, np.float32))


# -- the small-batch graph checks large SGD-updated weights by a bound (MagnitudeBound) ---------------------
def _no_bias_mlp(d=64, seed=0):
    """X -> MatMul W0 -> Relu -> MatMul W1 -> Y: both weights large enough to be checked by the bound."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), f"W{i}")
             for i in range(2)]
    nodes = [helper.make_node("MatMul", ["X", "W0"], ["M"]), helper.make_node("Relu", ["M"], ["H"]),
             helper.make_node("MatMul", ["H", "W1"], ["Y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, d])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 8])
def test_bounded_check_trains_exactly_like_forward_backward(batch, dtype):
    from streamfit._engine.steps.check_plan import CheckPlan

    X, y = _stream(n=256, dtype=dtype)
    runs = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(mlp_model([10, 80, 64, 1], "Relu", seed=1, dtype=dtype), step=step,
                          learning_rate=InvScaling(0.02),
                          penalty=Penalty(1e-3, 0.0))  # L2: the bound grows by the decay factor too
        for i in range(0, 256, batch):
            trainer.step(X[i:i + batch], y[i:i + batch])
        runs[step] = trainer
    fused = runs["fused"]
    assert CheckPlan.of(fused._strategy.model).bounded == ("W1",)  # 80x64: checked by the bound
    assert fused._strategy._bound.exact_checks == 0 and fused.n_skipped == 0
    for name, w in fused.get_weights().items():
        np.testing.assert_allclose(w, runs["forward_backward"].get_weights()[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_bounded_check_refuses_an_overflowing_update_of_a_bounded_weight():
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((4, 64)) * 100).astype(np.float32)
    y = rng.standard_normal((4, 64)).astype(np.float32)
    trainer = Trainer(_no_bias_mlp(), learning_rate=1e36, on_nonfinite="skip")
    before = trainer.get_weights()
    H = np.maximum(X @ before["W0"], 0)
    dY = (H @ before["W1"] - y) * np.float32(1e36 / 4)
    with np.errstate(over="ignore"):
        assert np.isfinite(dY).all() and not np.isfinite(before["W1"] - H.T @ dY).all()  # the update overflows
    trainer.step(X, y)  # finite loss (computed before the update)
    assert np.isfinite(trainer.last_loss)
    assert trainer.n_skipped == 1 and trainer.n_steps == 0
    assert trainer._strategy._bound.exact_checks == 1  # the bound could not prove it; the exact check refused
    for name, w in trainer.get_weights().items():
        np.testing.assert_array_equal(w, before[name])


def test_bounded_check_applies_a_finite_step_it_cannot_prove_and_resumes_bounding():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 64)).astype(np.float32)
    X[:, 0] = 0.0  # row 0 of W0 neither reaches the output nor gets a gradient
    y = rng.standard_normal((2, 64)).astype(np.float32)
    trainer = Trainer(_no_bias_mlp(), learning_rate=1e-3)
    weights = trainer.get_weights()
    weights["W0"][0, :] = 1e38  # finite, but above the bound's limit (a quarter of float32's max)
    trainer.set_weights(weights)
    trainer.step(X, y)
    bound = trainer._strategy._bound
    assert trainer.n_steps == 1 and bound.exact_checks == 1
    after = trainer.get_weights()
    assert not np.array_equal(after["W1"], weights["W1"])  # the step was applied
    weights["W0"][0, :] = 1.0
    trainer.set_weights(weights)  # a write: the bound is recomputed from the values
    trainer.step(X, y)
    assert trainer.n_steps == 2 and bound.exact_checks == 1 and bound.bound < 1e3


def test_single_element_weights_are_checked_on_the_host():
    # on CPU the fused SGD graph has no ReduceSum for a one-element weight: the step reads its new value
    X, y = _stream(n=32)
    trainer = Trainer(linear_model(10, seed=1), weights=["B"], learning_rate=3e38, on_nonfinite="skip")
    before = trainer.get_weights()
    trainer.step(X, np.full_like(y, -100))  # finite loss; lr * mean residual overflows: the new bias is -inf
    assert np.isfinite(trainer.last_loss) and trainer.n_skipped == 1 and trainer.n_steps == 0
    np.testing.assert_array_equal(trainer.get_weights()["B"], before["B"])
    assert not any(n.op_type == "ReduceSum" and n.input[0] == "B__new" for n in trainer._strategy.model.graph.node)
    trainer.lr_scale = 1e-38
    trainer.step(X, y)  # a sane step (lr 3): applied, the weights now live in the other buffer set
    assert trainer.n_steps == 1
    applied = trainer.get_weights()["B"]
    trainer.lr_scale = 1.0
    trainer.step(X, np.full_like(y, -100))  # refused in this direction too
    assert trainer.n_skipped == 2 and trainer.n_steps == 1
    np.testing.assert_array_equal(trainer.get_weights()["B"], applied)


def test_large_batches_of_little_work_run_on_one_thread_unless_threads_are_given():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2048, 10)).astype(np.float32)
    y = X.sum(axis=1)
    light = Trainer(linear_model(10, seed=0), learning_rate=0.01)  # 2048 rows x 11 weights: light work
    light.step(X, y)
    fused = light._strategy
    assert fused._large_light_session is not None and fused._large_session is None
    heavy = Trainer(mlp_model([10, 256, 256, 1], seed=0), learning_rate=1e-3)  # 2048 x 69K weights: heavy
    heavy.step(X, y)
    assert heavy._strategy._large_session is not None and heavy._strategy._large_light_session is None
    given = Trainer(linear_model(10, seed=0), learning_rate=0.01, threads=2)  # the caller's thread count wins
    given.step(X, y)
    assert given._strategy._large_session is not None and given._strategy._large_light_session is None
    # both sessions run the same large-batch graph: the same weights (up to the threads' summation order)
    np.testing.assert_allclose(light.get_weights()["W"], given.get_weights()["W"], rtol=1e-6, atol=1e-7)
