"""Every optimizer (with and without penalties) against a numpy reference over 100 steps, in float64."""

from __future__ import annotations

import numpy as np
import pytest

from streamfit._engine.testing import linear_model
from streamfit._engine.trainer import Trainer
from streamfit.optim import FTRL, RowWiseAdaGrad, SGD, AdaGrad, Adam, AdamW, Momentum, Nesterov, get_optimizer
from streamfit.penalties import Penalty, get_penalty
from streamfit.schedules import InvScaling

OPTIMIZERS = [SGD(), Momentum(0.8), Nesterov(0.9), Adam(), Adam(beta1=0.5, beta2=0.9, eps=1e-6), AdamW(weight_decay=0.1),
              AdaGrad(eps=1e-8), FTRL(beta=0.5, l1=0.01, l2=0.1), RowWiseAdaGrad(eps=1e-8)]
PENALTIES = [None, Penalty(alpha=0.01, l1_ratio=0.0), Penalty(alpha=0.02, l1_ratio=1.0), Penalty(alpha=0.03, l1_ratio=0.4)]


def numpy_run(opt, penalty, X, y, sw, steps, batch, eta0, power_t=0.25):
    """Reference: a numpy linear model trained with the same rule (squared error, invscaling rate).

    ``sw``: the sample weights, or a function (step, slice) -> the weights that step used."""
    rng = np.random.default_rng(1)
    w = {"W": (rng.standard_normal((X.shape[1], 1)) * 0.1), "B": np.zeros(1)}
    state = {k: opt.init_state(v) for k, v in w.items()}
    for t in range(steps):
        sl = slice((t * batch) % len(X), (t * batch) % len(X) + batch)
        swb = (sw(t, sl) if callable(sw) else sw[sl]).reshape(-1, 1)
        xb, yb = X[sl], y[sl].reshape(-1, 1)
        n = len(xb)
        dy = (xb @ w["W"] + w["B"] - yb) * swb / (1 if opt.summed_gradient else n)  # FTRL: the summed loss
        grads = {"W": xb.T @ dy, "B": dy.sum(axis=0)}
        lr = eta0 / (t + 1) ** power_t
        scal = dict(zip(opt.scalar_names, opt.scalars(lr, t)))
        for k in w:
            g = grads[k]
            if penalty is not None and k == "W":  # biases are not penalized
                g = penalty.numpy_gradient(w[k], g)
            w[k], state[k] = opt.numpy_update(w[k], g, state[k], scal)
            if penalty is not None and k == "W":
                w[k] = penalty.numpy_proximal(w[k], lr)
    return w, state


@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda p: "none" if p is None else f"l1r{p.l1_ratio}")
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_optimizer_matches_numpy_reference(opt, penalty, step):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 5))
    y = X @ rng.standard_normal(5) + 0.3 + 0.1 * rng.standard_normal(60)
    sw = rng.uniform(0.5, 1.5, 60)
    trainer = Trainer(linear_model(5, dtype=np.float64, seed=1), optimizer=opt, penalty=penalty, step=step,
                      learning_rate=InvScaling(eta0=0.05, power_t=0.25))
    for t in range(100):
        sl = slice((t * 6) % 60, (t * 6) % 60 + 6)
        trainer.step(X[sl], y[sl], sample_weight=sw[sl])
    ref_w, ref_state = numpy_run(opt, penalty, X, y, sw, 100, 6, 0.05)
    got = trainer.get_weights()
    for k in ref_w:
        np.testing.assert_allclose(got[k], ref_w[k], rtol=1e-5, atol=1e-12, err_msg=k)
    got_state = trainer.optimizer_state()
    for k, slots in ref_state.items():
        for slot, value in slots.items():
            np.testing.assert_allclose(got_state[f"{k}__{slot}"], value, rtol=1e-5, atol=1e-12)
    assert trainer.n_steps == 100


def test_l1_penalty_gives_exact_zeros():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 6))
    y = X[:, 0] * 2.0  # only the first feature matters
    trainer = Trainer(linear_model(6, dtype=np.float64, seed=3), penalty=Penalty(alpha=0.05, l1_ratio=1.0),
                      learning_rate=0.05)
    for _ in range(20):
        for i in range(0, 200, 10):
            trainer.step(X[i:i + 10], y[i:i + 10])
    w = trainer.get_weights()["W"].ravel()
    assert w[0] > 1.5 and np.all(w[1:] == 0.0)


def test_penalty_scales_with_learning_rate():
    # with a zero gradient, plain SGD + L2 shrinks by (1 - lr * alpha) per step: the weights survive defaults
    trainer = Trainer(linear_model(2, dtype=np.float64, seed=1), penalty=Penalty(alpha=1e-4), learning_rate=0.01)
    w0 = trainer.get_weights()["W"]
    X = np.zeros((1, 2))
    for _ in range(1000):
        trainer.step(X, trainer.predict(X).ravel())
    np.testing.assert_allclose(trainer.get_weights()["W"], w0 * (1 - 0.01 * 1e-4) ** 1000, rtol=1e-10)


def test_names_and_validation():
    assert isinstance(get_optimizer("adamw", weight_decay=0.5), AdamW)
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        get_optimizer("rmsprop")
    with pytest.raises(ValueError, match=r"momentum must be in \[0.0, 1.0\), got 1.5"):
        Momentum(1.5)
    assert get_penalty("elasticnet", alpha=0.1, l1_ratio=0.3).l1 == pytest.approx(0.03)
    assert get_penalty(None) is None
    with pytest.raises(ValueError, match="unknown penalty"):
        get_penalty("l3")


@pytest.mark.parametrize("schedule", ["invscaling", "constant"])
@pytest.mark.parametrize("opt", [SGD(), Adam()], ids=repr)
def test_weighted_and_unweighted_batches_of_one_shape_alternate(opt, schedule):
    # the per-row loss/grad weights of a shape are refilled only when the weights or the lr change:
    # alternating sample_weight=None and given, under a changing and a constant lr, must stay exact
    from streamfit.schedules import Constant

    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 5))
    y = X @ rng.standard_normal(5) + 0.3 + 0.1 * rng.standard_normal(60)
    sw = rng.uniform(0.5, 1.5, 60)
    power_t = 0.25 if schedule == "invscaling" else 0.0
    for step in ("fused", "forward_backward"):
        lr = InvScaling(eta0=0.05, power_t=0.25) if schedule == "invscaling" else Constant(0.05)
        trainer = Trainer(linear_model(5, dtype=np.float64, seed=1), optimizer=opt, step=step, learning_rate=lr)
        for t in range(100):
            sl = slice((t * 6) % 60, (t * 6) % 60 + 6)
            weighted = t % 3 == 1
            trainer.step(X[sl], y[sl], sample_weight=sw[sl] if weighted else None)
        ref_w, _ = numpy_run(opt, None, X, y, _weights_as_used(sw), 100, 6, 0.05, power_t)
        got = trainer.get_weights()
        for k in ref_w:
            np.testing.assert_allclose(got[k], ref_w[k], rtol=1e-9, atol=1e-12, err_msg=f"{step} {k}")


def _weights_as_used(sw):
    """Per step t (batch t*6 % 60): the weights of the rows where t % 3 == 1, else ones."""
    return lambda t, sl: sw[sl] if t % 3 == 1 else np.ones(sl.stop - sl.start)


@pytest.mark.parametrize("t", [0, 7, 350, 20_000, 40_000, 65_400, 10**7])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.0, 0.5), (0.99, 0.9999)])
def test_adam_scalars_of_a_chunk_of_steps_are_those_of_each_step(t: int, betas: tuple[float, float]) -> None:
    """A chunk's bias corrections (vectorized, all 1 once the powers vanish) have the bits of one step's."""
    opt = Adam(beta1=betas[0], beta2=betas[1])
    lrs = np.linspace(0.01, 0.02, 300)
    table = opt.scalars_of_steps(lrs, t)
    assert np.array_equal(table, np.array([opt.scalars(lr, t + j) for j, lr in enumerate(lrs)]))
    again = opt.scalars_of_steps(lrs[:5], max(t - 3, 0))  # the powers are cached: an earlier window after a later one
    assert np.array_equal(again, np.array([opt.scalars(lr, max(t - 3, 0) + j) for j, lr in enumerate(lrs[:5])]))
