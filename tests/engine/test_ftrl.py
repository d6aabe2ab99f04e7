"""FTRL-Proximal against McMahan et al. 2013, Algorithm 1, written per coordinate in plain Python."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamfit._engine.testing import linear_model
from streamfit._engine.trainer import Trainer
from streamfit.optim import FTRL, get_optimizer


def mcmahan(X, y, batch, steps, alpha, beta, l1, l2, summed=True):
    """Algorithm 1 per coordinate (the bias is coordinate d, with x = 1); a batch's gradient is the sum of its
    rows' (each row one of McMahan's examples), or their mean with ``summed=False``."""
    d = X.shape[1] + 1
    z, n = [0.0] * d, [0.0] * d
    for t in range(steps):
        lo = (t * batch) % len(X)
        rows = range(lo, lo + batch)
        w = [0.0 if abs(z[i]) <= l1 else -(z[i] - math.copysign(l1, z[i])) / ((beta + math.sqrt(n[i])) / alpha + l2)
             for i in range(d)]
        g = [0.0] * d
        for r in rows:
            x = list(X[r]) + [1.0]
            p = 1.0 / (1.0 + math.exp(-sum(wi * xi for wi, xi in zip(w, x))))
            for i in range(d):
                g[i] += (p - y[r]) * x[i] / (1 if summed else batch)
        for i in range(d):
            sigma = (math.sqrt(n[i] + g[i] ** 2) - math.sqrt(n[i])) / alpha
            z[i] += g[i] - sigma * w[i]
            n[i] += g[i] ** 2
    w = [0.0 if abs(z[i]) <= l1 else -(z[i] - math.copysign(l1, z[i])) / ((beta + math.sqrt(n[i])) / alpha + l2)
         for i in range(d)]
    return np.array(w), np.array(z), np.array(n)


def _data(seed=0, rows=120, features=6):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, features)) * (rng.random((rows, features)) < 0.5)  # sparse-ish rows
    logit = 2.0 * X[:, 0] - 1.5 * X[:, 1] + 0.3
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    return X, y


@pytest.mark.parametrize("step", ["fused", pytest.param("forward_backward", marks=pytest.mark.needs_ort_training)])
@pytest.mark.parametrize("batch,beta,l1,l2,summed", [(1, 1.0, 0.0, 0.0, True), (1, 0.5, 0.05, 0.1, True),
                                                     (4, 1.0, 0.02, 0.0, True), (8, 0.5, 0.02, 0.1, True),
                                                     (4, 1.0, 0.02, 0.0, False)])
def test_ftrl_matches_mcmahan_per_coordinate(step, batch, beta, l1, l2, summed):
    X, y = _data()
    alpha = 0.3
    trainer = Trainer(linear_model(X.shape[1], dtype=np.float64), loss="log_loss",
                      optimizer=FTRL(beta=beta, l1=l1, l2=l2, summed=summed), learning_rate=alpha, step=step)
    for t in range(100):
        lo = (t * batch) % len(X)
        trainer.step(X[lo:lo + batch], y[lo:lo + batch])
    w_ref, z_ref, n_ref = mcmahan(X, y, batch, 100, alpha, beta, l1, l2, summed)
    got = trainer.get_weights()
    w = np.concatenate([got["W"].ravel(), got["B"].ravel()])
    np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-12)
    state = trainer.optimizer_state()
    np.testing.assert_allclose(np.concatenate([state["W__z"].ravel(), state["B__z"]]), z_ref, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([state["W__n"].ravel(), state["B__n"]]), n_ref, rtol=1e-5, atol=1e-12)


def test_ftrl_l1_gives_exact_zeros():
    X, y = _data(seed=1, rows=400, features=8)  # only features 0 and 1 matter
    trainer = Trainer(linear_model(8, dtype=np.float64), loss="log_loss", optimizer=FTRL(l1=8.0),  # per row: 2 per row of a mean
                      learning_rate=0.5)
    for t in range(100):
        trainer.step(X[t * 4:t * 4 + 4], y[t * 4:t * 4 + 4])
    w = trainer.get_weights()["W"].ravel()
    z = trainer.optimizer_state()["W__z"].ravel()
    assert w[0] > 0 and w[1] < 0
    np.testing.assert_array_equal(w == 0.0, np.abs(z) <= 8.0)  # zero exactly where |z| <= l1
    assert (w[2:] == 0.0).sum() >= 4 and not np.any(np.signbit(w[w == 0.0]))  # +0.0, not tiny values


def test_ftrl_by_name_and_validation():
    assert isinstance(get_optimizer("ftrl", l1=0.1), FTRL)
    with pytest.raises(ValueError, match="l1 must be >= 0.0"):
        FTRL(l1=-1)
