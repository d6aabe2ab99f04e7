"""A custom loss, optimizer and penalty written against the public API only, trained on a real model and
checked against numpy references step by step, in both step strategies."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from streamfit import Penalty, Trainer
from streamfit.graph import GraphBuilder
from streamfit.losses import Loss
from streamfit.optim import SGD, Optimizer
from streamfit.testing import mlp_model

STEPS = ("fused", "forward_backward")


def test_this_file_uses_the_public_api_only():
    tree = ast.parse(Path(__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [f"{m}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 for m in [n.module or ""] for a in n.names]
    private = [m for m in imported if m.startswith("streamfit") and any(p.startswith("_") for p in m.split("."))]
    assert "streamfit.graph" in imported and not private, private


class Pinball(Loss):
    """The quantile loss: ``tau * r`` when ``r = t - y > 0``, ``(tau - 1) * r`` otherwise."""

    name = "pinball"

    def __init__(self, tau: float = 0.5) -> None:
        self.tau = tau

    def get_params(self):
        return {"tau": self.tau}

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", t, y)
        loss = b.op("Max", b.op("Mul", r, b.const(self.tau)), b.op("Mul", r, b.const(self.tau - 1.0)))
        return loss, b.op("Where", b.op("Greater", r, b.const(0.0)), b.const(-self.tau), b.const(1.0 - self.tau))

    def numpy_terms(self, y, t):
        r = t - y
        return np.maximum(self.tau * r, (self.tau - 1) * r), np.where(r > 0, -self.tau, 1 - self.tau)


class RMSprop(Optimizer):
    """``v <- rho * v + (1 - rho) * g**2; w <- w - lr_t * g / (sqrt(v) + eps)``, with a linear warm-up of
    the rate fed as a scalar of its own (``lr_t = lr * min(1, (t + 1) / warmup)``)."""

    name = "rmsprop"
    slots = ("square_avg",)
    scalar_names = ("lr", "lr_t")

    def __init__(self, rho: float = 0.9, eps: float = 1e-6, warmup: int = 4) -> None:
        self.rho, self.eps, self.warmup = rho, eps, warmup

    def get_params(self):
        return {"rho": self.rho, "eps": self.eps, "warmup": self.warmup}

    def scalars(self, lr: float, t: int) -> tuple[float, ...]:
        return lr, lr * min(1.0, (t + 1) / self.warmup)

    def update(self, b, w, g, state, s):
        v = b.op("Add", b.op("Mul", state["square_avg"], b.const(self.rho)),
                 b.op("Mul", b.op("Mul", g, g), b.const(1.0 - self.rho)))
        step = b.op("Div", b.op("Mul", g, s["lr_t"]), b.op("Add", b.op("Sqrt", v), b.const(self.eps)))
        return b.op("Sub", w, step), {"square_avg": v}

    def numpy_update(self, w, g, state, s):
        v = self.rho * state["square_avg"] + (1 - self.rho) * g * g
        return w - s["lr_t"] * g / (np.sqrt(v) + self.eps), {"square_avg": v}


class SignSGD(Optimizer):
    """``w <- w - lr * sign(g)``: no state."""

    name = "sign_sgd"

    def update(self, b, w, g, state, s):
        return b.op("Sub", w, b.op("Mul", b.op("Sign", g), s["lr"])), {}

    def numpy_update(self, w, g, state, s):
        return w - s["lr"] * np.sign(g), {}


# -- a numpy reference: the 4-8-1 tanh MLP of mlp_model, its gradients, and the rules above ------------------
def _gradients(w, X, t, tau):
    """Pinball loss of the MLP ``tanh(X W0 + B0) W1 + B1`` (mean over rows) and its gradients."""
    H = np.tanh(X @ w["W0"] + w["B0"])
    Y = H @ w["W1"] + w["B1"]
    r = t.reshape(Y.shape) - Y
    loss = float(np.maximum(tau * r, (tau - 1) * r).mean())
    dY = np.where(r > 0, -tau, 1 - tau) / len(X)
    dZ = (dY @ w["W1"].T) * (1 - H * H)
    return loss, {"W1": H.T @ dY, "B1": dY.sum(0), "W0": X.T @ dZ, "B0": dZ.sum(0)}


def _reference(weights, batches, tau, rule):
    """Weights and losses after each batch, ``rule(name, w, g, t) -> new w`` applying one step."""
    w = {k: v.copy() for k, v in weights.items()}
    losses = []
    for t, (X, y) in enumerate(batches):
        loss, grads = _gradients(w, X, y, tau)
        losses.append(loss)
        w = {k: rule(k, w[k], grads[k], t) for k in w}
    return w, losses


def _batches(n_batches=12, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_batches):
        n = 69 if k == n_batches - 1 else 8  # the last one runs the fused step's large-batch graph
        X = rng.standard_normal((n, 4))
        out.append((X, np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)))
    return out


@pytest.mark.parametrize("step", STEPS)
def test_pinball_loss_with_rmsprop_matches_numpy_over_steps(step):
    tau, lr = 0.8, 0.05
    batches = _batches()
    opt = RMSprop(rho=0.9, eps=1e-6, warmup=4)
    trainer = Trainer(mlp_model([4, 8, 1], "Tanh", dtype=np.float64, seed=3), loss=Pinball(tau), optimizer=opt,
                      learning_rate=lr, step=step)
    start = trainer.get_weights()
    state = {k: np.zeros_like(v) for k, v in start.items()}

    def rmsprop(name, w, g, t):
        w_new, new = opt.numpy_update(w, g, {"square_avg": state[name]}, dict(zip(opt.scalar_names, opt.scalars(lr, t))))
        state[name] = new["square_avg"]
        return w_new

    expected, expected_losses = _reference(start, batches, tau, rmsprop)
    losses = [trainer.step(X, y) for X, y in batches]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)
    for name, w in trainer.get_weights().items():
        np.testing.assert_allclose(w, expected[name], rtol=1e-9, atol=1e-12, err_msg=name)
    saved = trainer.state_dict()["optimizer"]  # the slots: one array per weight, keyed <weight>__<slot>
    assert sorted(saved) == sorted(f"{w}__square_avg" for w in start)
    for name in start:
        np.testing.assert_allclose(saved[f"{name}__square_avg"], state[name], rtol=1e-9, atol=1e-15)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("step", STEPS)
def test_sign_sgd_matches_numpy_over_steps(step):
    batches, lr, tau = _batches(seed=1), 0.01, 0.7  # no batch of 8 or 69 rows has dL/dB1 = 0 (sign(0) = 0)
    trainer = Trainer(mlp_model([4, 8, 1], "Tanh", dtype=np.float64, seed=3), loss=Pinball(tau), optimizer=SignSGD(),
                      learning_rate=lr, step=step)
    expected, _ = _reference(trainer.get_weights(), batches, tau, lambda name, w, g, t: w - lr * np.sign(g))
    for X, y in batches:
        trainer.step(X, y)
    for name, w in trainer.get_weights().items():
        np.testing.assert_allclose(w, expected[name], rtol=1e-12, atol=1e-12, err_msg=name)


# -- the fused fast path is declared by the optimizer (and the penalty), not guessed from its type -----------
class HalfRateSGD(SGD):
    """Plain SGD at half the schedule's rate: a rule of its own (its scalars), so no SGD fast path."""

    def scalars(self, lr: float, t: int) -> tuple[float, ...]:
        return (lr / 2,)


class RenamedSGD(SGD):
    """SGD under another name, rule unchanged: keeps the fast path."""

    name = "my_sgd"


class TowardOne(Penalty):
    """An L2 penalty that pulls the weights toward 1 instead of 0 (not a weight decay)."""

    def gradient(self, b: GraphBuilder, w: str, g: str) -> str:
        return b.op("Add", g, b.op("Mul", b.op("Sub", w, b.const(1.0)), b.const(self.l2)))

    def numpy_gradient(self, w, g):
        return g + self.l2 * (w - 1.0)


@pytest.mark.parametrize("step", STEPS)
def test_sgd_subclasses_and_penalties_get_the_fast_path_only_when_it_computes_their_rule(step):
    batches, lr = _batches(seed=2), 0.05
    model = mlp_model([4, 8, 1], "Tanh", dtype=np.float64, seed=3)
    assert SGD().folds_into_gradients() and RenamedSGD().folds_into_gradients()
    assert not HalfRateSGD().folds_into_gradients() and not RMSprop().folds_into_gradients()
    assert Penalty(0.1, 0.0).folds_into_decay() and not TowardOne(0.1, 0.0).folds_into_decay()
    cases = {"half": (HalfRateSGD(), None, lambda k, w, g, t: w - lr / 2 * g),
             "renamed": (RenamedSGD(), None, lambda k, w, g, t: w - lr * g),
             # the penalty applies to the weights multiplied with (W0, W1), not to the biases
             "toward_one": (SGD(), TowardOne(0.1, 0.0),
                            lambda k, w, g, t: w - lr * (g + 0.1 * (w - 1.0) * k.startswith("W")))}
    for case, (opt, penalty, rule) in cases.items():
        trainer = Trainer(model, loss=Pinball(0.5), optimizer=opt, penalty=penalty, learning_rate=lr, step=step)
        expected, _ = _reference(trainer.get_weights(), batches, 0.5, rule)
        for X, y in batches:
            trainer.step(X, y)
        for name, w in trainer.get_weights().items():
            np.testing.assert_allclose(w, expected[name], rtol=1e-10, atol=1e-12, err_msg=f"{case} {name}")
