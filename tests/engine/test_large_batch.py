"""The fused step's large-batch graph (its own kernel rewrites) against a numpy reference of the MLP step.

The large-batch graph swaps ORT's generated kernels for faster equivalents (ReluGrad -> a HardSigmoid or
Mul/Clip mask, ReduceSum bias gradients -> a GEMV with a ones row, ...).  Every rewrite must compute the same
step: here one SGD step of a ReLU MLP, with dead units (Relu output exactly 0) and large activations (where
``2**126 * y`` overflows), is compared with the same step computed in float64 numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from streamfit._engine.steps.fused import FusedStep
from streamfit._engine.testing import mlp_model
from streamfit._engine.trainer import Trainer

SIZES = [12, 48, 40, 3]


def _model(dtype, seed=4):
    model = mlp_model(SIZES, "Relu", dtype=dtype, seed=seed)
    for init in model.graph.initializer:  # biases that kill some units and push others far positive
        if init.name.startswith("B") and init.name != f"B{len(SIZES) - 2}":
            b = np.linspace(-3.0, 6.0, init.dims[0]).astype(dtype)
            init.CopyFrom(numpy_helper.from_array(b, init.name))
    return model


def _reference_sgd_step(weights, X, T, lr):
    """One SGD step of half squared error, mean over rows, in float64."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    n_layers = len(SIZES) - 1
    acts, h = [], X.astype(np.float64)
    for i in range(n_layers):
        acts.append(h)
        z = h @ w[f"W{i}"] + w[f"B{i}"]
        h = np.maximum(z, 0) if i < n_layers - 1 else z
    dz = (h - T) / len(X)
    new = {}
    for i in reversed(range(n_layers)):
        new[f"W{i}"] = w[f"W{i}"] - lr * acts[i].T @ dz
        new[f"B{i}"] = w[f"B{i}"] - lr * dz.sum(axis=0)
        if i:
            dz = (dz @ w[f"W{i}"].T) * (acts[i] > 0)
    return new, acts


def _large_graph(trainer):
    strategy = trainer._strategy
    assert isinstance(strategy, FusedStep) and strategy.large_model is not None
    return strategy.large_model.graph


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float32, 2e-5, 2e-6), (np.float64, 1e-11, 1e-13)])
@pytest.mark.parametrize("rows", [FusedStep.large_batch_rows, 300])
def test_large_batch_sgd_step_equals_numpy_reference(dtype, rtol, atol, rows):
    rng = np.random.default_rng(7)
    X = (rng.standard_normal((rows, SIZES[0])) * 2).astype(dtype)
    T = rng.standard_normal((rows, SIZES[-1])).astype(dtype)
    lr = 0.05
    trainer = Trainer(_model(dtype), optimizer="sgd", learning_rate=lr, step="fused", threads=2)
    before = trainer.get_weights()
    trainer.step(X, T)
    expected, acts = _reference_sgd_step(before, X, T, lr)
    # the data exercise both ends of the mask: dead units and activations large enough to overflow 2**126 * y
    hidden = np.concatenate([a.ravel() for a in acts[1:]])
    assert (hidden == 0).mean() > 0.1 and (hidden > 4).mean() > 0.05
    nodes = {n.op_type for n in _large_graph(trainer).node}
    assert "ReluGrad" not in nodes
    assert ("HardSigmoid" in nodes) == (dtype == np.float32)
    got = trainer.get_weights()
    for name, value in expected.items():
        assert got[name].dtype == dtype
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_large_batch_graph_trains_like_forward_backward_over_many_steps(optimizer):
    """ORT's own gradient graph (forward/backward strategy, ReluGrad kept) against the rewritten one."""
    rng = np.random.default_rng(3)
    X = (rng.standard_normal((2048, SIZES[0])) * 2).astype(np.float32)
    T = rng.standard_normal((2048, SIZES[-1])).astype(np.float32)
    runs = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(_model(np.float32), optimizer=optimizer, learning_rate=0.01, step=step, threads=2)
        losses = [trainer.step(X[i:i + 512], T[i:i + 512]) for _ in range(3) for i in range(0, 2048, 512)]
        runs[step] = trainer.get_weights(), losses
    for name, w in runs["fused"][0].items():
        np.testing.assert_allclose(w, runs["forward_backward"][0][name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(runs["fused"][1], runs["forward_backward"][1], rtol=1e-5)
    assert runs["fused"][1][-1] < runs["fused"][1][0]


ZOO = __import__("pathlib").Path(__file__).resolve().parents[1] / "zoo"


@pytest.mark.parametrize("rows", [FusedStep.large_batch_rows, 300])
def test_attention_bias_gradients_in_the_large_batch_graph(rows):
    """Attention's Gemms run on batch x sequence rows: the bias-gradient GEMV must not use the batch's
    ones vector there ("MatMul dimension mismatch" in .../self_attn/Gemm_Grad/dC_reduced_reduce before)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((rows, 5, 16)).astype(np.float32)
    y = rng.standard_normal(rows).astype(np.float32)
    weights = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(ZOO / "transformer_encoder.legacy.onnx", step=step, learning_rate=0.05)
        for _ in range(2):
            trainer.step(X, y)
        assert trainer.fallback is None
        weights[step] = trainer.get_weights()
    for name, value in weights["fused"].items():
        np.testing.assert_allclose(value, weights["forward_backward"][name], rtol=2e-4, atol=2e-6, err_msg=name)


def test_a_fused_graph_that_fails_falls_back_to_forward_backward_once_and_says_so(monkeypatch, caplog):
    """A large-batch graph that ORT refuses to run: the step is redone with forward/backward, logged."""
    import streamfit._engine.steps.fused as fused

    real = fused.build_fused

    def broken(*args, large_batch=False, **kwargs):
        model = real(*args, large_batch=large_batch, **kwargs)
        if large_batch:  # a node whose shapes cannot match at run time, as the bias-GEMV bug did
            node = next(n for n in model.graph.node if n.op_type == "Gemm")
            node.input[0] = node.input[1]
        return model

    monkeypatch.setattr(fused, "build_fused", broken)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((80, SIZES[-1])).astype(np.float32)
    reference = Trainer(_model(np.float32), step="forward_backward", learning_rate=0.01)
    trainer = Trainer(_model(np.float32), learning_rate=0.01)
    trainer.step(X[:8], y[:8])
    reference.step(X[:8], y[:8])
    with caplog.at_level("WARNING", logger="streamfit.engine"):
        for _ in range(3):
            assert trainer.step(X, y) == pytest.approx(reference.step(X, y), rel=1e-5)
    assert trainer.step_kind == "forward_backward" and "could not be" in trainer.fallback
    assert sum("falling back to step='forward_backward'" in r.message for r in caplog.records) == 1
    for name, value in trainer.get_weights().items():
        np.testing.assert_allclose(value, reference.get_weights()[name], rtol=1e-5, atol=1e-7)
