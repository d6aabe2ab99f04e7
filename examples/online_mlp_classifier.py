"""An MLP classifier trained online on a stream of batches, with progressive accuracy.

Progressive validation: every batch is predicted before the model trains on it, so each accuracy is
measured on rows the model has never seen.  The stream's features are on very different scales;
``standardize=True`` keeps running statistics and the exported ONNX model scales its own inputs.
The per-batch and cumulative accuracies are plotted to ``<out>/online_mlp_classifier.png``.

    python examples/online_mlp_classifier.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from sklearn.datasets import make_classification  # noqa: E402

from streamfit import MLPClassifier  # noqa: E402

N_BATCHES, ROWS = 150, 128


def stream(seed: int = 0):
    """Batches of a 3-class problem whose 8 features span six orders of magnitude."""
    X, y = make_classification(n_samples=N_BATCHES * ROWS, n_features=8, n_informative=6, n_redundant=0,
                               n_classes=3, n_clusters_per_class=2, class_sep=1.5, random_state=seed)
    X = X * np.logspace(-3, 3, 8) + np.linspace(-50, 50, 8)
    names = np.array(["red", "green", "blue"])[y]
    for i in range(0, len(X), ROWS):
        yield X[i:i + ROWS], names[i:i + ROWS]


def main(out: Path) -> None:
    clf = MLPClassifier(hidden_layer_sizes=(32, 16), eta0=0.005, standardize=True, random_state=0)
    accuracies, rows_seen = [], []
    for i, (X, y) in enumerate(stream()):
        if i:  # predict the batch first: the model has not seen these rows
            accuracies.append(float(np.mean(clf.predict(X) == y)))
            rows_seen.append(i * ROWS)
        clf.partial_fit(X, y, classes=["red", "green", "blue"])
    cumulative = np.cumsum(accuracies) / np.arange(1, len(accuracies) + 1)
    print(f"progressive accuracy: first 10 batches {np.mean(accuracies[:10]):.3f}, "
          f"last 10 batches {np.mean(accuracies[-10:]):.3f}, overall {cumulative[-1]:.3f}")

    X, y = next(stream(seed=1))  # the exported model standardizes its own raw inputs
    scores = ort.InferenceSession(clf.to_onnx().SerializeToString()).run(None, {"X": X.astype(np.float32)})[0]
    agree = np.mean(clf.classes_[scores.argmax(axis=1)] == clf.predict(X))
    print(f"exported ONNX model agrees with the estimator on {agree:.1%} of a fresh batch")

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(rows_seen, accuracies, ".", alpha=0.5, label="batch accuracy (predicted before training)")
    ax.plot(rows_seen, cumulative, label="cumulative progressive accuracy")
    ax.set(xlabel="rows trained on", ylabel="accuracy", ylim=(0, 1.02), title="MLPClassifier trained online")
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "online_mlp_classifier.png", dpi=100)
    print("plot:", out / "online_mlp_classifier.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    main(parser.parse_args().out)
