"""Every loss: numpy gradient vs finite differences, ONNX graph vs numpy, model gradients vs finite differences."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from streamfit._engine.common.names import Names
from streamfit._engine.steps.step_graphs import build_loss_model
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.losses import (AbsoluteError, BinaryLogLoss, ElasticError, EpsilonInsensitive, Hinge, Huber,
                              ModifiedHuber, ProbabilityLogLoss, SoftmaxCrossEntropy, SquaredEpsilonInsensitive,
                              SquaredError, SquaredHinge, get_loss)
from tests.engine.helpers import finite_difference

REGRESSION = [SquaredError(), AbsoluteError(), Huber(delta=0.7), ElasticError(l1=0.3, l2=0.6),
              EpsilonInsensitive(epsilon=0.3), SquaredEpsilonInsensitive(epsilon=0.3)]
MARGIN = [Hinge(), Hinge(threshold=0.0), SquaredHinge(), ModifiedHuber()]  # labels 0/1, one-vs-rest columns
ALL = REGRESSION + MARGIN + [BinaryLogLoss(), SoftmaxCrossEntropy(), ProbabilityLogLoss()]


def _ids(loss):
    return loss.name + "".join(f"-{v}" for v in loss.get_params().values())


def _data(loss, n=7, k=3, seed=0, columns=1):
    rng = np.random.default_rng(seed)
    width = k if loss.integer_labels else columns
    y = rng.standard_normal((n, width)) * 2
    if isinstance(loss, ProbabilityLogLoss):
        y = np.exp(y) / np.exp(y).sum(axis=1, keepdims=True)
    if loss.integer_labels:
        t = rng.integers(0, k, n)
    elif isinstance(loss, BinaryLogLoss) or loss in MARGIN:
        t = rng.integers(0, 2, (n, width)).astype(np.float64)
    else:
        t = y + rng.standard_normal((n, width))  # residuals away from the kinks of |r|, Huber and the tube
    sw = rng.uniform(0.5, 2.0, n)
    return y, t, sw


@pytest.mark.parametrize("columns", [1, 3])
@pytest.mark.parametrize("loss", ALL, ids=_ids)
def test_numpy_gradient_matches_finite_differences(loss, columns):
    y, t, sw = _data(loss, columns=columns)
    _, dy = loss.numpy(y, t, sw)
    fd = finite_difference(lambda: loss.numpy(y, t, sw)[0], y)
    np.testing.assert_allclose(dy, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("columns", [1, 3])
@pytest.mark.parametrize("loss", ALL, ids=_ids)
def test_onnx_loss_graph_matches_numpy(loss, columns):
    y, t, sw = _data(loss, columns=columns)
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


_OLD = {"squared_error", "absolute_error", "huber", "elastic", "log_loss", "softmax_cross_entropy"}
MODEL_CASES = [(m, loss) for loss in ALL if not isinstance(loss, ProbabilityLogLoss) for m in sorted(MODELS)
               if loss.name in _OLD or m in ("linear", "mlp_relu")]  # the newer losses on two models (time)


@pytest.mark.parametrize(("model", "loss"), MODEL_CASES, ids=[f"{m}-{_ids(l)}" for m, l in MODEL_CASES])
@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_model_gradient_matches_finite_differences(model, loss, step):
    k = 3 if loss.integer_labels else 1
    rng = np.random.default_rng(5)
    X = rng.standard_normal((9, 4))
    trainer = Trainer(MODELS[model](k), loss=loss, optimizer="sgd", learning_rate=1.0, step=step)
    y0 = trainer.predict(X)
    _, t, sw = _data(loss, n=9, k=k, seed=6)
    if loss in REGRESSION:
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


def _sklearn_twin(loss):
    sgd = pytest.importorskip("sklearn.linear_model._sgd_fast")
    return {"hinge": lambda l: sgd.Hinge(l.threshold), "squared_hinge": lambda l: sgd.SquaredHinge(l.threshold),
            "modified_huber": lambda l: sgd.ModifiedHuber(),
            "epsilon_insensitive": lambda l: sgd.EpsilonInsensitive(l.epsilon),
            "squared_epsilon_insensitive": lambda l: sgd.SquaredEpsilonInsensitive(l.epsilon)}[loss.name](loss)


@pytest.mark.parametrize("loss", MARGIN + REGRESSION[-2:], ids=_ids)
def test_margin_and_tube_losses_are_scikit_learns(loss):
    """Value and (sub)gradient equal scikit-learn's SGD losses, kinks included (labels -1/+1 there, 0/1 here)."""
    twin = _sklearn_twin(loss)
    z = np.array([-3.0, -1.0, -0.3, 0.0, 0.3, 1.0, 1.3, 3.0])
    for target in (0.0, 1.0):
        sk_y = (2 * target - 1) if loss in MARGIN else target
        t = np.full((len(z), 1), target)
        _, dy = loss.numpy(z.reshape(-1, 1), t)
        per_row = [loss.numpy(np.array([[v]]), np.array([[target]]))[0] for v in z]
        np.testing.assert_allclose(per_row, [twin.py_loss(v, sk_y) for v in z], atol=1e-12)
        np.testing.assert_allclose(dy.ravel() * len(z), [twin.py_dloss(v, sk_y) for v in z], atol=1e-12)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_probability_log_loss_through_softmax_steps_as_cross_entropy_on_logits(step):
    """A model ending in Softmax trained on its probabilities takes softmax cross-entropy's step on its logits."""
    from onnx import helper

    logits = linear_model(4, 3, seed=1)  # float32: ORT's SoftmaxGrad has no float64 kernel
    probs = linear_model(4, 3, seed=1)
    out = probs.graph.output[0].name
    for node in probs.graph.node:
        node.output[:] = [o + "_z" if o == out else o for o in node.output]
    probs.graph.node.append(helper.make_node("Softmax", [out + "_z"], [out], axis=-1))
    rng = np.random.default_rng(3)
    X, t = rng.standard_normal((9, 4)).astype(np.float32), rng.integers(0, 3, 9)
    a = Trainer(logits, loss=SoftmaxCrossEntropy(), optimizer="sgd", learning_rate=0.5, step=step)
    b = Trainer(probs, loss=ProbabilityLogLoss(), optimizer="sgd", learning_rate=0.5, step=step)
    for _ in range(3):
        assert b.step(X, t) == pytest.approx(a.step(X, t), rel=1e-5)
    for name, value in a.get_weights().items():
        np.testing.assert_allclose(b.get_weights()[name], value, rtol=1e-5, atol=1e-6)
