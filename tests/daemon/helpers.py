"""Shared by the daemon tests: a Parquet stream and a model on disk, `streamfit` as a process and its health file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

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


STARTED: list[subprocess.Popen] = []  # every process run_cli started: killed at each test's end (tests/conftest.py)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the test process dies (Linux), so a killed pytest leaks no daemon."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def run_cli(*args: str, env: dict | None = None, **kw: Any) -> subprocess.Popen:
    """``python -m streamfit.cli ARGS`` as a process (stdout and stderr piped, text).

    The process dies with the test process, and a test that fails before stopping it leaves it to the autouse
    fixture that kills what is still running at the test's end.
    """
    full_env = {**os.environ, **(env or {})}
    kw.setdefault("preexec_fn", _die_with_parent)
    proc = subprocess.Popen([sys.executable, "-m", "streamfit.cli", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    STARTED.append(proc)
    return proc


def read_health(path: Path) -> dict:
    """The health file's fields ({} while it is not written yet)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def wait_for(predicate: Callable[[], Any], proc: subprocess.Popen, timeout: float = 60.0, what: str = "") -> None:
    """Poll ``predicate`` until true; fail (killing ``proc``) when the process exits first or at ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"serve exited with {proc.returncode} while waiting for {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; the process said:\n{err[-3000:]}")
        time.sleep(0.005)
