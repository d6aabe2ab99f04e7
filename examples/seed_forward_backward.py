"""The seed example, reproduced: a linear regression trained with the forward/backward step.

onnxcustom's "Train a linear regression with forward backward" fits scikit-learn's identity-activation
``MLPRegressor(hidden_layer_sizes=())`` (a linear regression) on ``make_regression(n_features=2, bias=2)``,
converts it to ONNX with skl2onnx, and trains the ONNX graph's weights with onnxruntime-training's
TrainingAgent: forward, a loss graph giving dL/dY, backward, an update graph.  streamfit's
``step="forward_backward"`` is that design.  The ONNX weights are zeroed first so both trainings start
from scratch and their loss curves compare; the coefficients are printed side by side and the curves
are plotted to ``<out>/seed_forward_backward.png``.

    python examples/seed_forward_backward.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from skl2onnx import to_onnx  # noqa: E402
from sklearn.datasets import make_regression  # noqa: E402
from sklearn.neural_network import MLPRegressor  # noqa: E402

from streamfit import OnnxRegressor  # noqa: E402

EPOCHS, BATCH, LR = 100, 10, 1e-2


def main(out: Path) -> None:
    X, y = make_regression(n_features=2, bias=2, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), y.astype(np.float32)

    # scikit-learn: plain minibatch SGD on the squared error, no penalty, no momentum
    mlp = MLPRegressor(hidden_layer_sizes=(), activation="identity", solver="sgd", batch_size=BATCH,
                       learning_rate_init=LR, alpha=0, momentum=0, nesterovs_momentum=False, max_iter=EPOCHS,
                       n_iter_no_change=EPOCHS, shuffle=False, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter is the plan
        mlp.fit(X, y)

    # the same model in ONNX (MatMul + Add; its shape initializer is not a weight), from zero weights
    onx = to_onnx(mlp, X[:1], target_opset=15)
    for init in onx.graph.initializer:
        if init.name in ("coefficient", "intercepts"):
            init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    reg = OnnxRegressor(onx, step="forward_backward", optimizer="sgd", learning_rate="constant", eta0=LR,
                        penalty=None, batch_size=BATCH, max_iter=EPOCHS)
    reg.fit(X, y)

    weights = reg.trainer_.get_weights()
    print("trained weights:", reg.trainer_.weight_names)
    print(f"{'':12s}{'streamfit':>12s}{'scikit-learn':>14s}")
    for i, (a, b) in enumerate(zip(weights["coefficient"].ravel(), mlp.coefs_[0].ravel())):
        print(f"{f'coef[{i}]':12s}{a:12.4f}{b:14.4f}")
    print(f"{'intercept':12s}{weights['intercepts'].ravel()[0]:12.4f}{mlp.intercepts_[0][0]:14.4f}")
    print(f"last epoch loss: streamfit {reg.loss_curve_[-1]:.4f}, scikit-learn {mlp.loss_curve_[-1]:.4f}")

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, len(reg.loss_curve_) + 1), reg.loss_curve_, label="streamfit (forward_backward)")
    ax.plot(np.arange(1, len(mlp.loss_curve_) + 1), mlp.loss_curve_, "--", label="scikit-learn MLPRegressor")
    ax.set(xlabel="epoch", ylabel="mean loss (squared error / 2)", yscale="log",
           title="Linear regression: training loss against epochs")
    ax.legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "seed_forward_backward.png", dpi=100)
    print("plot:", out / "seed_forward_backward.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    main(parser.parse_args().out)
