"""A PyTorch export trained online from Parquet (docs/tutorials/pytorch-parquet.md as one script).

The zoo's CNN (``tests/zoo/conv2d_bn_maxpool.legacy_train.onnx``: Conv2d + BatchNorm2d + MaxPool2d + Linear,
exported from PyTorch 2.13 in training mode) first predicts what PyTorch predicted, then keeps learning from
8x8 images stored as an Arrow ``fixed_shape_tensor`` column in Parquet files; its progressive loss per batch and
its held-out predictions are plotted to ``<out>/pytorch_parquet.png``.

    python examples/pytorch_parquet.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import streamfit  # noqa: E402

ZOO = Path(__file__).resolve().parents[1] / "tests" / "zoo"
MODEL = ZOO / "conv2d_bn_maxpool.legacy_train.onnx"  # x: float32 [N, 1, 8, 8] -> y: [N, 1]
IMAGE = pa.fixed_shape_tensor(pa.float32(), [1, 8, 8])


def images(rng: np.random.Generator, n: int) -> tuple[pa.ExtensionArray, np.ndarray]:
    """Random images and their target: the mean of the top-left quadrant."""
    x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    column = pa.ExtensionArray.from_storage(IMAGE, pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64))
    return column, x[:, 0, :4, :4].mean(axis=(1, 2)).astype(np.float32)


def main(out: Path, files: int) -> None:
    reference = np.load(ZOO / "conv2d_bn_maxpool.npz")
    before = streamfit.Trainer(str(MODEL)).predict(reference["in_x"])
    np.testing.assert_allclose(before, reference["out_0"], rtol=1e-4, atol=1e-5)
    print(f"before training the export predicts PyTorch's eval outputs (max |diff| "
          f"{np.abs(before - reference['out_0']).max():.1e})")

    rng = np.random.default_rng(0)
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as data:
        for part in range(files):
            column, y = images(rng, 4096)
            pq.write_table(pa.table({"image": column, "y": y}), f"{data}/part-{part}.parquet")
        reg = streamfit.OnnxRegressor(str(MODEL), inputs={"x": "image"}, optimizer="adam",
                                      learning_rate="constant", eta0=3e-3)
        streamfit.train_stream_sync(reg, f"parquet:{data}", label="y", batch_size=64,
                                    on_batch=lambda event: losses.append(event.loss))  # each batch's loss
    test_images, test_y = images(rng, 2000)
    predicted = reg.predict(pa.table({"image": test_images}))
    mse = float(np.mean((predicted - test_y) ** 2))
    print(f"trained {files * 4096} rows; held-out MSE {mse:.4f} (variance of the target {test_y.var():.4f})")

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(np.arange(1, len(losses) + 1) * 64, losses, lw=0.8)
    left.set(xlabel="rows trained on", ylabel="loss of the batch, before its step", yscale="log",
             title="progressive loss")
    right.plot(test_y, predicted, ".", alpha=0.3)
    right.plot([test_y.min(), test_y.max()], [test_y.min(), test_y.max()], ":", color="grey")
    right.set(xlabel="target", ylabel="prediction", title=f"held-out images (MSE {mse:.3f})")
    fig.suptitle("PyTorch CNN export trained online from Parquet")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "pytorch_parquet.png", dpi=100)
    print("plot:", out / "pytorch_parquet.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    parser.add_argument("--files", type=int, default=4, help="Parquet files of 4096 images (default %(default)s)")
    args = parser.parse_args()
    main(args.out, args.files)
