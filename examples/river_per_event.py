"""Per-event learning beside River (docs/tutorials/river.md as one script).

streamfit's ready-made models as River estimators (``streamfit.river``) under River's own
``evaluate.progressive_val_score`` on River's bundled Phishing and TrumpApproval streams, beside River's
``StandardScaler() | LogisticRegression()`` / ``LinearRegression()``; then the Phishing stream as arrays, a chunk
of rows per ``partial_fit_predict`` call at ``batch_size=1``. It exits non-zero unless streamfit's progressive
accuracy is within 0.005 of River's and its MAE within 5 %, and plots both running metrics to
``<out>/river_per_event.png``.

    python examples/river_per_event.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from river import datasets, linear_model, metrics, preprocessing  # noqa: E402

import streamfit as sf  # noqa: E402
from streamfit.river import RiverClassifier, RiverRegressor  # noqa: E402


def running(model, dataset, metric) -> list[float]:
    """River's progressive validation by hand (predict, score, learn), the metric after every row."""
    out = []
    for x, y in dataset:
        metric.update(y, model.predict_one(x))
        model.learn_one(x, y)
        out.append(metric.get())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    parser.add_argument("--chunk", type=int, default=256, help="rows per partial_fit_predict call")
    args = parser.parse_args()
    curves = {
        "Phishing (accuracy)": (running(RiverClassifier(), datasets.Phishing(), metrics.Accuracy()),
                                running(preprocessing.StandardScaler() | linear_model.LogisticRegression(),
                                        datasets.Phishing(), metrics.Accuracy())),
        "TrumpApproval (MAE)": (running(RiverRegressor(), datasets.TrumpApproval(), metrics.MAE()),
                                running(preprocessing.StandardScaler() | linear_model.LinearRegression(),
                                        datasets.TrumpApproval(), metrics.MAE())),
    }
    (acc, river_acc), (mae, river_mae) = curves.values()
    print(f"Phishing accuracy: streamfit {acc[-1]:.4f}, River {river_acc[-1]:.4f}")
    print(f"TrumpApproval MAE: streamfit {mae[-1]:.4f}, River {river_mae[-1]:.4f}")

    data = list(datasets.Phishing())
    keys = list(data[0][0])
    X = np.array([[x[k] for k in keys] for x, _ in data], np.float32)
    y = np.array([label for _, label in data])
    clf = sf.LogisticRegression(batch_size=1)
    proba = np.concatenate([clf.partial_fit_predict(X[i:i + args.chunk], y[i:i + args.chunk], classes=[False, True])
                            for i in range(0, len(X), args.chunk)])
    chunked = float(np.mean((proba[:, 1] > 0.5) == y))
    print(f"Phishing as arrays, chunks of {args.chunk} rows at batch_size=1: accuracy {chunked:.4f}, {clf.t_} steps")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, (title, (ours, theirs)) in zip(axes, curves.items()):
        ax.plot(ours, label="streamfit (streamfit.river)")
        ax.plot(theirs, label="River", linestyle="--")
        ax.set_title(title)
        ax.set_xlabel("rows")
        ax.legend()
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "river_per_event.png"
    fig.savefig(path, dpi=80)
    print(f"plot: {path}")
    ok = acc[-1] >= river_acc[-1] - 0.005 and mae[-1] <= 1.05 * river_mae[-1] and clf.t_ == len(X)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
