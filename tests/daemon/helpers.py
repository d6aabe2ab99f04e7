"""Shared by the daemon tests: a Parquet stream and a model on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq

from streamfit._engine.testing import mlp_model

N_FEATURES = 6


def write_stream(root: Path, files: int = 3, rows: int = 1024, seed: int = 0) -> tuple[Path, int]:
    """``root/data/part-XXX.parquet``: files of ``rows`` rows (row ids in column ``rid``)."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(files):
        X = rng.standard_normal((rows, N_FEATURES)).astype(np.float32)
        y = (X.sum(axis=1) + np.sin(X[:, 0])).astype(np.float32)
        cols = {f"x{j}": X[:, j] for j in range(N_FEATURES)}
        cols["y"] = y
        pq.write_table(pa.table(cols), data / f"part-{i:03d}.parquet", row_group_size=300)
    return data, files * rows


def record_batches(files: int = 3, rows: int = 1024, seed: int = 0) -> list[pa.RecordBatch]:
    """The same rows as :func:`write_stream`, as record batches of 128 rows (Kafka messages)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(files):
        X = rng.standard_normal((rows, N_FEATURES)).astype(np.float32)
        y = (X.sum(axis=1) + np.sin(X[:, 0])).astype(np.float32)
        cols = {f"x{j}": X[:, j] for j in range(N_FEATURES)}
        cols["y"] = y
        table = pa.table(cols)
        out += table.to_batches(max_chunksize=128)
    return out


def write_model(root: Path) -> Path:
    path = root / "model.onnx"
    onnx.save(mlp_model([N_FEATURES, 16, 1], "Tanh", seed=1), path)
    return path
