"""The embedded default stream of ``streamfit train --demo``: a few Parquet files generated on the spot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq

from streamfit._engine.testing import mlp_model

__all__ = ["make_demo"]

N_FEATURES = 8


def make_demo(root: Path, files: int = 4, rows_per_file: int = 10_000, seed: int = 0) -> tuple[Path, Path]:
    """Write ``root/data/part-*.parquet`` (8 float features, target y) and ``root/model-initial.onnx``."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coef = rng.standard_normal(N_FEATURES)
    for i in range(files):
        path = data / f"part-{i:03d}.parquet"
        if path.exists():
            continue
        X = rng.standard_normal((rows_per_file, N_FEATURES)).astype(np.float32)
        y = (X @ coef + np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(rows_per_file))
        table = pa.table({**{f"x{j}": X[:, j] for j in range(N_FEATURES)}, "y": y.astype(np.float32)})
        pq.write_table(table, path, row_group_size=4096)
    model = root / "model-initial.onnx"
    if not model.exists():
        onnx.save(mlp_model([N_FEATURES, 32, 32, 1], "Relu", seed=seed), model)
    return data, model
