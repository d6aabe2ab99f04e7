"""Several inputs and categorical columns (docs/tutorials/inputs.md as one script).

A two-input ONNX model (``x``: three float features, ``ids``: an id an embedding reads) is fed from the columns
of Parquet files: ``x`` from ``price``, ``qty``, ``discount``, ``ids`` from the string column ``city`` hashed
by ``Hashed``. The exported model takes the raw columns (the hashing inside its graph); plain onnxruntime gives
the estimator's predictions. The learned effect of each city is plotted to ``<out>/several_inputs.png``.

    python examples/several_inputs.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import streamfit  # noqa: E402
from streamfit.features import Hashed  # noqa: E402
from streamfit.testing import two_input_model  # noqa: E402

CITIES = np.array(["oslo", "lima", "pune", "kyiv", "doha", "riga", "nice", "bern"])
EFFECT = dict(zip(CITIES, np.linspace(-2.0, 2.0, len(CITIES))))  # each city's true offset


def sales(rng: np.random.Generator, n: int) -> pa.Table:
    price, qty, discount = rng.standard_normal((3, n)).astype(np.float32)
    city = rng.choice(CITIES, n)
    y = price + 0.5 * qty - discount + np.vectorize(EFFECT.get)(city)
    return pa.table({"price": price, "qty": qty, "discount": discount, "city": city, "y": y.astype(np.float32)})


def main(out: Path, files: int) -> None:
    rng = np.random.default_rng(0)
    reg = streamfit.OnnxRegressor(two_input_model(3, 1024), optimizer="adam", learning_rate="constant", eta0=1e-2,
                                  inputs={"x": ["price", "qty", "discount"], "ids": Hashed("city", buckets=1024)})
    with tempfile.TemporaryDirectory() as data:
        for part in range(files):
            pq.write_table(sales(rng, 4096), f"{data}/part-{part}.parquet")
        summary = streamfit.train_stream_sync(reg, f"parquet:{data}", label="y", batch_size=256)
    print(f"trained {summary.rows} rows; progressive loss {summary.stream_metrics['loss']:.4f}")

    model = reg.to_onnx()
    session = ort.InferenceSession(model.SerializeToString())
    print("exported inputs:", ", ".join(f"{i.name} ({i.type})" for i in session.get_inputs()))
    test = sales(rng, 2000)
    feed = {name: test.column(name).to_numpy() for name in ("price", "qty", "discount")}
    feed["city"] = test.column("city").to_numpy(zero_copy_only=False).astype(np.str_)
    exported = session.run(None, feed)[0].ravel()
    np.testing.assert_allclose(exported, reg.predict(test), rtol=1e-4, atol=1e-5)
    print(f"plain onnxruntime on the raw columns equals reg.predict (max |diff| "
          f"{np.abs(exported - reg.predict(test)).max():.1e})")

    zeros = np.zeros(len(CITIES), np.float32)  # each city with price = qty = discount = 0: its learned offset
    base = pa.table({"price": zeros, "qty": zeros, "discount": zeros, "city": CITIES})
    learned = reg.predict(base)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(np.arange(len(CITIES)) - 0.2, [EFFECT[c] for c in CITIES], 0.4, label="true offset")
    ax.bar(np.arange(len(CITIES)) + 0.2, learned, 0.4, label="learned (hashed id -> embedding)")
    ax.set_xticks(range(len(CITIES)))
    ax.set_xticklabels(CITIES)
    ax.set(ylabel="prediction at price = qty = discount = 0", title="A hashed string column as a model input")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "several_inputs.png", dpi=100)
    print("plot:", out / "several_inputs.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    parser.add_argument("--files", type=int, default=3, help="Parquet files of 4096 rows (default %(default)s)")
    args = parser.parse_args()
    main(args.out, args.files)
