"""Every loss: numpy gradient vs finite differences, ONNX graph vs numpy, model gradients vs finite differences."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from streamfit._engine.build import Names, build_loss_model
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.losses import (AbsoluteError, BinaryLogLoss, ElasticError, Huber, SoftmaxCrossEntropy,
                              SquaredError, get_loss)
from tests.engine.helpers import finite_difference

REGRESSION = [SquaredError(), AbsoluteError(), Huber(delta=0.7), ElasticError(l1=0.3, l2=0.6)]
ALL = REGRESSION + [BinaryLogLoss(), SoftmaxCrossEntropy()]


def _data(loss, n=7, k=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.standard_normal((n, k if isinstance(loss, SoftmaxCrossEntropy) else 1)) * 2
    if isinstance(loss, SoftmaxCrossEntropy):
        t = rng.integers(0, k, n)
    elif isinstance(loss, BinaryLogLoss):
        t = rng.integers(0, 2, (n, 1)).astype(np.float64)
    else:
        t = y + rng.standard_normal((n, 1))  # residuals away from the kinks of |r| and Huber
    sw = rng.uniform(0.5, 2.0, n)
    return y, t, sw


@pytest.mark.parametrize("loss", ALL, ids=lambda l: l.name)
def test_numpy_gradient_matches_finite_differences(loss):
    y, t, sw = _data(loss)
    _, dy = loss.numpy(y, t, sw)
    fd = finite_difference(lambda: loss.numpy(y, t, sw)[0], y)
    np.testing.assert_allclose(dy, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("loss", ALL, ids=lambda l: l.name)
def test_onnx_loss_graph_matches_numpy(loss):
    y, t, sw = _data(loss)
    sess = ort.InferenceSession(build_loss_model(loss, np.dtype(np.float64), 2).SerializeToString())
    # the engine feeds the weighting as per-row vectors: loss_factor * sw / N and sw / N
    w = sw.reshape(-1, 1) / len(y)
    feeds = {"sf_y": y, Names.target: t, Names.loss_weight: loss.loss_factor * w, Names.grad_weight: w}
    value, dy = sess.run(None, feeds)
    ref_value, ref_dy = loss.numpy(y, t, sw)
    assert value == pytest.approx(ref_value, rel=1e-12)
    np.testing.assert_allclose(dy, ref_dy, rtol=1e-12)


def test_absolute_error_gradient_sign_points_uphill():
    # onnxcustom's absolute loss had the sign wrong: a prediction above the target must get a positive gradient
    _, dy = AbsoluteError().numpy(np.array([[3.0]]), np.array([[1.0]]))
    assert dy[0, 0] > 0


MODELS = {
    "linear": lambda k: linear_model(4, k, dtype=np.float64, seed=1),
    "linear_gemm": lambda k: linear_model(4, k, dtype=np.float64, seed=1, gemm=True),
    "mlp_relu": lambda k: mlp_model([4, 6, 5, k], "Relu", dtype=np.float64, seed=2),
    "mlp_tanh_gemm": lambda k: mlp_model([4, 6, k], "Tanh", dtype=np.float64, seed=3, gemm=True),
    "mlp_sigmoid": lambda k: mlp_model([4, 5, k], "Sigmoid", dtype=np.float64, seed=4),
}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("loss", ALL, ids=lambda l: l.name)
@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_model_gradient_matches_finite_differences(model, loss, step):
    k = 3 if isinstance(loss, SoftmaxCrossEntropy) else 1
    rng = np.random.default_rng(5)
    X = rng.standard_normal((9, 4))
    trainer = Trainer(MODELS[model](k), loss=loss, optimizer="sgd", learning_rate=1.0, step=step)
    y0 = trainer.predict(X)
    _, t, sw = _data(loss, n=9, k=k, seed=6)
    if not isinstance(loss, (SoftmaxCrossEntropy, BinaryLogLoss)):
        t = y0 + rng.standard_normal(y0.shape)
    before = trainer.get_weights()

    def loss_at() -> float:
        trainer.set_weights(weights)
        return loss.numpy(trainer.predict(X), t, sw)[0]

    weights = {k_: v.copy() for k_, v in before.items()}
    fd = {name: finite_difference(loss_at, weights[name]) for name in weights}
    trainer.set_weights(before)
    value = trainer.step(X, t, sample_weight=sw)
    after = trainer.get_weights()
    assert value == pytest.approx(loss.numpy(y0, t, sw)[0], rel=1e-10)
    for name in before:  # SGD with lr=1: the step is exactly the gradient
        np.testing.assert_allclose(before[name] - after[name], fd[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_get_loss_names_and_errors():
    assert isinstance(get_loss("mse"), SquaredError)
    assert get_loss("huber", delta=2.0).delta == 2.0
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        get_loss("nope")
    with pytest.raises(ValueError, match="delta must be > 0"):
        Huber(delta=0)
