"""Scale-out on Ray (docs/tutorials/ray.md as one script): ``streamfit train --workers 2`` on Parquet files.

Writes Parquet files (one with a bad row), trains one model with two learner actors on a local Ray instance
(127.0.0.1, started and stopped by the run), weights mixed every 4 batches, a global checkpoint at the end;
then checks the mixed model against held-out rows and the dead letters of each learner, and plots the model's
predictions to ``<out>/ray_scaleout.png``. Needs the ``[ray]`` extra.

    python examples/ray_scaleout.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from streamfit import read_dead_letters  # noqa: E402
from streamfit.testing import mlp_model  # noqa: E402

ROWS, FILES = 2048, 4


def target(X: np.ndarray) -> np.ndarray:
    return (X[:, 0] * X[:, 1] + np.sin(X[:, 2])).astype(np.float32)


def main(out: Path) -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "data").mkdir()
        for part in range(FILES):
            X = rng.standard_normal((ROWS, 4)).astype(np.float32)
            x1 = pa.array(X[:, 1], mask=np.arange(ROWS) == 7 if part == 1 else None)  # one null: a dead letter
            pq.write_table(pa.table({"x0": X[:, 0], "x1": x1, "x2": X[:, 2], "x3": X[:, 3], "y": target(X)}),
                           work / "data" / f"part-{part}.parquet")
        onnx.save(mlp_model([4, 32, 1]), work / "model.onnx")
        command = [sys.executable, "-m", "streamfit.cli", "train", "--workers", "2", "--sync-every-batches", "4",
                   "--source", f"parquet:{work / 'data'}", "--model", str(work / "model.onnx"),
                   "--features", "x0,x1,x2,x3", "--label", "y", "--batch-size", "128", "--optimizer", "adam",
                   "--learning-rate", "constant", "--eta0", "3e-3", "--checkpoint-dir", str(work / "ck"),
                   "--on-bad", "skip", "--dead-letter", str(work / "dead.jsonl"), "-o", str(work / "mixed.onnx")]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        print(run.stdout.strip().splitlines()[0])
        letters = [letter for path in sorted(work.glob("dead.learner-*.jsonl")) for letter in read_dead_letters(path)]
        print(f"dead letters of the learners: {[(d.reason, d.column, d.position) for d in letters]}")
        assert [(d.reason, d.rows) for d in letters] == [("null", 1)], letters
        session = ort.InferenceSession(str(work / "mixed.onnx"))

    X = rng.standard_normal((2000, 4)).astype(np.float32)
    y = target(X)
    predicted = session.run(None, {session.get_inputs()[0].name: X})[0].ravel()
    mse = float(np.mean((predicted - y) ** 2))
    print(f"the mixed model of 2 learners on held-out rows: MSE {mse:.3f} (variance of the target {y.var():.3f})")
    assert mse < y.var()

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot(y, predicted, ".", alpha=0.3)
    ax.plot([y.min(), y.max()], [y.min(), y.max()], ":", color="grey")
    ax.set(xlabel="target", ylabel="prediction of the mixed model",
           title=f"--workers 2 on Ray: held-out MSE {mse:.3f}")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "ray_scaleout.png", dpi=100)
    print("plot:", out / "ray_scaleout.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    main(parser.parse_args().out)
