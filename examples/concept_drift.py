"""Continuing a fitted scikit-learn model online through a concept drift.

A ``SGDRegressor`` is fitted on historical data; ``streamfit.from_sklearn`` turns it into a streamfit
estimator with the same weights and learning-rate schedule.  Then the stream goes on, and halfway the
relation between features and target changes.  The frozen scikit-learn model stays wrong after the
drift; the online model, predicting each batch before training on it, recovers.  The per-batch errors
are plotted to ``<out>/concept_drift.png``.

    python examples/concept_drift.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.linear_model import SGDRegressor  # noqa: E402

from streamfit import from_sklearn  # noqa: E402

N_BATCHES, ROWS, DRIFT_AT = 60, 100, 20
BEFORE, AFTER = np.array([2.0, -1.0, 0.5, 0.0, 3.0]), np.array([-1.0, 2.0, 0.5, 1.5, 1.0])


def batch(rng: np.random.Generator, coef: np.ndarray, intercept: float, rows: int = ROWS):
    X = rng.standard_normal((rows, len(coef)))
    return X, X @ coef + intercept + 0.3 * rng.standard_normal(rows)


def main(out: Path) -> None:
    rng = np.random.default_rng(0)
    X_hist, y_hist = batch(rng, BEFORE, 1.0, rows=2000)
    frozen = SGDRegressor(max_iter=5, tol=None, random_state=0).fit(X_hist, y_hist)
    online = from_sklearn(frozen)  # same weights, same schedule (continued from frozen.t_)

    errors: dict[str, list[float]] = {"frozen scikit-learn": [], "streamfit online": []}
    for i in range(N_BATCHES):
        X, y = batch(rng, BEFORE, 1.0) if i < DRIFT_AT else batch(rng, AFTER, -2.0)
        errors["frozen scikit-learn"].append(float(np.mean((frozen.predict(X) - y) ** 2)))
        errors["streamfit online"].append(float(np.mean((online.predict(X) - y) ** 2)))  # before training
        online.partial_fit(X, y)

    for name, errs in errors.items():
        print(f"{name:20s} MSE before drift {np.mean(errs[:DRIFT_AT]):7.3f}, "
              f"last 10 batches {np.mean(errs[-10:]):7.3f}")
    print("online coefficients after the drift:", np.round(online.coef_, 2), "(new relation:", AFTER, ")")

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, errs in errors.items():
        ax.plot(np.arange(N_BATCHES), errs, label=name)
    ax.axvline(DRIFT_AT - 0.5, color="grey", linestyle=":", label="concept drift")
    ax.set(xlabel="batch (predicted before training)", ylabel="batch MSE", yscale="log",
           title="A fitted model, frozen vs continued online through a drift")
    ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "concept_drift.png", dpi=100)
    print("plot:", out / "concept_drift.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    main(parser.parse_args().out)
